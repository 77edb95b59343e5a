"""Alternative programs of one graph, and the choice among them.

Note [Program variants]
A certificate says that no permutation of *this* program's kernel calls has a
lower peak. Inductor can emit different programs for one graph: with
``reorder_for_peak_memory`` on (its default) and off, the kernels are the same
but their order and Inductor's buffer reuse differ (on every torch: Note
[Peak-memory planning off, on every torch]), and on MLP-Mixer- and
ViT-style inference graphs the program with the option off peaks 10% lower
than the default one that the pass certifies optimal. So the backend compiles
each graph once more per option in ``PassConfig.variants`` (a boolean Inductor
option, flipped), before the default program (so that the default's
``post_compile`` is the last one to touch AOTAutograd's tracing context). At
the first call the pass optimizes and certifies every program on the same
copies of the real inputs and under the same input ownership; :func:`choose`
then takes the program with the lowest measured peak. A program other than
the default one is deployed only when it is byte-exact (modelled == measured),
its outputs, strides, output aliasing and final input bytes are identical
to the default original program's, and its measured peak is strictly lower than the
default's chosen program (and, when the call owns inputs, not higher when the
caller holds them all). So the deployed program is never above the best
variant's, and never above the default. Every variant's peaks and bounds are
in the report (``GraphReport.variants``). A variant whose source is the default
program's is not run through the pass again (the default's figures are copied).
A variant's C++ kernels are built only when it is run (Note [Lazy variant
kernels] in ``inductor_pass/variants/kernels.py``), and it is not run when its lower
bound, from its source and the default's profile, is not below the default's
deployed peak (Note [Variant bound] in ``inductor_pass/variants/bound.py``):
then its report entry has that bound and no peaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inductor_pass.report import GraphReport
from inductor_pass.stages import guard

__all__ = ["Candidate", "Program", "Variant", "choose", "flipped_options", "program_of", "summary"]


@dataclass(kw_only=True, slots=True)
class Program:
    """A loaded wrapper program: its source and the module it runs in."""

    source: str
    globals: dict[str, Any] | None
    """The loaded module's globals (None: not loaded, see :class:`Variant`)."""
    call: Callable[[list[Any]], Any] | None
    partitions: Any = None
    """The module runner's graph partitions (cudagraph trees), when it has any."""


@dataclass(kw_only=True, slots=True)
class Variant:
    """One alternative program of a graph (Note [Program variants]).

    ``program.globals`` and ``call`` are None when the variant's source is the
    default program's (nothing was loaded for it).
    """

    name: str
    """The flipped option, as ``"reorder_for_peak_memory=False"``."""
    program: Program


@dataclass(kw_only=True, slots=True)
class Candidate:
    """One program of a graph after the pass: its report and what it would run."""

    name: str
    report: GraphReport
    original: Callable[[list[Any]], Any]
    """The program as Inductor emitted it."""
    chosen: Callable[[list[Any]], Any]
    """The permuted program when the pass deployed it, else ``original``."""
    source: str
    order: list[int] | None
    """Region order of ``chosen`` when it is a permutation, else None."""

    @property
    def peak(self) -> int | None:
        r = self.report
        return r.measured_permuted_peak if r.deployed else r.measured_original_peak


def program_of(compiled_graph: Any) -> Program:
    """The program of a finished ``CompiledFxGraph``: its source and its loaded module.

    Raises:
        RuntimeError: The callable has no module globals to run a program in.
    """
    call = compiled_graph.current_callable
    runner = getattr(compiled_graph, "compiled_fn_runner", None)
    fn = getattr(call, "__func__", call)
    glob = getattr(fn, "__globals__", None)
    if glob is None:
        raise RuntimeError(f"cannot find the wrapper module of {call!r}")
    partitions = getattr(runner, "partitions", None) if runner is not None else None
    return Program(
        source=compiled_graph.source_code, globals=glob, call=call, partitions=partitions
    )


# Note [Peak-memory planning off, on every torch]
# Inductor's wrapper reuses a freed buffer for a later one only when its own
# peak estimate allows it, and that estimate reads the buffers' memory-planning
# information, which ``reorder_for_peak_memory`` computes. With the option off,
# torch 2.13 leaves that information empty (the estimate is 0), so only buffers
# of adjacent kernels are reused: that is the program that peaks lower on the
# Mixer- and ViT-style graphs of Note [Program variants]. torch 2.14 added
# ``aten_distributed_optimizations.enable_simple_overlap`` (on by default),
# whose pass computes the same information when the option is off; the wrapper
# then reuses buffers exactly as in the default program, so the variant was the
# default program itself (the Mixer's inference: 5251072 B with either value,
# against 4718592 B with both off). So flipping ``reorder_for_peak_memory`` off
# also turns that pass off where the installed torch has it on. The variant
# then has the same program as on torch 2.13; on a graph with collectives it
# also lacks that pass's moves (it is deployed only by a strictly lower peak).
_OFF_WITH: dict[str, dict[str, bool]] = {
    "reorder_for_peak_memory": {"aten_distributed_optimizations.enable_simple_overlap": False},
}


def _config_value(dotted: str) -> Any:
    """The installed Inductor's value of a (dotted) config option; None if it has none."""
    from torch._inductor import config as inductor_config

    value: Any = inductor_config
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def flipped_options(names: Sequence[str]) -> list[tuple[str, dict[str, bool]]]:
    """``(variant name, Inductor config patch)`` for each boolean option to flip.

    Turning ``reorder_for_peak_memory`` off also turns off the options of the
    installed torch that would plan memory in its place (Note [Peak-memory
    planning off, on every torch]); the variant keeps the flipped option's name.
    """
    out = []
    for name in names:
        value = _config_value(name)
        if isinstance(value, bool):
            patch = {name: not value}
            if value:
                for other, off in _OFF_WITH.get(name, {}).items():
                    if isinstance(_config_value(other), bool) and _config_value(other) != off:
                        patch[other] = off
            out.append((f"{name}={not value}", patch))
    return out


def summary(rep: GraphReport) -> dict[str, object]:
    """The figures of one variant kept in the chosen graph's report."""
    return {
        "modelled_original_peak": rep.modelled_original_peak,
        "modelled_permuted_peak": rep.modelled_permuted_peak,
        "measured_original_peak": rep.measured_original_peak,
        "measured_permuted_peak": rep.measured_permuted_peak,
        "lower_bound": rep.lower_bound,
        "certified": rep.certified,
        "byte_exact": rep.byte_exact,
        "deployed": rep.deployed,
        "reason": rep.reason,
    }


def choose(
    candidates: list[Candidate], inputs: Sequence[Any], owned: Sequence[bool] | None
) -> tuple[Candidate, str]:
    """The candidate to deploy (``candidates[0]`` is the default program).

    Returns:
        ``(candidate, why)``; the default unless a variant passes every check
        of Note [Program variants].
    """
    default = candidates[0]
    eligible = [
        c
        for c in candidates[1:]
        if c.peak is not None
        and default.peak is not None
        and c.report.byte_exact is True
        and c.peak < default.peak
        and "failed" not in c.report.reason
    ]
    if not eligible:
        return default, "no variant program is lower"
    best = min(eligible, key=lambda c: c.peak)  # type: ignore[arg-type,return-value]
    copies = guard.input_views(inputs)  # every measurement copies them
    _, out_ref, in_ref = guard.measure_cpu(default.original, copies, owned=owned)
    p_def, _, _ = guard.measure_cpu(default.chosen, copies, owned=owned)
    p_best, out_best, in_best = guard.measure_cpu(best.chosen, copies, owned=owned)
    same = guard.bitwise_equal([*out_ref, *in_ref], [*out_best, *in_best]) and (
        guard.alias_pattern([*out_ref, *in_ref]) == guard.alias_pattern([*out_best, *in_best])
    )
    del out_ref, in_ref, out_best, in_best
    if not same:
        return default, (
            f"variant {best.name} is lower but its outputs are not bitwise identical "
            "(values, strides or aliasing)"
        )
    if not p_best < p_def:
        return default, f"variant {best.name} measured {p_best} B, not below {p_def} B"
    if owned is not None and any(owned):
        h_def, _, _ = guard.measure_cpu(default.chosen, copies)
        h_best, _, _ = guard.measure_cpu(best.chosen, copies)
        if h_best > h_def:
            return default, (
                f"variant {best.name} is lower as the runtime calls it but higher when the "
                f"caller holds every input ({h_best} > {h_def} B)"
            )
    return best, f"variant {best.name}: {p_best} B < {p_def} B (default program, after the pass)"
