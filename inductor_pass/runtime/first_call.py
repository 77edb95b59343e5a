"""Run the pass at a graph's first call (Note [Profiling on real inputs])."""

from __future__ import annotations

import time
from typing import Any

import torch

from inductor_pass.config import PassConfig
from inductor_pass.observe import notify, span
from inductor_pass.program.unbacked import unbacked_symbols
from inductor_pass.report import GraphReport, failed, record
from inductor_pass.runtime import decision_cache
from inductor_pass.runtime.salt import pass_uuid
from inductor_pass.stages import guard
from inductor_pass.stages.observable import observable_call
from inductor_pass.stages.rewrite import optimize_wrapper, resolver
from inductor_pass.variants import bound, choose
from inductor_pass.variants.choose import Program, Variant
from inductor_pass.variants.kernels import force_kernels

__all__ = ["FirstCallPass"]


class FirstCallPass:
    """Run the pass at the first call, on copies of that call's real inputs.

    Note [Profiling on real inputs]
    The pass runs the graph's kernels to profile effects and memory. Inputs
    fabricated from the example inputs' metadata are not valid data for every
    program: indices computed from a float input fall out of range, and then
    Inductor's index assert throws inside an OpenMP region (the process
    aborts) or, with ``assert_indirect_indexing=False``, the kernel writes out
    of bounds. So every graph is profiled at its first call, on copies of that
    call's real inputs, which the kernels are about to process anyway; the
    first call also shows which inputs the call owns (Note [Input ownership]
    in ``inductor_pass/stages/guard.py``). The first call itself runs the original
    program after the pass's own runs on copies; later calls run the permuted
    program when it was deployed. The report is recorded at the first call.
    Any exception inside the pass leaves the original program. A program whose
    extra runs would be observable (collectives, operators with side effects)
    never runs inside the pass: Note [Observable calls] in
    ``inductor_pass/stages/observable.py``.
    """

    def __init__(self, program: Program, kind: str, config: PassConfig, *, size: str = "") -> None:
        self.impl = program.call
        self._next = None
        self._pending = (program.source, program.globals, program.partitions, kind, config)
        self.size = size
        """The sizes of a symbolic graph's call (Note [Per-size orders]); "" when static."""
        self.variants: list[Variant] = []
        """Alternative programs (Note [Program variants] in ``inductor_pass/variants/choose.py``)."""
        self.variants_skipped = False
        """Variants deliberately not compiled (set by the backend): none to load either."""
        self.variant_notes: list[str] = []

    def __call__(self, args: list[Any]) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None:
            try:  # first, before anything else references the inputs
                owned: list[bool] | None = guard.input_ownership(args)
            except Exception:
                owned = None
            call = self.impl
            t0 = time.perf_counter()
            with span("first-call pass"):
                rep = self._run_pass(args, owned, *pending)
            notify("first_call", pending[0], args, owned, call, rep, time.perf_counter() - t0)
            self.impl = self._next if self._next is not None else call
            return call(args)
        return self.impl(args)

    def _run_pass(self, args, owned, source, glob, partitions, kind, config) -> GraphReport:
        key = None
        try:
            if decision_cache.enabled(config):
                key = decision_cache.decision_key(
                    source,
                    pass_uuid(config),
                    decision_cache.call_signature(args, owned),
                )
                rep = self._from_cache(key, source, glob, partitions, kind)
                if rep is not None:
                    rep.size = self.size
                    record(rep, print_it=config.report, dump_dir=config.dump_dir)
                    return rep
            rep, entry = self._optimize(args, owned, source, glob, partitions, kind, config)
            if key is not None:
                decision_cache.store(key, entry, rep.as_dict())
        except Exception as exc:
            self._next = None
            rep = failed(kind, source, exc)
        rep.size = self.size
        record(rep, print_it=config.report, dump_dir=config.dump_dir)
        return rep

    def _optimize(self, args, owned, source, glob, partitions, kind, config):
        """Run the pass on the default program and every variant; pick one.

        Returns:
            ``(report, cache entry)``; sets ``self._next`` when a program other
            than the original default one is to run from now on.
        """

        def candidate(name, src, glb, call, parts, keep=None) -> choose.Candidate:
            rep, new_call, _ = optimize_wrapper(
                src,
                glb,
                list(args),
                original_call=call,
                partitions=parts,
                config=config,
                kind=kind,
                owned=owned,
                keep=keep,
            )
            return choose.Candidate(
                name=name,
                report=rep,
                original=call,
                chosen=new_call if new_call is not None else call,
                source=src,
                order=rep.permuted_order if new_call is not None else None,
            )

        t0 = time.perf_counter()
        observable = observable_call(source, resolver(glob or {}))
        if observable is not None:  # Note [Observable calls]: no program or variant runs
            rep = GraphReport(
                kind=kind, original_source=source, reason="left unchanged: " + observable
            )
            devices = {x.device.type for x in args if isinstance(x, torch.Tensor)}
            rep.device = ",".join(sorted(devices)) or rep.device
            rep.num_inputs = sum(isinstance(x, torch.Tensor) for x in args)
            rep.pass_seconds = time.perf_counter() - t0
            return rep, {"variant": "default", "order": None}
        if (
            not self.variants and config.variants and not self.size and not self.variants_skipped
        ):  # Note [Per-size orders]
            self._load_variants(source, config)
        kept: dict[str, Any] = {}
        cands = [candidate("default", source, glob, self.impl, partitions, kept)]
        rep = cands[0].report
        same: list[str] = []
        ruled_out: dict[str, dict[str, object]] = {}
        variants = self.variants
        profiled = kept.get("profiled")
        if variants and profiled is not None and unbacked_symbols(profiled.wrapper):
            # Note [Data-dependent sizes] in inductor_pass/program/unbacked.py
            variants = []
            self.variant_notes.append(
                "variants not run: data-dependent sizes (a program is chosen by its peak "
                "at one size)"
            )
        for variant in variants:
            name, p = variant.name, variant.program
            src, glb, call, parts = p.source, p.globals, p.call, p.partitions
            if src == source:  # the flipped option changed nothing: one program, one pass
                same.append(name)
                continue
            try:
                out = self._rule_out(name, src, glb, cands[0], kept.get("profiled"), config)
                if out is not None:
                    ruled_out[name] = out
                    continue
                force_kernels(glb)  # Note [Lazy variant kernels]
                cands.append(candidate(name, src, glb, call, parts))
            except Exception as exc:  # a variant is an option; never fatal
                self.variant_notes.append(f"variant {name} failed: {type(exc).__name__}: {exc}")
        if len(cands) == 1:
            best, why = cands[0], ""
        elif not config.deploy:
            best, why = cands[0], "variants measured only (PassConfig.deploy=False)"
        elif any(c.report.device != "cpu" for c in cands):
            best, why = cands[0], "variants are chosen on CPU only (byte-exact guard)"
        else:
            try:
                with span("variant choice"):
                    best, why = choose.choose(cands, args, owned)
            except Exception as exc:  # a variant is an option; never fatal
                best, why = cands[0], f"variant choice failed ({type(exc).__name__}: {exc})"
        rep.variants = {c.name: choose.summary(c.report) for c in cands}
        rep.variants.update(ruled_out)
        for name in same:
            rep.variants[name] = dict(rep.variants["default"])
            self.variant_notes.append(f"variant {name} is the default program (same source)")
        at = f" at {self.size}" if self.size else ""
        rep.notes.append(f"profiled on a copy of the first call's real inputs{at}")
        if owned is None:
            rep.notes.append("input ownership unknown: every input taken as held")
        rep.notes.extend(self.variant_notes)
        if why:
            rep.notes.append(why)
        rep.pass_seconds = time.perf_counter() - t0  # every program's pass, and the choice
        entry: dict[str, Any] = {"variant": best.name, "order": best.order}
        if best.order is not None:  # a warm process builds it without parsing the wrapper
            entry["permuted"] = best.report.permuted_source
        if best is not cands[0]:
            rep.variant = best.name
            rep.deployed = True
            rep.reason = f"{why}; the pass on that program: {best.report.reason}"
            rep.lower_bound = best.report.lower_bound
            rep.bounds = dict(best.report.bounds)
            rep.certified = best.report.certified
            rep.measured_permuted_peak = best.peak
            rep.modelled_permuted_peak = best.report.modelled_permuted_peak
            rep.permuted_source = best.report.permuted_source or best.source
            rep.bitwise_identical = True
            self._next = best.chosen
            entry["source"] = best.source
        elif best.chosen is not best.original:
            self._next = best.chosen
        return rep, entry

    def _rule_out(self, name, src, glb, default, profiled, config) -> dict[str, object] | None:
        """The report entry of a variant Note [Variant bound] rules out, else None."""
        peak = default.peak
        model = getattr(profiled, "model", None)
        if not config.variant_bound or peak is None or model is None:
            return None
        if default.report.device != "cpu" or config.recompute:
            return None  # variants are chosen on CPU; recomputation is no permutation
        lower, why = bound.variant_bound(
            src, model, resolver(glb or {}), time_limit_s=config.time_limit_s
        )
        if lower is None or lower < peak:
            if lower is None:
                self.variant_notes.append(f"variant {name}: no static bound, run ({why})")
            return None
        reason = (
            f"not built or run: {why} is {lower} B, not below the default's deployed peak {peak} B"
        )
        self.variant_notes.append(f"variant {name} {reason}")
        return choose.summary(GraphReport(lower_bound=lower, reason=reason))

    def _load_variants(self, source: str, config: PassConfig) -> None:
        """Variant programs of a graph loaded from AOTAutograd's cache (Note [Decision cache])."""
        if not decision_cache.enabled(config):
            return
        key = decision_cache.variants_key(source, pass_uuid(config))
        stored = decision_cache.load_variants(key)
        for name, _ in choose.flipped_options(config.variants):
            src = stored.get(name)
            if src == source:  # the default program itself: nothing to load
                program = Program(source=src, globals=None, call=None)
                self.variants.append(Variant(name=name, program=program))
                continue
            loaded = decision_cache.load_program(src) if src is not None else None
            if loaded is None:
                self.variant_notes.append(f"variant {name} unavailable (not in the pass's cache)")
                continue
            self.variants.append(Variant(name=name, program=loaded))

    def _from_cache(self, key, source, glob, partitions, kind) -> GraphReport | None:
        """Deploy a cached decision; None when there is none (or it does not apply)."""
        entry = decision_cache.load(key)
        if entry is None:
            return None
        decision = entry.get("decision") or {}
        order = decision.get("order")
        variant_source = decision.get("source")
        base_glob, base_parts = glob, partitions
        if variant_source is not None:
            loaded = decision_cache.load_program(variant_source)
            if loaded is None:
                return None
            force_kernels(loaded.globals)  # in parallel, before the program runs
            base_glob = loaded.globals
            base_call, base_parts = loaded.call, loaded.partitions
        rep = GraphReport.from_dict(entry.get("report") or {})
        rep.kind = kind
        rep.original_source = source
        if order is not None:
            new_src = decision.get("permuted")
            if not isinstance(new_src, str):
                return None
            self._next, _ = guard.build_call(
                new_src,
                base_glob,
                partitions=base_parts,
                filename=f"<torch_replay permuted {kind} wrapper>",
            )
            rep.permuted_source = new_src
            rep.permuted_order = list(order)
        elif variant_source is not None:
            self._next = base_call
            rep.permuted_source = variant_source
        rep.pass_seconds = 0.0
        rep.notes = [*rep.notes, f"decision from the pass's cache ({key[:16]})"]
        return rep
