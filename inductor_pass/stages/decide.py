"""The decide stage: measure both programs and apply the deploy rule (design.md §3.1).

Deploy rule (CPU; the six conditions of ``docs/design.md`` §3.1): the permuted program replaces the original only
when (1) the profiled run shows effect completeness (no undeclared write) and
the ownership records hold (every statement's live-byte delta equals the
modelled one), (2) the modelled peak equals the measured peak, to the byte, for
both the original and the permuted program (see Note [Allocator guard]),
(3) outputs and final input bytes are bitwise identical, and (4) the permuted
peak is strictly lower. Peaks are those of the programs called as the runtime
calls them (Note [Input ownership] in ``inductor_pass/stages/guard.py``): inputs the
call owns are freed at their last use. When the call owns inputs, (5) the
permuted program's measured peak must also not exceed the original's when
every input is held (a later call whose caller keeps them, as with
``retain_graph=True``). On CUDA only (3) and a strictly lower *measured* peak
are required (the caching allocator is not byte-exact). Condition (1) is the
profile stage's (``inductor_pass/stages/profile.py``); :func:`decide` checks the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inductor_pass.config import PassConfig
from inductor_pass.stages import guard
from inductor_pass.stages.profile import Profiled
from inductor_pass.stages.search import Searched

__all__ = ["Decision", "decide"]


@dataclass(kw_only=True, slots=True)
class Decision:
    """The decide stage's result."""

    deployed: bool
    reason: str
    """Why (prefixed ``left unchanged:`` when not deployed)."""
    call: Callable[[list[Any]], Any] | None = None
    """The permuted program's callable when deployed."""
    runner: Any = None
    measured_original_peak: int | None = None
    measured_permuted_peak: int | None = None
    measured_all_held_peaks: tuple[int, int] | None = None
    bitwise_identical: bool | None = None
    byte_exact: bool | None = None
    kernel_seconds: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def decide(
    prof: Profiled,
    found: Searched,
    new_src: str,
    *,
    original_call: Callable[[list[Any]], Any],
    base_globals: dict[str, Any],
    partitions: Any,
    config: PassConfig,
    kind: str,
) -> Decision:
    """Measure the original and the permuted program ``new_src``; apply the deploy rule."""
    new_call, new_runner = guard.build_call(
        new_src,
        base_globals,
        partitions=partitions,
        filename=f"<torch_replay permuted {kind} wrapper>",
    )
    inputs, owned, shared = prof.inputs, prof.owned, prof.shared
    measure = guard.measure_cuda if prof.on_cuda else guard.measure_cpu
    peak_o, out_o, in_o = measure(original_call, inputs, owned=owned, shared=shared)
    peak_p, out_p, in_p = measure(new_call, inputs, owned=owned, shared=shared)
    d = Decision(deployed=False, reason="", measured_original_peak=peak_o)
    d.measured_permuted_peak = peak_p
    d.bitwise_identical = guard.bitwise_equal([*out_o, *in_o], [*out_p, *in_p])
    del out_o, in_o, out_p, in_p
    held_ok = True
    if any(owned):
        # The same programs when the caller keeps every input (Note [Input ownership]).
        held_o, out_o, in_o = measure(original_call, inputs, shared=shared)
        held_p, out_p, in_p = measure(new_call, inputs, shared=shared)
        d.measured_all_held_peaks = (held_o, held_p)
        d.bitwise_identical = d.bitwise_identical and guard.bitwise_equal(
            [*out_o, *in_o], [*out_p, *in_p]
        )
        del out_o, in_o, out_p, in_p
        held_ok = held_p <= held_o
    if prof.on_cuda:  # pragma: no cover - needs a GPU
        ok, why = _cuda_rule(d, original_call, new_call, inputs, held_ok)
    else:
        ok, why = _cpu_rule(d, prof.modelled_peak, found, held_ok)
    if ok and not config.deploy:
        ok, why = False, why + "; not deployed (PassConfig.deploy=False)"
    d.deployed = bool(ok)
    d.reason = why if ok else "left unchanged: " + why
    if ok:
        d.call, d.runner = new_call, new_runner
    return d


def _cpu_rule(d: Decision, modelled_orig: Any, found: Searched, held_ok: bool) -> tuple[bool, str]:
    peak_o, peak_p, out_peak = d.measured_original_peak, d.measured_permuted_peak, found.peak
    d.byte_exact = peak_o == modelled_orig and peak_p == out_peak
    if not d.byte_exact:
        return False, (
            f"modelled != measured (original {modelled_orig} vs {peak_o}, "
            f"permuted {out_peak} vs {peak_p})"
        )
    if not d.bitwise_identical:
        return False, "outputs of the permuted program are not bitwise identical"
    if out_peak >= modelled_orig:
        why = "no order with a strictly lower peak"
        if found.result.certified:
            why += " (the original peak is certified optimal)"
        return False, why
    if not held_ok:
        return False, (
            "the permuted program is lower as the runtime calls it but higher when "
            f"the caller holds every input ({d.measured_all_held_peaks})"
        )
    return True, f"peak lowered by {modelled_orig - out_peak} bytes (byte-exact)"


def _cuda_rule(
    d: Decision, original_call: Any, new_call: Any, inputs: Any, held_ok: bool
) -> tuple[bool, str]:  # pragma: no cover - needs a GPU
    d.byte_exact = None
    try:  # diagnostics only: a timing failure never blocks the guard's decision
        t_o, t_p = guard.time_cuda(original_call, inputs), guard.time_cuda(new_call, inputs)
        d.kernel_seconds = {
            "original": t_o.seconds,
            "permuted": t_p.seconds,
            "source": t_o.source,
            "kernels": t_o.kernels,
        }
        if t_o.note:
            d.notes.append(f"kernel timing: {t_o.note}")
    except Exception as exc:
        d.notes.append(f"kernel timing failed: {type(exc).__name__}: {exc}")
    peak_o, peak_p = d.measured_original_peak, d.measured_permuted_peak
    ok = bool(d.bitwise_identical) and peak_p < peak_o and held_ok
    if ok:
        return True, "CUDA guard: measured peak lower and outputs bitwise identical"
    if not d.bitwise_identical:
        return False, "CUDA guard: outputs differ"
    if peak_p >= peak_o:
        return False, "CUDA guard: measured peak not lower"
    return False, "CUDA guard: measured peak higher when the caller holds every input"
