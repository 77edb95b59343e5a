"""Run a sequence of segments, each with a fixed option, and profile one training step.

:class:`SegmentRunner` is what :class:`~torch_replay.PlannedSequential` runs once it
has its choices, and what calibration runs to measure a set of choices
(``torch_replay.calibrate.measure``): ``"eager"`` is a plain call that keeps its
activations; the other options run the segment through
:func:`torch_replay.checkpoint` with that engine. It knows nothing of costs or
plans, so the calibration can use it without importing the planner's module
(Note [Measured peak] in ``planned.py`` says what a profile counts).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .._replay.api import checkpoint
from .._replay.segment import collect_transactions, state_tensors
from .options import OPTION_NAMES
from .peak import (
    LiveBytesTracker,
    PeakReport,
    Profiler,
    SegmentProfile,
    default_loss,
    static_bytes,
)

__all__ = ["SegmentRunner"]


def _is_per_segment(state: Any, n: int) -> bool:
    if not isinstance(state, (list, tuple)) or len(state) != n or n == 0:
        return False
    return all(s is None or isinstance(s, (list, tuple)) for s in state)


def check_choices(choices: Sequence[str], n: int) -> list[str]:
    choices = list(choices)
    if len(choices) != n:
        raise ValueError(f"{len(choices)} choices for {n} segments")
    for c in choices:
        if c not in OPTION_NAMES:
            raise ValueError(f"unknown option {c!r}; options are {OPTION_NAMES}")
    return choices


class SegmentRunner(torch.nn.Module):
    """A sequence of segments, each run with a given option name.

    Args:
        segments: the segments in program order (an ``nn.Sequential``, or a
            list of ``nn.Module`` s); each takes the previous output.
        state: declared state for the checkpointed segments, one iterable for
            every segment or a list with one iterable (or None) per segment.
        persistent: bytes held throughout; default :meth:`default_persistent`.
        choices: the option name of each segment (``[]`` until a subclass sets them).
        use_reentrant: passed to :func:`torch_replay.checkpoint`.
    """

    def __init__(
        self,
        segments: Sequence[torch.nn.Module] | torch.nn.Sequential,
        *,
        state: Iterable[Any] | Sequence[Iterable[Any] | None] | None = None,
        persistent: int | None = None,
        choices: Sequence[str] | None = None,
        use_reentrant: bool = False,
    ) -> None:
        super().__init__()
        mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
        if not mods:
            raise ValueError(f"{type(self).__name__} needs at least one segment")
        for i, m in enumerate(mods):
            if not callable(m):
                raise TypeError(f"segment {i} is a {type(m).__name__}, not callable")
        self.segments = torch.nn.ModuleList(m for m in mods if isinstance(m, torch.nn.Module))
        self._callables = mods
        n = len(mods)
        if state is None:
            self._state: list[list[Any] | None] = [None] * n
        elif _is_per_segment(state, n):
            self._state = [list(s) if s is not None else None for s in state]
        else:
            shared = list(state)
            self._state = [shared] * n
        self.use_reentrant = use_reentrant
        self.budget: int | None = None  # shown in measure()'s report
        self.persistent = self.default_persistent() if persistent is None else int(persistent)
        self.choices: list[str] = [] if choices is None else check_choices(choices, n)
        self._txns: list[weakref.ReferenceType | None] = [None] * n
        self._profile: Profiler | None = None

    # ------------------------------------------------------------- accounting

    def _static_tensors(self) -> list[torch.Tensor]:
        return [*self.parameters(), *(b for b in self.buffers() if b is not None)] + (
            state_tensors(self._state)
        )

    def default_persistent(self) -> int:
        """Parameters, buffers and declared state tensors (distinct storages), plus
        one gradient per parameter that requires grad.

        Returns:
            Bytes.
        """
        grads = sum(p.numel() * p.element_size() for p in self.parameters() if p.requires_grad)
        return static_bytes(self._static_tensors()) + grads

    def _held_bytes(self) -> int:
        """Bytes the live transactions hold outside the torch allocator."""
        total = 0
        journal = 0
        for i, ref in enumerate(self._txns):
            txn = ref() if ref is not None else None
            if txn is None:
                continue
            retained = txn.retained_bytes
            if txn.engine == "journal":
                journal = max(journal, retained)  # one shared log
            else:
                total += retained
            if txn.in_replay:
                total += txn.replay_transient_bytes
                if self._profile is not None:
                    self._profile.saw_replay(i, txn.replay_transient_bytes)
        return total + journal

    # ---------------------------------------------------------------- forward

    def forward(self, x: Any) -> Any:
        """Run every segment with its option.

        Args:
            x: input of the first segment.

        Returns:
            Output of the last segment.
        """
        prof = self._profile
        h = x
        for i, (fn, choice) in enumerate(zip(self._callables, self.choices, strict=True)):
            if prof is not None:
                prof.before_forward(i, h)
            if choice == "eager" or not torch.is_grad_enabled():
                h = fn(h)
                txn = None
            else:
                with collect_transactions() as made:
                    h = checkpoint(
                        fn,
                        h,
                        use_reentrant=self.use_reentrant,
                        replay_state=self._state[i],  # never a segment's own keyword
                        replay_engine=choice,
                    )
                # The segment's own transaction: the first one its call made (nested
                # checkpoints inside the segment come after it).
                txn = made[0] if made else None
            self._txns[i] = weakref.ref(txn) if txn is not None else None
            if prof is not None:
                prof.after_forward(i, h, txn)
        return h

    @property
    def predicted_peak(self) -> int | None:
        """None here: only a :class:`~torch_replay.PlannedSequential` has costs to predict from."""
        return None

    # ---------------------------------------------------------------- profile

    def profile_step(
        self,
        x: torch.Tensor,
        loss_fn: Callable[[Any], torch.Tensor] | None = None,
        *,
        track_memory: bool = True,
    ) -> tuple[list[SegmentProfile], int]:
        """Run one training step (forward, loss, backward) and profile each segment.

        Gradients are accumulated into ``.grad`` as by a normal step; set them to
        None before if you want them fresh.

        Args:
            x: the input (make it require grad to time the first segment's
                backward separately from the rest of the step).
            loss_fn: maps the output to a scalar (default: ``out.float().pow(2).mean()``).
            track_memory: run under a :class:`LiveBytesTracker` (slower; times
                are then not representative).

        Returns:
            (per-segment profiles, peak of tracked live bytes; 0 when not tracked).
        """
        loss_fn = loss_fn or default_loss
        tracker = LiveBytesTracker(self._held_bytes) if track_memory else None
        # One intra-op thread: the step computes on this thread (autograd runs a CPU
        # graph's backward on the calling thread), so its CPU time is the segments' work,
        # robust to other processes on a shared machine; otherwise wall time.
        one = torch.get_num_threads() == 1 and not torch.cuda.is_initialized()
        prof = Profiler(len(self.choices), tracker, time.thread_time if one else time.perf_counter)
        self._profile = prof
        try:
            if tracker is not None:
                with tracker:
                    self._step(x, loss_fn, prof)
            else:
                self._step(x, loss_fn, prof)
        finally:
            self._profile = None
        prof.finish()
        return prof.segments, (tracker.peak if tracker is not None else 0)

    def _step(self, x, loss_fn, prof: Profiler) -> None:
        out = self(x)
        loss = loss_fn(out)
        prof.before_backward()
        loss.backward()
        prof.after_backward()

    def measure(
        self, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor] | None = None
    ) -> PeakReport:
        """Measure one training step's peak, with and without gradients held, against the prediction.

        Two training steps run (forward, loss, backward):

        1. **gradients held**: every parameter that requires grad holds a
           ``.grad`` of its size for the whole step (as in a loop that
           zeroes gradients instead of setting them to None, or accumulates
           them). This is what the prediction counts: its ``persistent``
           includes one gradient per parameter.
        2. **gradients cleared**: every ``.grad`` is None first (as after
           ``optimizer.zero_grad(set_to_none=True)``, torch's default), so
           gradients appear during backward and count in the tracked peak.

        Afterwards the parameters hold the second step's gradients, as after
        one ordinary step. See Note [Measured peak] in the module docstring
        for what is counted and what is not.

        Args:
            x: the input batch (the first step runs on a detached clone).
            loss_fn: maps the output to a scalar (default: mean of squares).

        Returns:
            A :class:`PeakReport` (``print`` it for a table).
        """
        params = [p for p in self.parameters() if p.requires_grad]
        for p in self.parameters():
            p.grad = None
        for p in params:
            p.grad = torch.zeros_like(p)
        held_static = static_bytes([*self._static_tensors(), *(p.grad for p in params)])
        x_held = (
            x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
        )
        _, held_peak = self.profile_step(x_held, loss_fn, track_memory=True)
        for p in self.parameters():
            p.grad = None
        static = static_bytes(self._static_tensors())
        segs, peak = self.profile_step(x, loss_fn, track_memory=True)
        return PeakReport(
            predicted_peak=self.predicted_peak,
            measured_peak=static + peak,
            measured_peak_grads_held=held_static + held_peak,
            static_bytes=static,
            tracked_peak=peak,
            persistent=self.persistent,
            budget=self.budget,
            choices=list(self.choices),
            segments=segs,
        )
