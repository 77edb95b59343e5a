"""Measured peaks of a planned step (Note [Measured peak] in ``planned.py``): the live-bytes
tracker, static bytes, per-segment profiles and the peak report."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# ------------------------------------------------------------------- tracker


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


class LiveBytesTracker(TorchDispatchMode):
    """Live bytes of the tensor storages operators create while it is active.

    A storage counts from the operator that creates it (an output whose storage
    is none of the operator's inputs' storages) until it is freed. ``extra``
    (optional) returns bytes held outside the torch allocator (the
    transactions' C++ copies); it is sampled after every operator and added to
    ``live``. ``peak`` is the largest ``live`` seen; :meth:`mark` starts a new
    window (``window_peak``) for per-segment figures.

    Args:
        extra: a callable returning bytes held elsewhere, or None.
    """

    def __init__(self, extra: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.extra = extra
        self.tensor_live = 0
        self.extra_live = 0
        self.peak = 0
        self.window_peak = 0
        self._seen: set[int] = set()

    @property
    def live(self) -> int:
        """Tensor bytes created while active and alive, plus the last ``extra`` sample."""
        return self.tensor_live + self.extra_live

    def sample(self) -> int:
        """Re-read ``extra``, update the peaks, and return ``live``."""
        self.extra_live = self.extra() if self.extra is not None else 0
        live = self.live
        self.peak = max(self.peak, live)
        self.window_peak = max(self.window_peak, live)
        return live

    def mark(self) -> int:
        """Start a new window: sample, set ``window_peak = live`` and return it."""
        live = self.sample()
        self.window_peak = live
        return live

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._seen:
            self._seen.discard(key)
            self.tensor_live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            _storage_ptr(t)
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.layout == torch.strided
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            s = t.untyped_storage()
            key = s.data_ptr()
            if not key or key in inputs or key in self._seen:
                continue
            self._seen.add(key)
            nbytes = s.nbytes()
            self.tensor_live += nbytes
            weakref.finalize(s, self._free, key, nbytes)
        self.sample()
        return out


def static_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``.

    Args:
        tensors: any tensors (views of one storage count once).

    Returns:
        The summed ``nbytes`` of their distinct storages.
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.layout != torch.strided:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


# ------------------------------------------------------------------- reports


@dataclass(kw_only=True, slots=True)
class SegmentProfile:
    """What one segment did during one profiled step."""

    forward_s: float = 0.0
    """Time of the segment's forward (the profiler's clock: wall time, or the thread's
    CPU time when torch computes on one thread, ``SegmentRunner.profile_step``)."""
    backward_s: float = 0.0
    """Time from the gradient of its output to the gradient of its input
    (its backward, including any replay)."""
    retained_tensor_bytes: int = 0
    """Tensor bytes its forward left alive (activations it saved and its output)."""
    preserved_bytes: int = 0
    """Bytes its transaction held just before backward (0 for eager)."""
    forward_extra_bytes: int = 0
    """Peak above (start + retained) during its forward (temporaries)."""
    backward_transient_bytes: int = 0
    """Peak during its backward above the live bytes when it began."""
    written_bytes: int = 0
    """Declared bytes its forward wrote (transaction counter; 0 for eager)."""
    replay_transient_bytes: int = 0
    """Largest live-state save around its replay (transaction counter)."""
    engine: str = "eager"
    """The engine that ran it (``"eager"`` for a plain call)."""


@dataclass(kw_only=True, slots=True)
class PeakReport:
    """Predicted vs measured peak of one training step (Note [Measured peak])."""

    predicted_peak: int | None
    """``plan.peak`` (None when the module runs fixed choices without costs)."""
    measured_peak: int
    """Gradients cleared before the step: ``static_bytes + tracked_peak``
    (gradients are created during backward and counted in ``tracked_peak``)."""
    measured_peak_grads_held: int | None = None
    """Gradients held through the step (allocated before it, counted as static
    bytes): what :attr:`predicted_peak` models."""
    static_bytes: int
    """Distinct storages of parameters, buffers and declared state."""
    tracked_peak: int
    """Peak of tracked live bytes (tensor storages created in the step plus C++ copies)."""
    persistent: int
    """The persistent bytes the plan charged."""
    budget: int | None
    """The budget planned for."""
    choices: list[str]
    """The option of each segment."""
    segments: list[SegmentProfile] = field(default_factory=list)
    """Per-segment figures of the same step."""

    @property
    def predicted_minus_measured(self) -> int | None:
        """Predicted minus measured peak (gradients held, as predicted, when measured;
        positive: the prediction is conservative)."""
        if self.predicted_peak is None:
            return None
        held = self.measured_peak_grads_held
        return self.predicted_peak - (held if held is not None else self.measured_peak)

    def __str__(self) -> str:
        def mib(v: int | None) -> str:
            return "-" if v is None else f"{v / 2**20:10.2f}"

        rows = [
            (
                "predicted (plan)",
                self.predicted_peak,
                "persistent + sum(retained) + max(transient); persistent = parameters, "
                "buffers, declared state, one gradient per parameter",
            ),
            (
                "measured, gradients held",
                self.measured_peak_grads_held,
                "the same step with every .grad allocated before it: compare with predicted",
            ),
            (
                "measured, gradients cleared",
                self.measured_peak,
                "every .grad None before the step (zero_grad(set_to_none=True))",
            ),
        ]
        lines = [f"{'peak of one training step':<28} {'MiB':>10}  what it counts"]
        lines += [f"{name:<28} {mib(v)}  {what}" for name, v, what in rows]
        plan = "".join(c[0].upper() for c in self.choices)
        budget = "-" if self.budget is None else f"{self.budget / 2**20:.2f} MiB"
        lines.append(f"choices {plan} ({', '.join(_cut_list(self.choices, 8))}), budget {budget}")
        return "\n".join(lines)


def _cut_list(items: Sequence[Any], limit: int) -> list[str]:
    items = [str(i) for i in items]
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… {len(items) - limit} more"]


def default_loss(out: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


class Profiler:
    """Per-segment timing and memory windows of one step (see profile_step)."""

    def __init__(
        self,
        n: int,
        tracker: LiveBytesTracker | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self.tracker = tracker
        self.segments = [SegmentProfile() for _ in range(n)]
        self.n = n
        self._t0 = 0.0
        self._live0 = 0
        self._tensor0 = 0
        self._txns: list[Any] = [None] * n
        self._bwd_start: list[float | None] = [None] * n
        self._bwd_end: list[float | None] = [None] * n
        self._bwd_live0: list[int] = [0] * n
        self._bwd_peak: list[int] = [0] * n
        self._backward_done = 0.0
        self._open: int | None = None

    # forward -----------------------------------------------------------------
    def before_forward(self, i: int, h: Any) -> None:
        if i == 0 and isinstance(h, torch.Tensor) and h.requires_grad:
            h.register_hook(self._input_hook(0))
        if self.tracker is not None:
            self._live0 = self.tracker.mark()
            self._tensor0 = self.tracker.tensor_live
        self._t0 = self._clock()

    def after_forward(self, i: int, h: Any, txn: Any) -> None:
        seg = self.segments[i]
        seg.forward_s = self._clock() - self._t0
        if self.tracker is not None:
            tr_ = self.tracker
            tr_.sample()
            seg.retained_tensor_bytes = max(0, tr_.tensor_live - self._tensor0)
            held = tr_.live - self._live0
            seg.forward_extra_bytes = max(0, tr_.window_peak - self._live0 - max(held, 0))
        # Weak: the transaction must die when autograd frees the segment's graph.
        self._txns[i] = weakref.ref(txn) if txn is not None else None
        if txn is not None:
            seg.engine = txn.engine
        if isinstance(h, torch.Tensor) and h.requires_grad:
            # The gradient of h ends segment i+1's backward and starts segment i's.
            if i + 1 < self.n:
                h.register_hook(self._input_hook(i + 1))
            h.register_hook(self._output_hook(i))

    # backward ----------------------------------------------------------------
    def before_backward(self) -> None:
        # The last segment's backward window opens here, not at its output's gradient:
        # the loss's own backward (the gradient of the output and the loss's
        # temporaries) then counts in its transient bytes, as it does in the step.
        self._bwd_start[self.n - 1] = self._clock()
        if self.tracker is not None:
            self._bwd_live0[self.n - 1] = self.tracker.mark()
        self._open = self.n - 1
        for i, ref in enumerate(self._txns):
            txn = ref() if ref is not None else None
            if txn is not None:
                self.segments[i].preserved_bytes = int(txn.retained_bytes)
                self.segments[i].written_bytes = int(txn.written_bytes)

    def saw_replay(self, i: int, nbytes: int) -> None:
        seg = self.segments[i]
        seg.replay_transient_bytes = max(seg.replay_transient_bytes, int(nbytes))

    def _output_hook(self, i: int):
        def hook(grad):
            if i == self.n - 1 and self._bwd_start[i] is not None:
                return  # opened by before_backward
            now = self._clock()
            self._bwd_start[i] = now
            if self.tracker is not None:
                self._bwd_live0[i] = self.tracker.mark()
            self._open = i

        return hook

    def _input_hook(self, i: int):
        # Fires when the gradient of segment i's input is complete: its backward is over.
        def hook(grad):
            now = self._clock()
            if self._bwd_end[i] is None:
                self._bwd_end[i] = now
                if self.tracker is not None and self._open == i:
                    self.tracker.sample()
                    self._bwd_peak[i] = self.tracker.window_peak
                    self._open = None

        return hook

    def after_backward(self) -> None:
        now = self._clock()
        if self.tracker is not None and self._open is not None:
            self.tracker.sample()
            self._bwd_peak[self._open] = self.tracker.window_peak
            self._open = None
        for i in range(self.n):
            start = self._bwd_start[i]
            end = self._bwd_end[i] if self._bwd_end[i] is not None else now
            if start is not None:
                self.segments[i].backward_s = max(0.0, end - start)
        self._backward_done = now

    def finish(self) -> None:
        for i, seg in enumerate(self.segments):
            ref = self._txns[i]
            txn = ref() if ref is not None else None
            if txn is not None:  # still alive (retain_graph): read its counter
                self.saw_replay(i, txn.replay_transient_bytes)
            if self.tracker is not None and self._bwd_start[i] is not None:
                seg.backward_transient_bytes = max(0, self._bwd_peak[i] - self._bwd_live0[i])
