"""The pass on one wrapper: parse, then the profile, search and decide stages.

:func:`optimize_wrapper` runs the three stages, each a module returning a
dataclass: ``inductor_pass/stages/profile.py`` (:class:`~inductor_pass.stages.profile.Profiled`:
the byte-exact model of the original program, or why it is left unchanged),
``inductor_pass/stages/search.py`` (:class:`~inductor_pass.stages.search.Searched`: the best
order, its bounds and certificate, recomputation) and ``inductor_pass/stages/decide.py``
(:class:`~inductor_pass.stages.decide.Decision`: both programs measured, the deploy
rule), and fills the graph's :class:`~inductor_pass.report.GraphReport`.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from inductor_pass.config import FailurePoint, PassConfig
from inductor_pass.observe import notify, span
from inductor_pass.program.wrapper_ast import parse_wrapper, render_region
from inductor_pass.report import GraphReport
from inductor_pass.stages import guard
from inductor_pass.stages.decide import decide
from inductor_pass.stages.observable import observable_call
from inductor_pass.stages.profile import profile_program
from inductor_pass.stages.search import search_program

__all__ = ["InjectedFailure", "optimize_wrapper", "resolver"]


class InjectedFailure(RuntimeError):
    """Raised inside the pass by ``PassConfig.inject_failure`` (tests of the fallback)."""


def resolver(base_globals: dict[str, Any]) -> Callable[[str], object]:
    """A function from a dotted name in a wrapper module to the object it names.

    Args:
        base_globals: The module's globals (names not there are builtins).
    """

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
    keep: dict[str, Any] | None = None,
) -> tuple[GraphReport, Callable[[list[Any]], Any] | None, Any]:
    """Run the pass on one wrapper and decide whether to deploy the permuted program.

    Args:
        source: The wrapper module's source.
        base_globals: The loaded module's globals (kernels, constants).
        real_inputs: The inputs of a real call (copied, never modified). The
            kernels only ever run on copies of real inputs (Note [Profiling
            on real inputs] in ``inductor_pass/runtime/first_call.py``).
        original_call: The loaded ``call`` (built from ``source`` when None).
        partitions: ``runner.partitions`` of the loaded module, if any.
        config: Pass options.
        kind: ``"forward"``, ``"backward"`` or ``"inference"`` (for the report).
        owned: Per input, whether the call owns it (from
            :func:`inductor_pass.stages.guard.input_ownership` at the first real
            call); None: the caller holds every input.
        keep: When given, ``keep["profiled"]`` receives the profile stage's
            :class:`~inductor_pass.stages.profile.Profiled` (Note [Variant bound]).

    Returns:
        ``(report, call, runner)``: ``call`` is the permuted program's callable
        when it is to be deployed, else None; ``runner`` its ``Runner`` (or None).

    Raises:
        Exception: Anything inside the pass; the caller falls back to the
            original program.
    """
    t0 = time.perf_counter()
    rep = GraphReport(kind=kind, original_source=source)

    def stage(name: FailurePoint) -> None:
        if config.inject_failure == name:
            raise InjectedFailure(f"injected failure at stage {name!r}")

    def done(reason: str) -> tuple[GraphReport, None, None]:
        rep.reason = reason
        rep.pass_seconds = time.perf_counter() - t0
        return rep, None, None

    stage("parse")
    wrapper = parse_wrapper(source)
    rep.num_statements = len(wrapper.region)
    resolve = resolver(base_globals)
    observable = observable_call(source, resolve)
    if observable is not None:  # Note [Observable calls]: nothing runs
        return done("left unchanged: " + observable)
    if original_call is None:
        original_call, _ = guard.build_call(source, base_globals, partitions=partitions)

    stage("profile")
    try:
        with span("profile stage"):
            prof = profile_program(
                wrapper,
                base_globals,
                real_inputs,
                owned=owned,
                partitions=partitions,
                check_effects=config.check_effects,
                resolve=resolve,
            )
    except guard.DynamicShapes as exc:
        return done(f"left unchanged: dynamic shapes ({exc}); a peak is certified per size")
    notify("profiled", source, prof)  # Note [Compile observers]
    if keep is not None:
        keep["profiled"] = prof
    rep.owned_inputs = sum(prof.owned)
    rep.num_inputs = sum(isinstance(x, torch.Tensor) for x in prof.inputs)
    rep.device = prof.device
    rep.modelled_original_peak = prof.modelled_peak
    rep.live_original = prof.live
    if prof.varying is not None:  # Note [Data-dependent sizes] in inductor_pass/program/unbacked.py
        rep.notes.append(
            f"data-dependent sizes ({', '.join(prof.varying.symbols)}): peaks are those of "
            "the profiled call; an order is admitted only when no higher at every size"
        )
    if prof.refusal is not None:
        return done("left unchanged: " + prof.refusal)

    stage("search")
    with span("search stage"):
        found = search_program(
            prof,
            base_globals=base_globals,
            partitions=partitions,
            resolve=resolve,
            config=config,
            rep=rep,
        )
    res = found.result
    rep.num_units = found.num_units
    rep.search_seconds = res.core_seconds
    rep.ablation_permuted_peak = found.ablation_peak
    rep.lower_bound = res.lower_bound
    rep.bounds = res.bounds
    rep.certified = res.certified
    rep.candidate = res.candidate
    rep.candidates = res.candidates
    if res.note:
        rep.notes.append(res.note)
    rep.modelled_permuted_peak = found.peak
    rep.live_permuted = found.live
    if found.unchanged and not prof.on_cuda:
        # Nothing to deploy: the profiled run already measured the original
        # program (its live bytes matched the model statement by statement).
        rep.measured_original_peak = rep.measured_permuted_peak = prof.profiled_peak
        rep.byte_exact = prof.profiled_peak == prof.modelled_peak
        why = "no order with a strictly lower peak"
        if res.certified:
            why += " (the original peak is certified optimal)"
        return done("left unchanged: " + why)
    new_src = render_region(found.wrapper, found.order)
    rep.permuted_source = new_src
    rep.permuted_order = None if found.recomputed else list(res.stmt_order)

    stage("guard")
    with span("decide stage"):
        d = decide(
            prof,
            found,
            new_src,
            original_call=original_call,
            base_globals=base_globals,
            partitions=partitions,
            config=config,
            kind=kind,
        )
    rep.measured_original_peak = d.measured_original_peak
    rep.measured_permuted_peak = d.measured_permuted_peak
    rep.measured_all_held_peaks = d.measured_all_held_peaks
    rep.bitwise_identical = d.bitwise_identical
    rep.byte_exact = d.byte_exact
    if d.kernel_seconds is not None:
        rep.kernel_seconds = d.kernel_seconds
    rep.notes.extend(d.notes)
    rep.deployed = d.deployed
    rep.reason = d.reason
    rep.pass_seconds = time.perf_counter() - t0
    return rep, d.call, d.runner
