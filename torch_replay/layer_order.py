"""The exact planner of a layer plan, with the layers' order and gradients in its peak.

Note [Ordered layer peak]
A training step's backward visits the layers last to first. While layer ``i`` runs its
backward (its re-run included, when checkpointed), what is alive is

* what every earlier layer ``j <= i`` keeps from the forward: its ``retained`` bytes
  (activations when kept; its input and preserved state when checkpointed);
* layer ``i``'s ``transient`` bytes (its backward's temporaries and, measured with
  gradients cleared as the calibration does, the gradients it creates);
* the gradients of every later layer ``j > i``, created by their backwards already:
  ``grads[j]`` bytes each (0 when the step holds every gradient throughout: they are
  then persistent bytes);
* the persistent bytes (parameters, buffers, optimizer state, what the model keeps
  outside its layers through their backward).

Before the last layer's backward, the head's backward runs beside every layer's retained
bytes: ``head`` more bytes (the logits, their gradient, the loss's temporaries). So the
peak of a choice of options is

    persistent + max(floor, head + sum_j retained_j,
                     max_i (sum_{j<=i} retained_j + transient_i + sum_{j>i} grads_j))

where ``floor`` is what the step holds after the layers (every gradient). A layer
checkpointed with the journal pays its own log: the layers' declared states are their own
(disjoint), so their logs are separate (a shared log would be counted once per layer
here, an over-count). The forward needs no term of its own: while layer ``i`` runs its
forward, ``sum_{j<i} retained_j`` plus its temporaries is alive, at most the backward's
figure (a calibrated ``transient`` is the larger of the forward's and the backward's).

:func:`plan_ordered` minimises the summed time under ``peak <= budget`` exactly by a
dynamic program over the layers in program order whose states are the Pareto frontier
of (retained so far, peak so far, time so far): the constraint at layer ``i`` depends on
the past only through the retained sum (and so does the head's term), and a state worse
in all three can never lead to a better plan. Among the plans of least time it returns the one of lowest peak (then
the first option positions among those the frontier kept).
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence

from .errors import InfeasibleBudgetError
from .planner import Option, Plan, PlanPrediction, SolverStats, _checked_segments

__all__ = ["TIME_TOLERANCE", "lean_options", "ordered_peak", "plan_ordered"]

TIME_TOLERANCE = 0.05
"""Relative time difference under which two engines of a layer count as equally fast,
so that the one keeping fewer bytes is planned (Note [Layer plans] in ``layer_budget.py``, Engines)."""


def _suffix(grads: Sequence[int]) -> list[int]:
    """``after[i] = sum(grads[i+1:])``."""
    after = [0] * len(grads)
    total = 0
    for i in range(len(grads) - 1, -1, -1):
        after[i] = total
        total += grads[i]
    return after


def ordered_peak(
    chosen: Sequence[Option],
    grads: Sequence[int],
    *,
    persistent: int = 0,
    floor: int = 0,
    head: int = 0,
) -> int:
    """The peak of a choice of options, one per layer in program order (Note [Ordered
    layer peak]).

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
    """
    if len(chosen) != len(grads):
        raise ValueError(f"{len(chosen)} options for {len(grads)} layers' gradients")
    after = _suffix(grads)
    held, top = 0, floor
    for o, a in zip(chosen, after, strict=True):
        held += o.retained
        top = max(top, held + o.transient + a)
    return persistent + max(top, held + head)


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
    ``budget`` (exact; Note [Ordered layer peak]).

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
    segments = _checked_segments(options)
    if len(grads) != len(segments):
        raise ValueError(f"{len(segments)} layers but {len(grads)} gradient sizes")
    start = _time.perf_counter()
    after = _suffix(grads)
    room = budget - persistent
    # A state: (retained so far, peak so far, time so far, option positions so far).
    states = [(0, floor, 0.0, ())]
    lean = [(0, floor)]  # the same without the budget: (retained, peak), for min_budget
    sizes, generated = [], 0
    last = len(segments) - 1
    for i, (seg, a) in enumerate(zip(segments, after, strict=True)):
        grown = []
        for held, top, spent, path in states:
            for k, o in enumerate(seg):
                peak = max(top, held + o.retained + o.transient + a)
                if peak <= room and held + o.retained + head <= room:
                    grown.append((held + o.retained, peak, spent + o.time, (*path, k)))
        generated += len(grown)
        if i == last:  # every layer's retained bytes and the head's
            grown = [(h, max(t, h + head), c, p) for h, t, c, p in grown]
        states = _pareto(grown)
        sizes.append(len(states))
        lean = _pareto2(
            [
                (h + o.retained, max(t, h + o.retained + o.transient + a))
                for h, t in lean
                for o in seg
            ]
        )
    min_budget = persistent + min(max(t, h + head) for h, t in lean)
    seconds = _time.perf_counter() - start
    if not states:
        raise InfeasibleBudgetError(
            f"no layer plan fits budget={budget} bytes with persistent={persistent} bytes: "
            f"the smallest budget with a plan is {min_budget} bytes",
            min_budget=min_budget,
        )
    _, top, _, path = min(states, key=lambda s: (_summed(segments, s[3]), s[1], s[3]))
    chosen = [seg[k] for seg, k in zip(segments, path, strict=True)]
    total = _summed(segments, path)
    retained = sum(o.retained for o in chosen)
    transient = max((o.transient for o in chosen), default=0)
    return Plan(
        choices=[o.name for o in chosen],
        indices=list(path),
        options=chosen,
        time=total,
        peak=persistent + top,
        retained=retained,
        transient=transient,
        persistent=persistent,
        budget=budget,
        objective="ordered",
        min_budget=min_budget,
        predicted=PlanPrediction(
            retained=retained, transient=transient, peak=persistent + top, time=total
        ),
        frontier_sizes=sizes,
        stats=SolverStats(
            states_generated=generated,
            states_pruned_by_time=0,
            rounds=1,
            time_upper_bound=total,
            seconds=seconds,
        ),
    )


def _summed(segments: Sequence[Sequence[Option]], path: Sequence[int]) -> float:
    total = 0.0  # in segment order, as plan() sums
    for seg, k in zip(segments, path, strict=True):
        total += seg[k].time
    return total


def _pareto(states: list[tuple]) -> list[tuple]:
    """The states no other is at least as good as in retained, peak and time (among equal
    ones, the first path)."""
    states.sort(key=lambda s: (s[0], s[1], s[2], s[3]))
    kept: list[tuple] = []
    for s in states:
        if not any(k[1] <= s[1] and k[2] <= s[2] for k in kept):
            kept.append(s)  # every kept one has retained <= s's
    return kept


def _pareto2(states: list[tuple[int, int]]) -> list[tuple[int, int]]:
    states.sort()
    kept: list[tuple[int, int]] = []
    for s in states:
        if not kept or s[1] < kept[-1][1]:
            kept.append(s)
    return kept


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
