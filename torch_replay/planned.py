"""Run a sequential model with the options the joint planner chose.

:class:`PlannedSequential` takes the segments of a model, their measured
options (from ``python -m torch_replay.calibrate`` or a list of
:class:`~torch_replay.planner.Option`), a memory budget and the declared state,
plans with :func:`torch_replay.plan`, and runs each segment with its choice:
``"eager"`` is a plain call that keeps its activations; the other options run
the segment through :func:`torch_replay.checkpoint` with that engine.

Predicted vs measured peak (Note [Measured peak]):

* predicted: ``plan.peak = persistent + retained + max(transient)`` (the journal's shared log counted once: :func:`torch_replay.planner.plan_peak`) with
  the calibrated costs.
* measured (:meth:`PlannedSequential.measure`): ``static`` (bytes of the
  distinct storages of the parameters, buffers and declared state tensors at
  the start of the step) plus the peak, over one training step (forward, loss,
  backward), of

  - the bytes of every tensor storage an operator creates during the step and
    that is still alive (a :class:`LiveBytesTracker` dispatch mode; storages
    that alias an operator's inputs, i.e. views and in-place results, are not
    new), which covers activations, recomputed activations, gradients and
    temporaries between operators; and
  - the bytes the live transactions hold in C++ outside the torch allocator
    (snapshot / read-set copies, the shared journal counted once, and the live
    save of the transaction being replayed), read from their counters.

  Sampled after every operator, so memory used only inside one operator
  (workspaces) is not seen, nor allocator slack or Python objects. The budget
  benchmark also reports peak RSS of fresh processes, which sees everything.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .checkpoint import checkpoint, collect_transactions
from .planner import OBJECTIVES, OPTION_NAMES, Option, Plan, plan, plan_peak

__all__ = [
    "LiveBytesTracker",
    "PeakReport",
    "PlannedSequential",
    "SegmentProfile",
    "static_bytes",
]


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
    """Wall time of the segment's forward."""
    backward_s: float = 0.0
    """Wall time from the gradient of its output to the gradient of its input
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


# -------------------------------------------------------------------- module


def _read_costs(costs: Any, mods: Sequence[Any]) -> tuple[list[list[Option]], Mapping | None]:
    n = len(mods)
    if isinstance(costs, (str, os.PathLike, Mapping)):
        import json
        from pathlib import Path

        from .calibrate import SCHEMA, check_costs, load_costs

        if isinstance(costs, Mapping):
            doc, source = costs, "the costs"
        else:
            source = f"costs file {os.fspath(costs)!r}"
            try:
                doc = json.loads(Path(costs).read_text())
            except OSError as e:
                raise ValueError(
                    f"cannot read {source}: {e}. Write it with tr.calibrate_model(..., "
                    "out=...) or `python -m torch_replay.calibrate --model pkg.module:factory "
                    "--out costs.json`, or pass costs='auto'"
                ) from None
        if doc.get("schema") == SCHEMA and doc.get("model"):
            check_costs(doc, mods, source=source)
        return load_costs(doc, segments=n), doc
    if isinstance(costs, Sequence):
        return [list(seg) for seg in costs], None
    raise TypeError(
        "costs must be a list (per segment) of lists of tr.Option, a calibration "
        f"JSON path, its loaded dict, or 'auto'; got {type(costs).__name__}"
    )


def _is_per_segment(state: Any, n: int) -> bool:
    if not isinstance(state, (list, tuple)) or len(state) != n or n == 0:
        return False
    return all(s is None or isinstance(s, (list, tuple)) for s in state)


class PlannedSequential(torch.nn.Module):
    """A sequence of segments, each run with the option the joint planner chose.

    Args:
        segments: the segments in program order (an ``nn.Sequential``, or a
            list of ``nn.Module`` s); each takes the previous output.
        budget: memory budget in bytes (needed unless ``choices`` is given).
        costs: the measured options: a costs JSON file written by
            :func:`~torch_replay.calibrate_model` or ``python -m
            torch_replay.calibrate`` (its ``model`` section), that file's
            loaded dict, a list (one per segment) of lists of :class:`Option`,
            or ``"auto"``: calibrate these segments at the first call, on
            that call's input (see ``calibration``), then plan. A file or
            dict is checked against the segments (their classes, parameter
            and buffer shapes and dtypes): costs of another model raise
            :class:`~torch_replay.CostsMismatchError`; costs measured with
            another torch or on another CPU/GPU give a warning.
        state: declared state for the checkpointed segments (tensors,
            ``nn.Module`` s, ``torch.Generator`` s), either one iterable for
            every segment, or a list with one iterable (or None) per segment.
        objective: ``"joint"``, ``"state_agnostic"`` or ``"eager_whole"``.
        persistent: bytes held throughout (``P``); default: parameters,
            buffers, declared state tensors and the parameters' gradients.
        choices: run these option names instead of planning (baselines); the
            costs, when given, still give the predicted peak.
        use_reentrant: passed to :func:`torch_replay.checkpoint`.
        calibration: with ``costs="auto"``, keyword arguments of
            :func:`~torch_replay.calibrate_model` (``loss_fn``, ``reps``,
            ``quick``, ``options``, ``out``, ``progress``).

    Raises:
        CostsMismatchError: the costs belong to another model.
        InfeasibleBudgetError: no plan of ``objective`` fits ``budget`` (its
            ``min_budget`` says what would).
        ValueError: inconsistent arguments (costs for another number of
            segments, unknown option names, missing budget).
        TypeError: arguments of the wrong type.
    """

    def __init__(
        self,
        segments: Sequence[torch.nn.Module] | torch.nn.Sequential,
        *,
        budget: int | None = None,
        costs: Any = None,
        state: Iterable[Any] | Sequence[Iterable[Any] | None] | None = None,
        objective: str = "joint",
        persistent: int | None = None,
        choices: Sequence[str] | None = None,
        use_reentrant: bool = False,
        calibration: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
        if not mods:
            raise ValueError("PlannedSequential needs at least one segment")
        for i, m in enumerate(mods):
            if not callable(m):
                raise TypeError(f"segment {i} is a {type(m).__name__}, not callable")
        self.segments = torch.nn.ModuleList(m for m in mods if isinstance(m, torch.nn.Module))
        self._callables = mods
        n = len(mods)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        if state is None:
            self._state: list[list[Any] | None] = [None] * n
        elif _is_per_segment(state, n):
            self._state = [list(s) if s is not None else None for s in state]
        else:
            shared = list(state)
            self._state = [shared] * n
        self.use_reentrant = use_reentrant
        self.objective = objective
        self.budget = budget
        self.persistent = self.default_persistent() if persistent is None else int(persistent)
        self.costs: list[list[Option]] | None = None
        self.costs_doc: Mapping[str, Any] | None = None
        self._auto = isinstance(costs, str) and costs == "auto"
        self._calibration = dict(calibration or {})
        self._expected_input: Any = None
        if costs is not None and not self._auto:
            self.costs, self.costs_doc = _read_costs(costs, mods)
            if len(self.costs) != n:
                from .errors import CostsMismatchError

                raise CostsMismatchError(
                    f"costs describe {len(self.costs)} segments, the model has {n}"
                )
            if self.costs_doc is not None:
                fp = (self.costs_doc.get("model") or {}).get("fingerprint") or {}
                first = (fp.get("segments") or [{}])[0]
                self._expected_input = first.get("input")
        self.plan: Plan | None = None
        if choices is not None:
            choices = list(choices)
            if len(choices) != n:
                raise ValueError(f"{len(choices)} choices for {n} segments")
            for c in choices:
                if c not in OPTION_NAMES:
                    raise ValueError(f"unknown option {c!r}; options are {OPTION_NAMES}")
            self.choices = choices
        elif self._auto:
            if budget is None:
                raise ValueError("costs='auto' plans at the first call: give budget= too")
            self.choices = []  # planned at the first forward
        else:
            if budget is None or self.costs is None:
                raise ValueError(
                    "give budget= and costs= to plan, or choices= to run fixed options"
                )
            self.plan = plan(
                self.costs, budget=budget, persistent=self.persistent, objective=objective
            )
            self.choices = list(self.plan.choices)
        self._txns: list[weakref.ReferenceType | None] = [None] * n
        self._profile: _Profiler | None = None

    # ------------------------------------------------------------- accounting

    def _state_tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for items in self._state:
            for item in items or ():
                if isinstance(item, torch.Tensor):
                    out.append(item)
                elif isinstance(item, torch.nn.Module):
                    out.extend(b for b in item.buffers() if b is not None)
                    out.extend(item.parameters())
        return out

    def _static_tensors(self) -> list[torch.Tensor]:
        return [*self.parameters(), *(b for b in self.buffers() if b is not None)] + (
            self._state_tensors()
        )

    def default_persistent(self) -> int:
        """Parameters, buffers and declared state tensors (distinct storages), plus
        one gradient per parameter that requires grad.

        Returns:
            Bytes.
        """
        grads = sum(p.numel() * p.element_size() for p in self.parameters() if p.requires_grad)
        return static_bytes(self._static_tensors()) + grads

    @property
    def predicted_peak(self) -> int | None:
        """``persistent + retained + max(transient)`` of the choices, from the costs
        (the journal's shared log counted once: :func:`torch_replay.planner.plan_peak`)."""
        if self.plan is not None:
            return self.plan.peak
        if self.costs is None:
            return None
        chosen = []
        for i, (seg, c) in enumerate(zip(self.costs, self.choices, strict=True)):
            match = [o for o in seg if o.name == c]
            if not match:
                raise ValueError(f"segment {i} has no measured cost for option {c!r}")
            chosen.append(match[0])
        return plan_peak(chosen, self.persistent)

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
        """Run every segment with its chosen option.

        Args:
            x: input of the first segment.

        Returns:
            Output of the last segment.
        """
        if self._auto and self.plan is None:
            self._calibrate_now(x)
        elif self._expected_input is not None:
            self._check_input(x)
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

    def _calibrate_now(self, x: Any) -> None:
        from .calibrate import calibrate_model

        kw = dict(self._calibration)
        kw.setdefault("quick", True)
        kw.setdefault("progress", False)
        sample = x.detach().clone() if isinstance(x, torch.Tensor) else x
        with torch.enable_grad():
            doc = calibrate_model(self._callables, sample, state=self._state, **kw)
        from .calibrate import load_costs

        self.costs_doc = doc
        self.costs = load_costs(doc, segments=len(self._callables))
        self.plan = plan(
            self.costs, budget=self.budget, persistent=self.persistent, objective=self.objective
        )
        self.choices = list(self.plan.choices)
        self._txns = [None] * len(self._callables)

    def _check_input(self, x: Any) -> None:
        import warnings

        from .calibrate.fingerprint import _describe_value

        have = _describe_value(x)
        if self._expected_input != have:
            want, self._expected_input = self._expected_input, None  # warn once
            warnings.warn(
                f"the costs were measured with input {want}, this call's input is {have}: "
                "bytes and times scale with it, so the plan may not fit the budget; "
                "calibrate with the input you train with",
                stacklevel=3,
            )

    def save_costs(self, path: str | os.PathLike) -> None:
        """Write the costs this module plans from (after ``costs="auto"`` calibrated).

        Args:
            path: the JSON file to write; pass it as ``costs=`` next time.

        Raises:
            ValueError: nothing calibrated yet (no call since ``costs="auto"``)
                or the costs were given as a list of :class:`Option`.
        """
        import json
        from pathlib import Path

        if self.costs_doc is None:
            raise ValueError(
                "no costs document to save: with costs='auto' call the module once first"
            )
        Path(path).write_text(json.dumps(self.costs_doc, indent=1) + "\n")

    # ---------------------------------------------------------------- measure

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
        loss_fn = loss_fn or _default_loss
        tracker = LiveBytesTracker(self._held_bytes) if track_memory else None
        prof = _Profiler(len(self.choices), tracker)
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

    def _step(self, x, loss_fn, prof: _Profiler) -> None:
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

    def extra_repr(self) -> str:
        try:
            peak = self.predicted_peak
        except ValueError:
            peak = None
        return f"choices={self.choices}, budget={self.budget}, predicted_peak={peak}"


def _default_loss(out: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


class _Profiler:
    """Per-segment timing and memory windows of one step (see profile_step)."""

    def __init__(self, n: int, tracker: LiveBytesTracker | None) -> None:
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
        self._t0 = time.perf_counter()

    def after_forward(self, i: int, h: Any, txn: Any) -> None:
        seg = self.segments[i]
        seg.forward_s = time.perf_counter() - self._t0
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
        self._bwd_start[self.n - 1] = time.perf_counter()
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
            now = time.perf_counter()
            self._bwd_start[i] = now
            if self.tracker is not None:
                self._bwd_live0[i] = self.tracker.mark()
            self._open = i

        return hook

    def _input_hook(self, i: int):
        # Fires when the gradient of segment i's input is complete: its backward is over.
        def hook(grad):
            now = time.perf_counter()
            if self._bwd_end[i] is None:
                self._bwd_end[i] = now
                if self.tracker is not None and self._open == i:
                    self.tracker.sample()
                    self._bwd_peak[i] = self.tracker.window_peak
                    self._open = None

        return hook

    def after_backward(self) -> None:
        now = time.perf_counter()
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
