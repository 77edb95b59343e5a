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

import math
import operator
import time as _time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field, replace

from torch_replay._ext import engine_names
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

OPTION_NAMES: tuple[str, ...] = ("eager", *(e for e in engine_names() if e != "auto"))
"""The option names: ``"eager"`` (no checkpoint) and one per preservation engine (their
names come from C++, :func:`torch_replay._ext.engine_names`)."""

OBJECTIVES: tuple[str, ...] = ("joint", "state_agnostic", "eager_whole")
"""The objectives :func:`plan` accepts."""

_EAGER_WHOLE = ("eager", "snapshot")


def _nonnegative_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer number of bytes, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} must be an integer number of bytes, got {type(value).__name__} {value!r}"
        ) from None
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run one segment, with its measured costs.

    Args:
        name: One of :data:`OPTION_NAMES`.
        retained: Bytes held from the forward until this segment's backward
            (activations for ``"eager"``; inputs plus preserved state for the
            others).
        transient: Bytes held only while the segment is replayed.
        time: Time the option adds to a training step (any unit, the same for
            every option).
        preserved: The part of ``retained`` owed to preserving mutable state
            (snapshot copy, journal, read-set); 0 for ``"eager"``.

    Raises:
        ValueError: unknown name, negative or non-finite cost, ``preserved >
            retained``, or ``"eager"`` with ``preserved != 0``.
        TypeError: a byte count that is not an integer.
    """

    name: str
    _: KW_ONLY
    retained: int
    transient: int
    time: float
    preserved: int = 0

    def __post_init__(self) -> None:
        if self.name not in OPTION_NAMES:
            raise ValueError(f"Option name must be one of {OPTION_NAMES}, got {self.name!r}")
        retained = _nonnegative_int(self.retained, f"Option {self.name!r} retained")
        transient = _nonnegative_int(self.transient, f"Option {self.name!r} transient")
        preserved = _nonnegative_int(self.preserved, f"Option {self.name!r} preserved")
        try:
            time = float(self.time)
        except (TypeError, ValueError):
            raise TypeError(
                f"Option {self.name!r} time must be a real number, got {self.time!r}"
            ) from None
        if not math.isfinite(time) or time < 0:
            raise ValueError(f"Option {self.name!r} time must be finite and >= 0, got {time}")
        if preserved > retained:
            raise ValueError(
                f"Option {self.name!r}: preserved ({preserved}) is part of retained "
                f"({retained}) and cannot exceed it"
            )
        if self.name == "eager" and preserved != 0:
            raise ValueError("Option 'eager' keeps activations and preserves nothing: preserved=0")
        object.__setattr__(self, "retained", retained)
        object.__setattr__(self, "transient", transient)
        object.__setattr__(self, "preserved", preserved)
        object.__setattr__(self, "time", time)

    def __str__(self) -> str:
        text = (
            f"{self.name}: retained {_mib(self.retained)} MiB, transient "
            f"{_mib(self.transient)} MiB, time {self.time:.4g}"
        )
        return text + (f" (preserved {_mib(self.preserved)} MiB)" if self.preserved else "")


RERUN_FLOOR_MIN_S = 1e-9
"""The least time a re-run adds (seconds), for a forward too short for the clock."""


def rerun_floor(options: Sequence[Option], eager_forward: float) -> list[Option]:
    """One segment's options with each checkpointed option's time raised to at least
    the kept option's time plus the segment's forward: its re-run.

    Note [Re-run floor]
    A checkpointed option runs the segment's forward, its backward and its forward once
    more (the re-run), so it can never take less time than keeping the activations
    (``eager``: the forward and the backward) plus that forward. Calibrated times are
    medians of a few noisy steps, each option measured in its own run: on a loaded
    machine a checkpointed option can measure below ``eager``, and a planner that
    believed it would checkpoint layers at any budget (even 1 TiB). So the floor is
    applied by construction wherever measured costs become options: the calibration's
    ``segments`` (``measure_segments``), a layer plan's groups
    (``torch_replay.layer_budget.plan_layers``, also for a costs file given back) and
    ``torch_replay.calibrate.load_costs``. The forward is ``eager``'s own measured
    forward (at least :data:`RERUN_FLOOR_MIN_S`), so with an ample budget keeping every
    segment is strictly the fastest plan. A measured time above the floor is kept. The
    planners themselves take options as given (hand-written costs can say anything).

    Args:
        options: the segment's options; without ``eager`` they are returned unchanged.
        eager_forward: the segment's forward time with ``eager`` (the unit of ``time``).

    Returns:
        The options, in their order (``eager`` and those above the floor unchanged).

    Raises:
        ValueError: ``eager_forward`` is negative or not finite.
    """
    forward = float(eager_forward)
    if not math.isfinite(forward) or forward < 0:
        raise ValueError(f"eager_forward must be finite and >= 0, got {eager_forward!r}")
    kept = next((o for o in options if o.name == "eager"), None)
    if kept is None:
        return list(options)
    floor = kept.time + max(forward, RERUN_FLOOR_MIN_S)
    return [o if o.name == "eager" or o.time >= floor else replace(o, time=floor) for o in options]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPrediction:
    """Totals of a plan as the planner saw them (its objective's costs).

    Equal to the plan's true totals except for ``objective="state_agnostic"``,
    which does not see preserved bytes.
    """

    retained: int
    """Sum of the charged retained bytes."""
    transient: int
    """Largest charged transient."""
    peak: int
    """persistent + retained + transient, as charged."""
    time: float
    """Sum of the times."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverStats:
    """How hard the exact solver worked (for benchmarks and diagnosis)."""

    states_generated: int
    """Candidate partial plans that entered dominance tests, over all rounds."""
    states_pruned_by_time: int
    """Candidates dropped by the exact time bound."""
    rounds: int
    """Dynamic-programming passes of the iterative deepening on time."""
    time_upper_bound: float
    """Time of the greedy feasible plan that bounds the search."""
    seconds: float
    """Wall time of the solve, in seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The option chosen for each segment, with its true costs.

    ``peak`` is always computed from the true costs of the chosen options,
    ``persistent + retained + transient``, whatever the objective.
    """

    choices: list[str]
    """Option name per segment."""
    indices: list[int]
    """Position of the chosen option in each segment's list."""
    options: list[Option]
    """The chosen :class:`Option` per segment."""
    time: float
    """Sum of the chosen options' times (segment order)."""
    peak: int
    """True peak: persistent + retained + transient."""
    retained: int
    """Sum of the chosen options' retained bytes, the journal's shared log counted
    once (:func:`charged_retained`)."""
    transient: int
    """Largest transient among the chosen options."""
    persistent: int
    """Persistent bytes given to :func:`plan`."""
    budget: int
    """The budget given to :func:`plan`."""
    objective: str
    """The objective it was planned with."""
    min_budget: int
    """Smallest budget for which this objective has a plan (as it charges)."""
    predicted: PlanPrediction
    """Totals as the objective charged them."""
    frontier_sizes: list[int] = field(default_factory=list)
    """Pareto frontier size after each segment (last solver round)."""
    stats: SolverStats | None = None
    """Solver effort."""

    @property
    def overshoot(self) -> int:
        """Bytes by which the true peak exceeds the budget (0 if it fits)."""
        return max(0, self.peak - self.budget)

    @property
    def fits(self) -> bool:
        """Whether the true peak is within the budget."""
        return self.peak <= self.budget

    def __str__(self) -> str:
        fit = "fits" if self.fits else f"OVER by {_mib(self.overshoot)} MiB"
        lines = [
            f"plan ({self.objective}): peak {_mib(self.peak)} MiB, budget {_mib(self.budget)} MiB "
            f"({fit}), time {self.time:.4g}",
            f"  {'segment':<8}{'option':<10}{'retained MiB':>13}{'transient MiB':>14}{'time':>10}",
        ]
        limit = 12
        for i, o in enumerate(self.options[:limit]):
            lines.append(
                f"  {i:<8}{o.name:<10}{_mib(o.retained):>13}{_mib(o.transient):>14}{o.time:>10.4g}"
            )
        if len(self.options) > limit:
            lines.append(
                f"  … {len(self.options) - limit} more segments ({len(self.options)} in all)"
            )
        lines.append(
            f"  peak = persistent {_mib(self.persistent)} + retained {_mib(self.retained)} "
            f"+ max transient {_mib(self.transient)} MiB"
        )
        return "\n".join(lines)


def planner_extension():
    import torch  # noqa: F401  (loads the libraries the extension links against)

    from torch_replay._ext import require_extension

    return require_extension().planner


def checked_segments(options: Sequence[Sequence[Option]]) -> list[list[Option]]:
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise TypeError("options must be a sequence (one entry per segment) of sequences of Option")
    segments = []
    for i, seg in enumerate(options):
        if isinstance(seg, (str, bytes, Option)) or not isinstance(seg, Sequence):
            raise TypeError(f"options[{i}] must be a sequence of Option, got {type(seg).__name__}")
        if len(seg) == 0:
            raise ValueError(f"segment {i} has no option; give it at least Option('eager', ...)")
        names = set()
        for opt in seg:
            if not isinstance(opt, Option):
                raise TypeError(f"options[{i}] holds {type(opt).__name__}, expected Option")
            if opt.name in names:
                raise ValueError(f"segment {i} lists option {opt.name!r} twice")
            names.add(opt.name)
        segments.append(list(seg))
    return segments


def charged_retained(chosen: Sequence[Option]) -> int:
    """Retained bytes of a choice of options, one per segment: every option's
    ``retained``, with the journal's shared log (the options' ``preserved``)
    counted once, as its largest part."""
    journal = [o.preserved for o in chosen if o.name == "journal"]
    return sum(o.retained for o in chosen) - sum(journal) + max(journal, default=0)


def plan_peak(chosen: Sequence[Option], persistent: int) -> int:
    """``persistent + retained + max(transient)`` of a choice of options, with
    :func:`charged_retained`: the one peak formula of the planner's model."""
    return persistent + charged_retained(chosen) + max((o.transient for o in chosen), default=0)


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
    budget = _nonnegative_int(budget, "budget")
    persistent = _nonnegative_int(persistent, "persistent")
    segments = checked_segments(options)

    # The options the objective may use (positions into each segment) and the
    # retained bytes it charges.
    allowed: list[list[int]] = []
    for i, seg in enumerate(segments):
        positions = [
            k for k, o in enumerate(seg) if objective != "eager_whole" or o.name in _EAGER_WHOLE
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
