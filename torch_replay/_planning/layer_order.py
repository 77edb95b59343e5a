"""The exact planner of a layer plan, with the layers' order and gradients in its peak.

The model (the peak of a choice of options with the layers' retained bytes, transient
bytes and gradients in program order, beside the head's backward and the persistent
bytes) and the dynamic program that minimises the summed time under ``peak <= budget``
are Note [Ordered layer peak] in ``csrc/core/ordered_planner.h``; :func:`plan_ordered`
and :func:`ordered_peak` call that C++ code (``torch_replay._C.planner``).
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence

from ..errors import InfeasibleBudgetError
from .options import Option, Plan, PlanPrediction, SolverStats, checked_segments, planner_extension

__all__ = ["TIME_TOLERANCE", "lean_options", "ordered_peak", "plan_ordered"]

TIME_TOLERANCE = 0.05
"""Relative time difference under which two engines of a layer count as equally fast,
so that the one keeping fewer bytes is planned (Note [Layer plans] in ``layer_budget.py``, Engines)."""


def ordered_peak(
    chosen: Sequence[Option],
    grads: Sequence[int],
    *,
    persistent: int = 0,
    floor: int = 0,
    head: int = 0,
) -> int:
    """The peak of a choice of options, one per layer in program order (Note [Ordered
    layer peak] in ``csrc/core/ordered_planner.h``).

    Args:
        chosen: the option of each layer.
        grads: the gradient bytes each layer's backward creates (0 where the step holds
            them throughout).
        persistent: bytes held through the whole step.
        floor: bytes held after the layers' backward (every gradient), a lower bound.
        head: bytes alive beside every layer's retained bytes before the last layer's
            backward (the head's logits, the loss's backward).

    Returns:
        Bytes.

    Raises:
        ValueError: ``grads`` does not have one entry per layer, or a byte count is
            negative.
    """
    if len(chosen) != len(grads):
        raise ValueError(f"{len(chosen)} options for {len(grads)} layers' gradients")
    return planner_extension().ordered_peak(
        [(o.retained, o.transient, o.time) for o in chosen],
        list(grads),
        persistent=persistent,
        floor=floor,
        head=head,
    )


def plan_ordered(
    options: Sequence[Sequence[Option]],
    grads: Sequence[int],
    *,
    budget: int,
    persistent: int = 0,
    floor: int = 0,
    head: int = 0,
) -> Plan:
    """Choose one option per layer: least total time with :func:`ordered_peak` within
    ``budget`` (exact; Note [Ordered layer peak] in ``csrc/core/ordered_planner.h``, which
    also says which plan is returned among equally fast ones).

    Args:
        options: one sequence of :class:`~torch_replay.Option` per layer, in program order.
        grads: the gradient bytes each layer's backward creates.
        budget: memory budget of the step in bytes.
        persistent: bytes held through the whole step.
        floor: bytes held after the layers' backward.
        head: bytes alive beside every layer's retained bytes before the last layer's
            backward.

    Returns:
        The :class:`~torch_replay.Plan` (``objective="ordered"``; ``peak`` is
        :func:`ordered_peak` of its choice, ``retained`` the chosen options' sum and
        ``transient`` their largest).

    Raises:
        InfeasibleBudgetError: no choice fits; ``min_budget`` is the smallest budget that
            one does.
        ValueError: ``grads`` does not have one entry per layer, or bad options.
    """
    segments = checked_segments(options)
    if len(grads) != len(segments):
        raise ValueError(f"{len(segments)} layers but {len(grads)} gradient sizes")
    core = planner_extension()
    start = _time.perf_counter()
    result = core.plan_ordered(
        [[(o.retained, o.transient, o.time) for o in seg] for seg in segments],
        list(grads),
        budget,
        persistent=persistent,
        floor=floor,
        head=head,
    )
    seconds = _time.perf_counter() - start
    if not result.feasible:
        raise InfeasibleBudgetError(
            f"no layer plan fits budget={budget} bytes with persistent={persistent} bytes: "
            f"the smallest budget with a plan is {result.min_budget} bytes",
            min_budget=result.min_budget,
        )
    path = list(result.choices)
    chosen = [seg[k] for seg, k in zip(segments, path, strict=True)]
    total, peak = result.time, result.peak
    retained, transient = result.retained, result.transient
    return Plan(
        choices=[o.name for o in chosen],
        indices=path,
        options=chosen,
        time=total,
        peak=peak,
        retained=retained,
        transient=transient,
        persistent=persistent,
        budget=budget,
        objective="ordered",
        min_budget=result.min_budget,
        predicted=PlanPrediction(retained=retained, transient=transient, peak=peak, time=total),
        frontier_sizes=list(result.frontier_sizes),
        stats=SolverStats(
            states_generated=result.states_generated,
            states_pruned_by_time=0,
            rounds=1,
            time_upper_bound=total,
            seconds=seconds,
        ),
    )


def lean_options(options: list[Option], *, unwritten: bool = False) -> list[Option]:
    """A layer's options without the engines another engine beats: one that keeps fewer
    bytes (no more retained and transient, not both equal) and, unless the layer's
    declared state is ``unwritten``, is not slower by more than :data:`TIME_TOLERANCE`
    (Note [Layer plans] in ``layer_budget.py``, Engines).

    Args:
        options: the layer's options.
        unwritten: the layer's forward writes none of its declared state (nothing is
            restored before its re-run, so bytes decide between engines).

    Returns:
        The options kept (``eager`` always), in their order.
    """

    def beaten(b: Option) -> bool:
        return any(
            a is not b
            and a.name != "eager"
            and a.retained <= b.retained
            and a.transient <= b.transient
            and (a.retained, a.transient) != (b.retained, b.transient)
            and (unwritten or a.time <= b.time * (1 + TIME_TOLERANCE))
            for a in options
        )

    return [o for o in options if o.name == "eager" or not beaten(o)]
