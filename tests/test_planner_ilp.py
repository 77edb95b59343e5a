"""The joint planner against an integer program solved by HiGHS, on medium instances
whose costs are shaped like the engines' (and one large instance that must run).

Set TORCH_REPLAY_SLOW=1 for the larger opt-in run (``@pytest.mark.slow``).
"""

from __future__ import annotations

import random

import pytest

from benchmarks.bench_planner import engine_segments
from torch_replay.errors import InfeasibleBudgetError
from torch_replay.planner import plan

from .reference import planner_core as _core
from .reference import slow

MiB = 1 << 20


# ---------------------------------------------------------------------------
# Integer program cross-check (HiGHS)
# ---------------------------------------------------------------------------


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
    segments = engine_segments(rng, n, time_unit=1.0)
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


def test_large_instance_runs():
    rng = random.Random(3)
    segments = engine_segments(rng, 64, time_unit=1.0)
    floor = (
        _core()
        .ParetoPlanner([[(o.retained, o.transient, o.time) for o in seg] for seg in segments], 0)
        .min_budget
    )
    eager = sum(seg[0].retained for seg in segments)
    got = plan(segments, budget=(floor + eager) // 2)
    assert got.fits and len(got.choices) == 64
