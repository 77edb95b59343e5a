"""Predicted vs measured peak of a real training step (forward, backward, optimizer step).

:func:`measure_step` runs the user's own step function once and reports, side by side,

* the plan's predicted peak (``plan.peak``, when a plan is given);
* the measured peak: the bytes held when the step starts (distinct storages of the
  model's parameters, buffers and gradients and of the optimizer's state, each counted
  until it is freed: ``zero_grad(set_to_none=True)`` frees the gradients) plus the peak,
  over the step, of the tensor storages its operators created and still alive
  (:class:`~torch_replay._planning.peak.LiveBytesTracker`, sampled after every operator) and the
  bytes the preservation engines hold in C++ (:func:`torch_replay.engine_bytes`, which
  no allocator statistic sees): Note [Measured peak] in ``planned.py``;
* the physical peak: peak RSS above the RSS at the start (``/proc/self/status`` VmHWM,
  reset through ``clear_refs``) on CPU, the CUDA allocator's peak above its level at the
  start on GPU. It sees everything (allocator slack, Python objects, the tracker's own
  bookkeeping), is coarse (pages), and on CPU counts only memory touched anew.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._planning.peak import LiveBytesTracker, static_bytes
from ._replay.segment import engine_bytes

__all__ = ["StepPeakReport", "measure_step"]


@dataclass(kw_only=True, slots=True)
class StepPeakReport:
    """Predicted vs measured peak of one training step (see the module docstring)."""

    predicted_peak: int | None
    """The plan's ``peak`` (None without a plan)."""
    measured_peak: int
    """``static_bytes + tracked_peak``."""
    static_bytes: int
    """Parameters, buffers, gradients and optimizer state held when the step started."""
    tracked_peak: int
    """Peak of tensor storages created in the step plus the engines' C++ bytes."""
    engine_peak: int
    """Largest C++ engine bytes sampled during the step."""
    physical_peak: int
    """Peak RSS (CPU) or CUDA allocator peak above its level at the start."""
    budget: int | None
    """The plan's budget (None without a plan)."""

    @property
    def relative_error(self) -> float | None:
        """``(predicted - measured) / measured`` (positive: the prediction is
        conservative), or None without a prediction."""
        if self.predicted_peak is None or self.measured_peak == 0:
            return None
        return (self.predicted_peak - self.measured_peak) / self.measured_peak

    def __str__(self) -> str:
        def mib(v: int | None) -> str:
            return "-" if v is None else f"{v / 2**20:10.2f}"

        err = self.relative_error
        rows = [
            ("predicted (plan)", self.predicted_peak, "persistent + retained + max transient"),
            ("measured", self.measured_peak, "held at start + tracked peak (engine bytes in)"),
            ("  held at start", self.static_bytes, "parameters, buffers, grads, optimizer state"),
            ("  engines' C++ bytes", self.engine_peak, "largest during the step"),
            ("physical (RSS / allocator)", self.physical_peak, "above the level at the start"),
            ("budget", self.budget, "" if err is None else f"prediction {err:+.1%} of measured"),
        ]
        lines = [f"{'peak of one training step':<28} {'MiB':>10}  what it counts"]
        lines += [f"{name:<28} {mib(v)}  {what}" for name, v, what in rows]
        return "\n".join(lines)


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _add(counter: list[int], nbytes: int) -> None:
    counter[0] += nbytes


def measure_step(
    step: Callable[[], Any],
    model: torch.nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    plan: Any = None,
) -> StepPeakReport:
    """Run one training step and measure its peak against a plan's prediction.

    Args:
        step: runs the whole step (forward, loss, backward, ``optimizer.step()``); it
            runs once, for real: parameters and optimizer state change as in training.
        model: the model (its parameters, buffers and gradients count as held).
        optimizer: the optimizer (its state counts as held at the start).
        plan: a :class:`~torch_replay.Plan` whose ``peak`` and ``budget`` are reported.

    Returns:
        The :class:`StepPeakReport` (``print`` it for a table).
    """
    from .calibrate.measure import PhysicalPeak

    held = [*model.parameters(), *model.buffers()]
    held += [p.grad for p in model.parameters() if p.grad is not None]
    held += _optimizer_tensors(optimizer)
    static = static_bytes(held)
    device = next((p.device.type for p in model.parameters()), "cpu")
    engines = [0]
    freed = [0]  # bytes held at the start and freed since (gradients set to None)
    storages = {}
    for t in held:
        if t.layout == torch.strided:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
    for s in storages.values():
        weakref.finalize(s, _add, freed, s.nbytes())
    del storages, held

    def extra() -> int:
        engines[0] = max(engines[0], n := engine_bytes())
        return n - freed[0]

    tracker = LiveBytesTracker(extra)
    physical = PhysicalPeak(device)
    physical.start()
    with tracker:
        step()
    return StepPeakReport(
        predicted_peak=None if plan is None else int(plan.peak),
        measured_peak=static + tracker.peak,
        static_bytes=static,
        tracked_peak=tracker.peak,
        engine_peak=engines[0],
        physical_peak=physical.peak(),
        budget=None if plan is None else int(plan.budget),
    )
