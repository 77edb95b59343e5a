"""The option model of the planners: :class:`Option` (one way to run one segment, with its
costs), :class:`Plan` (one option per segment, with its true totals), the peak formula
(:func:`plan_peak`, the journal's shared log counted once) and the re-run floor. Shown to
users as ``torch_replay.planner``'s names."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field, replace

from .._ext import engine_names

OPTION_NAMES: tuple[str, ...] = ("eager", *(e for e in engine_names() if e != "auto"))
"""The option names: ``"eager"`` (no checkpoint) and one per preservation engine (their
names come from C++, :func:`torch_replay._ext.engine_names`)."""

OBJECTIVES: tuple[str, ...] = ("joint", "state_agnostic", "eager_whole")
"""The objectives :func:`plan` accepts."""

EAGER_WHOLE = ("eager", "snapshot")


def nonnegative_int(value: object, what: str) -> int:
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
        retained = nonnegative_int(self.retained, f"Option {self.name!r} retained")
        transient = nonnegative_int(self.transient, f"Option {self.name!r} transient")
        preserved = nonnegative_int(self.preserved, f"Option {self.name!r} preserved")
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


# Shown (help, repr, pickles) where users import them from.
for _cls in (Option, Plan, PlanPrediction, SolverStats):
    _cls.__module__ = "torch_replay.planner"
