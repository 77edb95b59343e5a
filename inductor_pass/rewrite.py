"""The pass on one wrapper: profile, model, search, guard, and the deploy rule (design.md §3.1).

Deploy rule (CPU, Theorem 1): the permuted program replaces the original only
when (1) the profiled run shows effect completeness (no undeclared write) and
the ownership records hold (every statement's live-byte delta equals the
modelled one), (2) the modelled peak equals the measured peak, to the byte, for
both the original and the permuted program (see Note [Allocator guard]),
(3) outputs and final input bytes are bitwise identical, and (4) the permuted
peak is strictly lower. Peaks are those of the programs called as the runtime
calls them (Note [Input ownership] in ``inductor_pass/guard.py``): inputs the
call owns are freed at their last use. When the call owns inputs, (5) the
permuted program's measured peak must also not exceed the original's when
every input is held (a later call whose caller keeps them, as with
``retain_graph=True``). On CUDA only (3) and a strictly lower *measured* peak
are required (the caching allocator is not byte-exact).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from inductor_pass import guard
from inductor_pass.config import PassConfig
from inductor_pass.permute import search_order
from inductor_pass.report import GraphReport
from inductor_pass.units import ProgramModel, build_dependences, simulate
from inductor_pass.wrapper_ast import parse_wrapper, render_region

__all__ = ["optimize_wrapper", "InjectedFailure"]


class InjectedFailure(RuntimeError):
    """Raised inside the pass by ``PassConfig.inject_failure`` (tests of the fallback)."""


def _resolver(base_globals: dict[str, Any]) -> Callable[[str], object]:
    def resolve(dotted: str) -> object:
        parts = dotted.split(".")
        if parts[0] in base_globals:
            obj = base_globals[parts[0]]
        else:
            obj = getattr(builtins, parts[0])
        for p in parts[1:]:
            obj = getattr(obj, p)
        return obj

    return resolve


def optimize_wrapper(
    source: str,
    base_globals: dict[str, Any],
    real_inputs: Sequence[Any],
    *,
    original_call: Callable[[list[Any]], Any] | None = None,
    partitions: Any = None,
    config: PassConfig,
    kind: str = "inference",
    owned: Sequence[bool] | None = None,
) -> tuple[GraphReport, Callable[[list[Any]], Any] | None, Any]:
    """Run the pass on one wrapper and decide whether to deploy the permuted program.

    Args:
        source: The wrapper module's source.
        base_globals: The loaded module's globals (kernels, constants).
        real_inputs: The inputs of a real call (copied, never modified). The
            kernels only ever run on copies of real inputs (Note [Profiling
            on real inputs] in ``inductor_pass/first_call.py``).
        original_call: The loaded ``call`` (built from ``source`` when None).
        partitions: ``runner.partitions`` of the loaded module, if any.
        config: Pass options.
        kind: ``"forward"``, ``"backward"`` or ``"inference"`` (for the report).
        owned: Per input, whether the call owns it (from
            :func:`inductor_pass.guard.input_ownership` at the first real
            call); None: the caller holds every input.

    Returns:
        ``(report, call, runner)``: ``call`` is the permuted program's callable
        when it is to be deployed, else None; ``runner`` its ``Runner`` (or None).

    Raises:
        Exception: Anything inside the pass; the caller falls back to the
            original program.
    """
    t0 = time.perf_counter()
    rep = GraphReport(kind=kind, original_source=source)

    def stage(name: str) -> None:
        if config.inject_failure == name:
            raise InjectedFailure(f"injected failure at stage {name!r}")

    def done(reason: str) -> tuple[GraphReport, None, None]:
        rep.reason = reason
        rep.pass_seconds = time.perf_counter() - t0
        return rep, None, None

    stage("parse")
    wrapper = parse_wrapper(source)
    rep.num_statements = len(wrapper.region)
    resolve = _resolver(base_globals)
    if original_call is None:
        original_call, _ = guard.build_call(source, base_globals, partitions=partitions)
    try:
        inputs = guard.copy_real_inputs(real_inputs)
    except guard.DynamicShapes as exc:
        return done(f"left unchanged: dynamic shapes ({exc}); a peak is certified per size")
    owned = [bool(o) for o in owned] if owned is not None else [False] * len(inputs)
    if len(owned) != len(inputs):
        raise ValueError(f"owned has {len(owned)} flags for {len(inputs)} inputs")
    rep.owned_inputs = sum(owned)
    rep.num_inputs = sum(isinstance(x, torch.Tensor) for x in inputs)
    devices = {x.device.type for x in inputs if isinstance(x, torch.Tensor)}
    on_cuda = "cuda" in devices
    rep.device = "cuda" if on_cuda else ("cpu" if devices <= {"cpu"} else ",".join(sorted(devices)))
    if not devices <= {"cpu", "cuda"}:
        return done(f"left unchanged: device {rep.device} has no guard")

    stage("profile")
    # The effect profile runs first and is also the warm-up: lazy initialisation
    # (oneDNN primitives, kernel loading) happens here, not in the measured runs.
    prof = guard.profile_effects(
        wrapper,
        base_globals,
        inputs,
        partitions=partitions,
        check_bytes=config.check_effects,
        resolve=resolve,
    )
    if prof.problems:
        return done("left unchanged: " + "; ".join(prof.problems[:3]))
    profiled_peak: int | None = None
    if on_cuda:  # pragma: no cover - needs a GPU
        transient = [0] * len(wrapper.region)
        live_after = None
    else:
        transient, live_after, profiled_peak = guard.profile_memory(
            wrapper, base_globals, inputs, partitions=partitions, owned=owned
        )
    owned_storages: set[int] = set()
    for name, flag in zip(wrapper.input_names, owned, strict=False):
        if flag:
            owned_storages |= prof.name_storages.get(name, frozenset())
    model = ProgramModel(
        wrapper=wrapper,
        name_storages=prof.name_storages,
        sizes=prof.sizes,
        external=frozenset(prof.external),
        owned=frozenset(owned_storages) & frozenset(prof.external),
        transient=transient,
    )
    identity = list(range(len(wrapper.region)))
    modelled_orig, trace_orig = simulate(model, identity)
    rep.modelled_original_peak = modelled_orig
    rep.live_original = trace_orig
    if live_after is not None and trace_orig != live_after:
        k = next(i for i, (a, b) in enumerate(zip(trace_orig, live_after, strict=True)) if a != b)
        st = wrapper.region[k]
        return done(
            f"left unchanged: ownership record violated at statement {k} "
            f"({st.text.splitlines()[0][:60]!r}): live bytes modelled {trace_orig[k]}, "
            f"measured {live_after[k]}"
        )

    stage("search")
    units, edges, attached, tail = build_dependences(model, resolve, all_writes=config.all_writes)
    rep.num_units = len(units)
    res = search_order(
        model,
        units,
        edges,
        attached,
        tail,
        use_core=config.use_core,
        time_limit_s=config.time_limit_s,
    )
    rep.modelled_permuted_peak = res.peak
    rep.search_seconds = res.core_seconds
    if config.ablation:
        aw = build_dependences(model, resolve, all_writes=True)
        rep.ablation_permuted_peak = search_order(
            model, *aw, use_core=config.use_core, time_limit_s=config.time_limit_s
        ).peak
        build_dependences(model, resolve, all_writes=config.all_writes)  # restore effects
    rep.lower_bound = res.lower_bound
    rep.bounds = res.bounds
    rep.certified = res.certified
    rep.candidate = res.candidate
    rep.candidates = res.candidates
    if res.note:
        rep.notes.append(res.note)
    out_wrapper, out_order, out_peak, out_model = wrapper, res.stmt_order, res.peak, model
    if config.recompute:  # Note [Recomputation in the wrapper] in inductor_pass/recompute.py
        from inductor_pass import recompute

        out_wrapper, out_order, out_peak, out_model = recompute.in_pass(
            model,
            res.stmt_order,
            res.peak,
            rep,
            base_globals=base_globals,
            inputs=inputs,
            partitions=partitions,
            resolve=resolve,
            config=config,
            on_cuda=on_cuda,
        )
        rep.modelled_permuted_peak = out_peak
    rep.live_permuted = simulate(out_model, out_order)[1]
    if out_wrapper is wrapper and res.stmt_order == identity and not on_cuda:
        # Nothing to deploy: the profiled run already measured the original
        # program (its live bytes matched the model statement by statement).
        rep.measured_original_peak = rep.measured_permuted_peak = profiled_peak
        rep.byte_exact = profiled_peak == modelled_orig
        why = "no order with a strictly lower peak"
        if res.certified:
            why += " (the original peak is certified optimal)"
        return done("left unchanged: " + why)
    new_src = render_region(out_wrapper, out_order)
    rep.permuted_source = new_src
    rep.permuted_order = list(res.stmt_order) if out_wrapper is wrapper else None

    stage("guard")
    new_call, new_runner = guard.build_call(
        new_src,
        base_globals,
        partitions=partitions,
        filename=f"<torch_replay permuted {kind} wrapper>",
    )
    measure = guard.measure_cuda if on_cuda else guard.measure_cpu
    peak_o, out_o, in_o = measure(original_call, inputs, owned=owned)
    peak_p, out_p, in_p = measure(new_call, inputs, owned=owned)
    rep.measured_original_peak = peak_o
    rep.measured_permuted_peak = peak_p
    rep.bitwise_identical = guard.bitwise_equal([*out_o, *in_o], [*out_p, *in_p])
    del out_o, in_o, out_p, in_p
    held_ok = True
    if any(owned):
        # The same programs when the caller keeps every input (Note [Input ownership]).
        held_o, out_o, in_o = measure(original_call, inputs)
        held_p, out_p, in_p = measure(new_call, inputs)
        rep.measured_all_held_peaks = (held_o, held_p)
        rep.bitwise_identical = rep.bitwise_identical and guard.bitwise_equal(
            [*out_o, *in_o], [*out_p, *in_p]
        )
        del out_o, in_o, out_p, in_p
        held_ok = held_p <= held_o
    if on_cuda:  # pragma: no cover - needs a GPU
        rep.byte_exact = None
        try:  # diagnostics only: a timing failure never blocks the guard's decision
            t_o, t_p = guard.time_cuda(original_call, inputs), guard.time_cuda(new_call, inputs)
            rep.kernel_seconds = {
                "original": t_o.seconds,
                "permuted": t_p.seconds,
                "source": t_o.source,
                "kernels": t_o.kernels,
            }
            if t_o.note:
                rep.notes.append(f"kernel timing: {t_o.note}")
        except Exception as exc:
            rep.notes.append(f"kernel timing failed: {type(exc).__name__}: {exc}")
        ok = rep.bitwise_identical and peak_p < peak_o and held_ok
        why = (
            "CUDA guard: measured peak lower and outputs bitwise identical"
            if ok
            else "CUDA guard: "
            + (
                "outputs differ"
                if not rep.bitwise_identical
                else "measured peak not lower"
                if peak_p >= peak_o
                else "measured peak higher when the caller holds every input"
            )
        )
    else:
        rep.byte_exact = peak_o == modelled_orig and peak_p == out_peak
        if not rep.byte_exact:
            ok, why = (
                False,
                f"modelled != measured (original {modelled_orig} vs {peak_o}, "
                f"permuted {out_peak} vs {peak_p})",
            )
        elif not rep.bitwise_identical:
            ok, why = False, "outputs of the permuted program are not bitwise identical"
        elif out_peak >= modelled_orig:
            ok, why = False, "no order with a strictly lower peak"
            if res.certified:
                why += " (the original peak is certified optimal)"
        elif not held_ok:
            ok, why = (
                False,
                "the permuted program is lower as the runtime calls it but higher when "
                f"the caller holds every input ({rep.measured_all_held_peaks})",
            )
        else:
            ok, why = True, f"peak lowered by {modelled_orig - out_peak} bytes (byte-exact)"
    if ok and not config.deploy:
        ok, why = False, why + "; not deployed (PassConfig.deploy=False)"
    rep.deployed = bool(ok)
    if not ok:
        why = "left unchanged: " + why
    rep.reason = why
    rep.pass_seconds = time.perf_counter() - t0
    if ok:
        return rep, new_call, new_runner
    return rep, None, None
