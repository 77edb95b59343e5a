"""Joint preservation-aware planner.

Each checkpointed segment of a model can be run with one of several options:
keep its activations (``"eager"``) or recompute them in the backward after
making its declared state available again by a whole ``"snapshot"``, a region
``"journal"``, ``"readset"`` preservation or a ``"guard"``. Option ``o`` of
segment ``i`` costs retained bytes ``r[i, o]`` (held from the forward to the
backward), transient bytes ``q[i, o]`` (held only while that segment is
replayed) and time ``c[i, o]``. :func:`plan` picks one option per segment to

    minimise  sum(c)   subject to   persistent + sum(r) + max(q) <= budget

(with the journal's shared log counted once, see below) exactly, with the dynamic program of ``csrc/core/pareto_planner.h`` (full
Pareto frontier of (retained, max transient, time), see Note [Planner
dominance] there), and reports two baselines:

* ``objective="joint"``: every option at its true cost.
* ``objective="state_agnostic"``: the preserved bytes are left out of the
  objective (``retained - preserved`` is charged), as a planner unaware of
  mutable state would do; the returned ``peak`` is the true peak of its
  choice, so its budget overshoot shows.
* ``objective="eager_whole"``: exact costs, but only ``"eager"`` and
  ``"snapshot"`` may be chosen.

The journal is one copy-on-write log shared by every segment that journals the
same state (Note [Preservation engines] in csrc/core/preservation_engine.h): a
journal option's ``preserved`` bytes are the log kept from that segment's
start until its backward, which contains the log of every later journaled
segment. So the journaled segments of a plan pay their log once, the largest
``preserved`` among them, and each pays its own ``retained - preserved``
(:func:`charged_retained`). ``plan`` stays exact under that rule: it solves
once per candidate log size ``J`` (the distinct journal ``preserved`` values,
and none), allowing only journal options with ``preserved <= J`` and adding
``J`` to the persistent bytes, and returns the best of those plans; the
least-time, lowest-peak, earliest plan is found under its own ``J``.

Costs normally come from ``python -m torch_replay.calibrate``; bytes are
integers, times any consistent unit.

Tie-breaking (deterministic): among plans of least total time (times summed
in segment order), the lowest peak; among those, the plan whose option
positions are lexicographically first (segment 0 first; options in the order
given). With times that sum exactly (integers, dyadic fractions) this holds
exactly; otherwise time and peak are still optimal and only plans whose times
differ by rounding may be ordered differently.
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence

from torch_replay._planning.options import (
    EAGER_WHOLE,
    OBJECTIVES,
    OPTION_NAMES,
    RERUN_FLOOR_MIN_S,
    Option,
    Plan,
    PlanPrediction,
    SolverStats,
    charged_retained,
    checked_segments,
    nonnegative_int,
    plan_peak,
    planner_extension,
    rerun_floor,
)
from torch_replay.errors import InfeasibleBudgetError

__all__ = [
    "OPTION_NAMES",
    "OBJECTIVES",
    "RERUN_FLOOR_MIN_S",
    "Option",
    "Plan",
    "PlanPrediction",
    "SolverStats",
    "charged_retained",
    "plan",
    "plan_peak",
    "rerun_floor",
]


def plan(
    options: Sequence[Sequence[Option]],
    *,
    budget: int,
    persistent: int = 0,
    objective: str = "joint",
) -> Plan:
    """Choose one option per segment: least total time within the memory budget.

    Exact: the solver keeps the full Pareto frontier of (retained, max
    transient, time) over segments, prunes only what provably cannot be
    optimal, and never truncates. Ties are broken as described in the module
    docstring (least time, then lowest peak, then earliest options).

    Args:
        options: One sequence of :class:`Option` per segment, in program order,
            each name at most once per segment.
        budget: Memory budget ``M`` in bytes.
        persistent: Bytes held throughout (parameters, optimizer state,
            buffers) ``P``.
        objective: ``"joint"``, ``"state_agnostic"`` or ``"eager_whole"``
            (see the module docstring).

    Returns:
        The chosen :class:`Plan`. Its ``peak`` is the true peak; for
        ``"state_agnostic"`` it may exceed ``budget`` (see ``Plan.overshoot``).

    Raises:
        InfeasibleBudgetError: no plan of this objective fits the budget; its
            ``min_budget`` is the smallest budget for which one does.
        ValueError: bad arguments (unknown objective, negative sizes, a segment
            with no usable option for ``"eager_whole"``, ...).
        TypeError: arguments of the wrong type.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    budget = nonnegative_int(budget, "budget")
    persistent = nonnegative_int(persistent, "persistent")
    segments = checked_segments(options)

    # The options the objective may use (positions into each segment) and the
    # retained bytes it charges.
    allowed: list[list[int]] = []
    for i, seg in enumerate(segments):
        positions = [
            k for k, o in enumerate(seg) if objective != "eager_whole" or o.name in EAGER_WHOLE
        ]
        if not positions:
            raise ValueError(
                f"segment {i} offers neither 'eager' nor 'snapshot' "
                f"(it has {[o.name for o in seg]}), so objective='eager_whole' cannot plan it"
            )
        allowed.append(positions)

    # The journal's shared log (module docstring): one solve per log size J.
    shared = objective == "joint"
    levels = [0]
    if shared:
        levels += sorted(
            {o.preserved for seg in segments for o in seg if o.name == "journal" and o.preserved}
        )

    def charged(o: Option) -> int:
        if objective == "state_agnostic" or (shared and o.name == "journal"):
            return o.retained - o.preserved
        return o.retained

    core = planner_extension()
    start = _time.perf_counter()
    best = None  # (time, true peak, indices, result)
    min_budget = None
    totals = [0, 0, 0]
    for level in levels:
        usable = [
            [
                k
                for k in pos
                if not (shared and seg[k].name == "journal" and seg[k].preserved > level)
            ]
            for seg, pos in zip(segments, allowed, strict=True)
        ]
        if any(not pos for pos in usable):
            continue
        core_input = [
            [(charged(seg[k]), seg[k].transient, seg[k].time) for k in pos]
            for seg, pos in zip(segments, usable, strict=True)
        ]
        result = core.ParetoPlanner(core_input, persistent + level).solve(budget)
        totals[0] += result.states_generated
        totals[1] += result.states_pruned_by_time
        totals[2] += result.rounds
        min_budget = result.min_budget if min_budget is None else min(min_budget, result.min_budget)
        if not result.feasible:
            continue
        indices = [pos[c] for pos, c in zip(usable, result.choices, strict=True)]
        chosen = [seg[k] for seg, k in zip(segments, indices, strict=True)]
        total_time = 0.0
        for o in chosen:
            total_time += o.time
        key = (total_time, plan_peak(chosen, persistent) if shared else result.peak, indices)
        if best is None or key < best[:3]:
            best = (*key, result)
    seconds = _time.perf_counter() - start

    if best is None:
        raise InfeasibleBudgetError(
            _infeasible_message(objective, budget, persistent, min_budget),
            min_budget=min_budget,
        )

    total_time, _, indices, result = best
    chosen = [seg[k] for seg, k in zip(segments, indices, strict=True)]
    retained = charged_retained(chosen)
    transient = max((o.transient for o in chosen), default=0)
    if shared:  # the prediction is the true total
        predicted = PlanPrediction(
            retained=retained,
            transient=transient,
            peak=persistent + retained + transient,
            time=result.time,
        )
    else:
        predicted = PlanPrediction(
            retained=result.retained,
            transient=result.transient,
            peak=result.peak,
            time=result.time,
        )
    return Plan(
        choices=[o.name for o in chosen],
        indices=indices,
        options=chosen,
        time=total_time,
        peak=persistent + retained + transient,
        retained=retained,
        transient=transient,
        persistent=persistent,
        budget=budget,
        objective=objective,
        min_budget=min_budget,
        predicted=predicted,
        frontier_sizes=list(result.frontier_sizes),
        stats=SolverStats(
            states_generated=totals[0],
            states_pruned_by_time=totals[1],
            rounds=totals[2],
            time_upper_bound=result.time_upper_bound,
            seconds=seconds,
        ),
    )


def _infeasible_message(objective: str, budget: int, persistent: int, min_budget: int) -> str:
    message = (
        f"no plan fits budget={budget} bytes with persistent={persistent} bytes "
        f"(objective={objective!r}): the smallest budget with a plan is {min_budget} bytes. "
        f"Raise the budget to at least {min_budget}, lower the persistent memory"
    )
    if objective == "eager_whole":
        return (
            message
            + ", or plan with objective='joint', which may also use journal, readset and guard options."
        )
    if objective == "state_agnostic":
        return (
            message + " (this objective does not charge preserved bytes, so real peaks are higher)."
        )
    return (
        message
        + ", or offer leaner options (journal, readset, guard) for the segments that retain the most."
    )
