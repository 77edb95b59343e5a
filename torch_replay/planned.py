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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ._planning.peak import LiveBytesTracker, PeakReport, SegmentProfile, static_bytes
from ._planning.runner import SegmentRunner, check_choices
from .planner import OBJECTIVES, Option, Plan, plan, plan_peak

__all__ = ["LiveBytesTracker", "PeakReport", "PlannedSequential", "SegmentProfile", "static_bytes"]

# -------------------------------------------------------------------- module


def _read_costs(costs: Any, mods: Sequence[Any]) -> tuple[list[list[Option]], Mapping | None]:
    n = len(mods)
    if isinstance(costs, (str, os.PathLike, Mapping)):
        from .calibrate import SCHEMA, check_costs, load_costs
        from .calibrate.fingerprint import read_costs

        doc, source = read_costs(
            costs,
            what="costs",
            remedy="Write it with tr.calibrate_model(..., out=...) or `python -m "
            "torch_replay.calibrate --model pkg.module:factory --out costs.json`, or pass "
            "costs='auto'",
        )
        if doc.get("schema") == SCHEMA and doc.get("model"):
            check_costs(doc, mods, source=source)
        return load_costs(doc, segments=n), doc
    if isinstance(costs, Sequence):
        return [list(seg) for seg in costs], None
    raise TypeError(
        "costs must be a list (per segment) of lists of tr.Option, a calibration "
        f"JSON path, its loaded dict, or 'auto'; got {type(costs).__name__}"
    )


class PlannedSequential(SegmentRunner):
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
        super().__init__(segments, state=state, persistent=persistent, use_reentrant=use_reentrant)
        mods = self._callables
        n = len(mods)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.budget = budget
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
            self.choices = check_choices(choices, n)
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

    # ------------------------------------------------------------- accounting

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
        return super().forward(x)

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

        from .calibrate.fingerprint import describe_value

        have = describe_value(x)
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

    def extra_repr(self) -> str:
        try:
            peak = self.predicted_peak
        except ValueError:
            peak = None
        return f"choices={self.choices}, budget={self.budget}, predicted_peak={peak}"
