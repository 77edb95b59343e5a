"""The joint planner's objectives, errors and API (torch_replay.plan, Option, Plan):
the baselines' documented behaviour, tight minimum budgets, tie rules, validation."""

from __future__ import annotations

import pytest

from torch_replay.errors import InfeasibleBudgetError
from torch_replay.planner import OBJECTIVES, Option, Plan, plan

MiB = 1 << 20


# ---------------------------------------------------------------------------
# Objectives, errors, API
# ---------------------------------------------------------------------------


def queue_segments():
    """Two segments mutating a large queue: the journal preserves few bytes."""
    return [
        [
            Option("eager", retained=100, transient=0, time=0.0),
            Option("snapshot", retained=10 + 64, transient=100, time=1.0, preserved=64),
            Option("journal", retained=10 + 4, transient=100, time=1.2, preserved=4),
        ]
        for _ in range(2)
    ]


def test_joint_uses_journal_where_eager_whole_cannot_fit():
    segments = queue_segments()
    # Any replay holds 100 transient bytes, so 150 leaves 50 retained: only
    # journal + journal (10 + 10, and their shared 4-byte log once) fits.
    joint = plan(segments, budget=150, objective="joint")
    assert joint.choices == ["journal", "journal"]
    assert (joint.peak, joint.time) == (124, 2.4)
    with pytest.raises(InfeasibleBudgetError) as info:
        plan(segments, budget=150, objective="eager_whole")
    # eager_whole's leanest plan is all eager (200); a snapshot retains 74 and
    # replays 100 transient bytes (snapshot + snapshot = 248).
    assert info.value.min_budget == 200
    assert "objective='joint'" in str(info.value)
    whole = plan(segments, budget=200, objective="eager_whole")
    assert whole.choices == ["eager", "eager"] and whole.fits


def test_the_journals_shared_log_is_charged_once():
    # Three segments journal one queue; the log kept from segment i's start holds
    # every later segment's writes too (8, 5, 3 bytes): it is held once, 8 bytes.
    logs = [8, 5, 3]
    segments = [
        [
            Option("eager", retained=50, transient=0, time=0.0),
            Option("journal", retained=10 + log, transient=20, time=1.0, preserved=log),
        ]
        for log in logs
    ]
    got = plan(segments, budget=3 * 10 + 8 + 20, objective="joint")
    assert got.choices == ["journal"] * 3 and got.peak == 58 and got.fits
    # Charged per segment (16 bytes of log), that budget would not fit.
    with pytest.raises(InfeasibleBudgetError) as info:
        plan(segments, budget=57, objective="joint")
    assert info.value.min_budget == 58


def test_state_agnostic_overshoots_and_reports_true_peak():
    segments = [
        [
            Option("eager", retained=100, transient=0, time=0.0),
            Option("snapshot", retained=80, transient=20, time=1.0, preserved=70),
        ]
    ]
    # It charges 80 - 70 = 10 + 20 for the snapshot, so it thinks that fits 50.
    agnostic = plan(segments, budget=50, objective="state_agnostic")
    assert agnostic.choices == ["snapshot"]
    assert agnostic.predicted.peak == 30
    assert agnostic.peak == 100 and agnostic.overshoot == 50 and not agnostic.fits
    with pytest.raises(InfeasibleBudgetError) as info:
        plan(segments, budget=50, objective="joint")
    assert info.value.min_budget == 100


def test_min_budget_is_tight():
    segments = queue_segments()
    for objective in OBJECTIVES:
        with pytest.raises(InfeasibleBudgetError) as info:
            plan(segments, budget=0, persistent=7, objective=objective)
        floor = info.value.min_budget
        got = plan(segments, budget=floor, persistent=7, objective=objective)
        assert got.predicted.peak == floor
        with pytest.raises(InfeasibleBudgetError):
            plan(segments, budget=floor - 1, persistent=7, objective=objective)


def test_ties_prefer_lower_peak():
    # Equal times: guard x3 peaks at 3 (r 3, q 0), readset x3 at 1 (r 0, q 1).
    segments = [
        [
            Option("guard", retained=1, transient=0, time=1.0),
            Option("readset", retained=0, transient=1, time=1.0),
        ]
    ] * 3
    got = plan(segments, budget=100)
    assert got.choices == ["readset"] * 3 and got.peak == 1


def test_ties_prefer_earlier_options():
    # Every plan has the same time and peak: the first listed option wins.
    seg = [
        Option("guard", retained=1, transient=0, time=1.0),
        Option("readset", retained=1, transient=0, time=1.0),
    ]
    assert plan([seg] * 3, budget=100).choices == ["guard"] * 3
    assert plan([seg[::-1]] * 3, budget=100).choices == ["readset"] * 3
    # Same time and peak across segments: the earliest segment decides.
    # Budget 2 fits one eager (r 2) at most: (eager, guard) and (guard, eager)
    # both take time 1 at peak 2; segment 0 keeps its first option.
    seg = [
        Option("eager", retained=2, transient=0, time=0.0),
        Option("guard", retained=0, transient=0, time=1.0),
    ]
    got = plan([seg, seg], budget=2)
    assert (got.time, got.peak, got.choices) == (1.0, 2, ["eager", "guard"])
    assert plan([seg, seg], budget=2).choices == got.choices  # repeatable


def test_plan_fields():
    segments = queue_segments()
    got = plan(segments, budget=400, persistent=5)
    assert isinstance(got, Plan)
    assert got.choices == ["eager", "eager"]
    assert got.indices == [0, 0]
    assert got.options == [segments[0][0], segments[1][0]]
    assert (got.retained, got.transient, got.peak, got.time) == (200, 0, 205, 0.0)
    assert (got.persistent, got.budget, got.objective) == (5, 400, "joint")
    assert len(got.frontier_sizes) == 2
    assert got.stats is not None and got.stats.rounds >= 1
    empty = plan([], budget=5, persistent=5)
    assert empty.choices == [] and empty.peak == 5


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(name="lazy", retained=1, transient=1, time=1.0), ValueError),
        (dict(name="eager", retained=1, transient=1, time=1.0, preserved=1), ValueError),
        (dict(name="journal", retained=1, transient=1, time=1.0, preserved=2), ValueError),
        (dict(name="journal", retained=-1, transient=1, time=1.0), ValueError),
        (dict(name="journal", retained=1, transient=-1, time=1.0), ValueError),
        (dict(name="journal", retained=1, transient=1, time=-1.0), ValueError),
        (dict(name="journal", retained=1, transient=1, time=float("nan")), ValueError),
        (dict(name="journal", retained=1.5, transient=1, time=1.0), TypeError),
        (dict(name="journal", retained=True, transient=1, time=1.0), TypeError),
        (dict(name="journal", retained=1, transient=1, time="fast"), TypeError),
    ],
)
def test_option_validation(kwargs, error):
    name = kwargs.pop("name")
    with pytest.raises(error):
        Option(name, **kwargs)


def test_option_normalises_numbers():
    import numpy as np

    o = Option(
        "journal", retained=np.int64(8), transient=np.int32(2), time=np.float32(0.5), preserved=3
    )
    assert type(o.retained) is int and type(o.time) is float and o.time == 0.5


def test_plan_validation():
    seg = [Option("eager", retained=1, transient=0, time=0.0)]
    with pytest.raises(ValueError, match="objective"):
        plan([seg], budget=10, objective="fastest")
    with pytest.raises(ValueError, match="no option"):
        plan([seg, []], budget=10)
    with pytest.raises(ValueError, match="twice"):
        plan([seg * 2], budget=10)
    with pytest.raises(TypeError):
        plan([[("eager", 1, 0, 0.0)]], budget=10)
    with pytest.raises(TypeError):
        plan([seg], budget=10.5)
    with pytest.raises(ValueError):
        plan([seg], budget=-1)
    with pytest.raises(ValueError):
        plan([seg], budget=10, persistent=-1)
    with pytest.raises(ValueError, match="eager_whole"):
        plan(
            [[Option("guard", retained=1, transient=0, time=0.0)]],
            budget=10,
            objective="eager_whole",
        )
