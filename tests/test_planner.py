"""Exactness and API tests of the joint planner (torch_replay.planner).

* hypothesis instances against an exhaustive enumeration that applies the
  documented tie rule, for the three objectives;
* medium instances against an integer program solved by HiGHS;
* hand-drawn instances where pruning on summed memory loses the optimum
  (and the core's unsafe summed-memory rule does lose it);
* argument validation, errors and the baselines' documented behaviour.

Set TORCH_REPLAY_SLOW=1 for the larger opt-in runs (``@pytest.mark.slow``).
"""

from __future__ import annotations

import itertools
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_replay.errors import InfeasibleBudgetError, ReplayError
from torch_replay.planner import OBJECTIVES, OPTION_NAMES, Option, Plan, plan

SLOW = os.environ.get("TORCH_REPLAY_SLOW", "0") == "1"


def slow(test):
    """Marks an opt-in full-size run (``-m slow``; runs only with TORCH_REPLAY_SLOW=1)."""
    skip = pytest.mark.skipif(not SLOW, reason="full-size run: set TORCH_REPLAY_SLOW=1")
    return pytest.mark.slow(skip(test))


MiB = 1 << 20


def _core():
    import torch  # noqa: F401

    from torch_replay._ext import require_extension

    return require_extension().planner


# ---------------------------------------------------------------------------
# Reference: exhaustive enumeration with the documented tie rule.
# ---------------------------------------------------------------------------


def brute_force(segments, budget, persistent, objective):
    """Returns (min_budget, best positions or None) as plan() defines them."""
    allowed = []
    for seg in segments:
        allowed.append(
            [
                k
                for k, o in enumerate(seg)
                if objective != "eager_whole" or o.name in ("eager", "snapshot")
            ]
        )

    def charged_total(chosen):
        if objective == "state_agnostic":  # blind to preserved bytes
            return sum(o.retained - o.preserved for o in chosen)
        # The journal's shared log is held once: its largest part.
        journal = [o.preserved for o in chosen if o.name == "journal"]
        return sum(o.retained for o in chosen) - sum(journal) + max(journal, default=0)

    min_budget = None
    best = None
    best_key = None
    # itertools.product walks the positions lexicographically (segment 0 first).
    for combo in itertools.product(*allowed):
        chosen = [seg[k] for seg, k in zip(segments, combo, strict=True)]
        retained = charged_total(chosen)
        transient = max((o.transient for o in chosen), default=0)
        total = 0.0
        for o in chosen:
            total += o.time
        peak = persistent + retained + transient
        min_budget = peak if min_budget is None else min(min_budget, peak)
        if peak <= budget and (best_key is None or (total, peak) < best_key):
            best, best_key = list(combo), (total, peak)
    return min_budget, best


def true_totals(segments, positions, persistent):
    chosen = [seg[k] for seg, k in zip(segments, positions, strict=True)]
    journal = [o.preserved for o in chosen if o.name == "journal"]
    retained = sum(o.retained for o in chosen) - sum(journal) + max(journal, default=0)
    transient = max((o.transient for o in chosen), default=0)
    total = 0.0
    for o in chosen:
        total += o.time
    return total, persistent + retained + transient


# ---------------------------------------------------------------------------
# hypothesis instances
# ---------------------------------------------------------------------------

exact_times = st.one_of(
    st.integers(0, 6).map(float),  # many exact ties
    st.integers(0, 512).map(lambda k: k / 64),  # dyadic: exact sums
)
any_times = st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False)


@st.composite
def instances(draw, times=exact_times, max_segments=5, max_bytes=24):
    n = draw(st.integers(0, max_segments))
    segments = []
    for _ in range(n):
        names = draw(st.lists(st.sampled_from(OPTION_NAMES), min_size=1, max_size=5, unique=True))
        seg = []
        for name in names:
            retained = draw(st.integers(0, max_bytes))
            preserved = 0 if name == "eager" else draw(st.integers(0, retained))
            seg.append(
                Option(
                    name,
                    retained=retained,
                    transient=draw(st.integers(0, max_bytes)),
                    time=draw(times),
                    preserved=preserved,
                )
            )
        segments.append(seg)
    persistent = draw(st.integers(0, 4))
    low = persistent + sum(min(o.retained - o.preserved for o in seg) for seg in segments)
    high = (
        persistent
        + sum(max(o.retained for o in seg) for seg in segments)
        + max((o.transient for seg in segments for o in seg), default=0)
    )
    budget = draw(st.integers(max(0, low - 2), high + 2))
    objective = draw(st.sampled_from(OBJECTIVES))
    return segments, persistent, budget, objective


def check_against_brute_force(segments, persistent, budget, objective, check_choices):
    usable = all(
        objective != "eager_whole" or any(o.name in ("eager", "snapshot") for o in seg)
        for seg in segments
    )
    if not usable:
        with pytest.raises(ValueError, match="eager_whole"):
            plan(segments, budget=budget, persistent=persistent, objective=objective)
        return
    min_budget, best = brute_force(segments, budget, persistent, objective)
    if best is None:
        with pytest.raises(InfeasibleBudgetError) as info:
            plan(segments, budget=budget, persistent=persistent, objective=objective)
        assert info.value.min_budget == min_budget
        assert isinstance(info.value, ReplayError)
        return
    got = plan(segments, budget=budget, persistent=persistent, objective=objective)
    want_time, want_peak = true_totals(segments, best, persistent)
    got_time, got_peak = true_totals(segments, got.indices, persistent)
    assert got.min_budget == min_budget
    assert (got.time, got.peak) == (got_time, got_peak)
    assert got.time == want_time
    assert got.predicted.peak <= budget
    if objective == "state_agnostic":
        # Its charged peak is optimal; the true peak may overshoot.
        assert got.peak >= got.predicted.peak
        assert got.overshoot == max(0, got.peak - budget)
    else:
        assert got.peak == got.predicted.peak == want_peak
        assert got.fits
    if objective == "eager_whole":
        assert set(got.choices) <= {"eager", "snapshot"}
    if check_choices:
        assert got.indices == best
    assert got.choices == [seg[k].name for seg, k in zip(segments, got.indices, strict=True)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_matches_brute_force_exact_times(instance):
    segments, persistent, budget, objective = instance
    check_against_brute_force(segments, persistent, budget, objective, check_choices=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(times=any_times))
def test_matches_brute_force_any_times(instance):
    # Time and peak are exact for any doubles; the tie rule is only promised
    # for exactly summing times (module docstring).
    segments, persistent, budget, objective = instance
    check_against_brute_force(segments, persistent, budget, objective, check_choices=False)


@slow
@settings(max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_segments=6, max_bytes=60))
def test_matches_brute_force_many(instance):
    segments, persistent, budget, objective = instance
    check_against_brute_force(segments, persistent, budget, objective, check_choices=True)


def test_seeded_random_instances_match_brute_force():
    # A fixed seeded sweep (independent of hypothesis' database): 2,000
    # instances x the three objectives.
    rng = random.Random(1234)
    for _ in range(2000):
        segments = []
        for _ in range(rng.randint(1, 5)):
            names = rng.sample(OPTION_NAMES, rng.randint(1, 5))
            seg = []
            for name in names:
                retained = rng.randint(0, 20)
                seg.append(
                    Option(
                        name,
                        retained=retained,
                        transient=rng.randint(0, 20),
                        time=rng.randint(0, 40) / 8,
                        preserved=0 if name == "eager" else rng.randint(0, retained),
                    )
                )
            segments.append(seg)
        persistent = rng.randint(0, 3)
        budget = rng.randint(persistent, persistent + 60)
        for objective in OBJECTIVES:
            check_against_brute_force(segments, persistent, budget, objective, check_choices=True)


# ---------------------------------------------------------------------------
# Integer program cross-check (HiGHS)
# ---------------------------------------------------------------------------


def engine_like_instance(rng, n):
    """Costs shaped like the engines': bytes are whole MiB."""
    segments = []
    for _ in range(n):
        act = rng.randint(64, 256)
        inputs = rng.randint(4, 16)
        buf = rng.randint(32, 128)
        journal = max(1, int(buf * rng.uniform(0.01, 0.2)))
        f = rng.uniform(0.5, 1.5)
        seg = [
            Option("eager", retained=act * MiB, transient=0, time=0.0),
            Option(
                "snapshot",
                retained=(inputs + buf) * MiB,
                transient=act * MiB,
                time=f + rng.uniform(0, 0.1),
                preserved=buf * MiB,
            ),
            Option(
                "journal",
                retained=(inputs + journal) * MiB,
                transient=(act + journal) * MiB,
                time=f * rng.uniform(1.1, 1.4),
                preserved=journal * MiB,
            ),
            Option(
                "readset",
                retained=(inputs + buf // 2) * MiB,
                transient=act * MiB,
                time=f * rng.uniform(1.05, 1.15),
                preserved=(buf // 2) * MiB,
            ),
            Option(
                "guard",
                retained=inputs * MiB,
                transient=act * MiB,
                time=f * rng.uniform(1.02, 1.07),
            ),
        ]
        segments.append(seg)
    return segments


def solve_integer_program(highspy, segments, budget, persistent):
    """min sum c x  s.t. one option per segment, T >= q_i(x), sum r x + T <= M - P.

    Bytes are given to HiGHS in MiB (all whole), so its feasibility
    tolerance cannot admit a plan over the budget. Returns the optimal time,
    or None when the program is infeasible.
    """
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    t = h.addVariable(lb=0.0)
    x = [[h.addBinary() for _ in seg] for seg in segments]
    for seg, xs in zip(segments, x, strict=True):
        h.addConstr(sum(xs) == 1)
        h.addConstr(t >= sum((o.transient // MiB) * v for o, v in zip(seg, xs, strict=True)))
    # The journal's shared log: each journal option pays retained - preserved, and
    # the log is paid once, as its largest part (j >= preserved of every chosen one).
    j = h.addVariable(lb=0.0)
    for seg, xs in zip(segments, x, strict=True):
        for o, v in zip(seg, xs, strict=True):
            if o.name == "journal":
                h.addConstr(j >= (o.preserved // MiB) * v)
    retained = sum(
        ((o.retained - (o.preserved if o.name == "journal" else 0)) // MiB) * v
        for seg, xs in zip(segments, x, strict=True)
        for o, v in zip(seg, xs, strict=True)
    )
    h.addConstr(retained + j + t <= (budget - persistent) / MiB)
    h.minimize(
        sum(
            o.time * v
            for seg, xs in zip(segments, x, strict=True)
            for o, v in zip(seg, xs, strict=True)
        )
    )
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    assert status == highspy.HighsModelStatus.kOptimal, h.modelStatusToString(status)
    return h.getInfo().objective_function_value


def check_against_integer_program(highspy, rng, n):
    segments = engine_like_instance(rng, n)
    persistent = rng.randint(0, 512) * MiB
    eager = persistent + sum(seg[0].retained for seg in segments)
    try:  # the least budget with a plan (the planner's own figure, checked below)
        floor = plan(segments, budget=0, persistent=persistent).peak
    except InfeasibleBudgetError as least:
        floor = least.min_budget
    budget = rng.randint(floor // MiB - 8, eager // MiB + 8) * MiB
    want = solve_integer_program(highspy, segments, budget, persistent)
    if want is None:
        with pytest.raises(InfeasibleBudgetError) as info:
            plan(segments, budget=budget, persistent=persistent)
        assert info.value.min_budget == floor > budget
        return False
    got = plan(segments, budget=budget, persistent=persistent)
    assert got.fits
    assert got.time == pytest.approx(want, rel=1e-9, abs=1e-9)
    return True


def test_matches_integer_program_on_medium_instances():
    highspy = pytest.importorskip(
        "highspy", reason="the integer-program cross-check needs highspy (requirements-dev.txt)"
    )
    rng = random.Random(2024)
    feasible = sum(
        check_against_integer_program(highspy, rng, rng.randint(16, 40)) for _ in range(40)
    )
    assert feasible >= 30


@slow
def test_matches_integer_program_many():
    highspy = pytest.importorskip(
        "highspy", reason="the integer-program cross-check needs highspy (requirements-dev.txt)"
    )
    rng = random.Random(7)
    for _ in range(300):
        check_against_integer_program(highspy, rng, rng.randint(16, 64))


# ---------------------------------------------------------------------------
# Where summed-memory dominance is wrong (Note [Planner dominance])
# ---------------------------------------------------------------------------

# P = 0, budget 10:
#
#   segment 0   a (r 0, q 8, c 0)    b (r 4, q 0, c 0)
#   segment 1   x (r 0, q 8, c 0)    y (r 0, q 0, c 10)
#
# a+x has peak 8 and time 0. On summed memory b (4) "dominates" a (8) at
# equal time, and b's best completion b+y takes time 10.
SUMMED_WRONG = [
    [(0, 8, 0.0), (4, 0, 0.0)],
    [(0, 8, 0.0), (0, 0, 10.0)],
]


def test_summed_memory_pruning_loses_the_optimum():
    core = _core().ParetoPlanner(SUMMED_WRONG, 0)
    exact = core.solve(10)
    assert (exact.feasible, list(exact.choices), exact.time) == (True, [0, 0], 0.0)
    summed = core.solve(10, dominance="summed_memory", time_bound=False)
    assert (summed.feasible, list(summed.choices), summed.time) == (True, [1, 1], 10.0)


def test_summed_memory_pruning_loses_feasibility():
    # As above but y = (r 7, q 0): b+x peaks at 12, b+y at 11, only a+x (8) fits.
    core = _core().ParetoPlanner([[(0, 8, 0.0), (4, 0, 0.0)], [(0, 8, 0.0), (7, 0, 0.0)]], 0)
    assert core.solve(10).feasible
    assert not core.solve(10, dominance="summed_memory", time_bound=False).feasible


def test_summed_memory_instance_through_the_api():
    segments = [
        [
            Option("eager", retained=0, transient=8, time=0.0),
            Option("snapshot", retained=4, transient=0, time=0.0, preserved=4),
        ],
        [
            Option("eager", retained=0, transient=8, time=0.0),
            Option("guard", retained=0, transient=0, time=10.0),
        ],
    ]
    got = plan(segments, budget=10)
    assert got.choices == ["eager", "eager"]
    assert (got.time, got.peak, got.retained, got.transient) == (0.0, 8, 0, 8)


def test_summed_memory_fails_on_random_instances():
    rng = random.Random(5)
    wrong = 0
    for _ in range(3000):
        segs = [
            [
                (rng.randint(0, 10), rng.randint(0, 10), float(rng.randint(0, 5)))
                for _ in range(rng.randint(1, 4))
            ]
            for _ in range(rng.randint(2, 5))
        ]
        core = _core().ParetoPlanner(segs, 0)
        budget = rng.randint(core.min_budget, core.min_budget + 20)
        exact = core.solve(budget)
        summed = core.solve(budget, dominance="summed_memory", time_bound=False)
        assert exact.feasible
        wrong += (not summed.feasible) or summed.time != exact.time
    assert wrong > 0


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


def test_large_instance_runs():
    rng = random.Random(3)
    segments = engine_like_instance(rng, 64)
    floor = (
        _core()
        .ParetoPlanner([[(o.retained, o.transient, o.time) for o in seg] for seg in segments], 0)
        .min_budget
    )
    eager = sum(seg[0].retained for seg in segments)
    got = plan(segments, budget=(floor + eager) // 2)
    assert got.fits and len(got.choices) == 64
