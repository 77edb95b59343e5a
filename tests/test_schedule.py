"""Tests of torch_replay.schedule against an independent brute force.

The references here (live-interval peak, enumeration of every topological
order, conditional events by enumerating every unit subset) share no code with
the C++ core.
"""

from __future__ import annotations

import itertools
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_bounds import buffer_dag
from torch_replay import schedule

SLOW = os.environ.get("TORCH_REPLAY_SLOW", "0") == "1"


# ---------------------------------------------------------------- references


def interval_peak(spec: dict, order: list[int]) -> int:
    """Peak of ``order`` from each buffer's live interval of steps."""
    n = spec["num_units"]
    pos = {u: i for i, u in enumerate(order)}
    steps = [0] * n
    for b, size in enumerate(spec["sizes"]):
        p = spec["producer"][b]
        first = 0 if p < 0 else pos[p]
        last = -1 if p < 0 else first
        for c in spec["consumers"][b]:
            last = max(last, pos[c])
        if b in spec["outputs"]:
            last = n - 1
        for i in range(first, last + 1):
            steps[i] += size
    return max(steps, default=0)


def predecessors(spec: dict) -> list[set[int]]:
    preds: list[set[int]] = [set() for _ in range(spec["num_units"])]
    for b, p in enumerate(spec["producer"]):
        for c in spec["consumers"][b]:
            if p >= 0:
                preds[c].add(p)
    for u, v in spec.get("extra_edges", []):
        preds[v].add(u)
    return preds


def topological_orders(spec: dict):
    preds = predecessors(spec)
    n = spec["num_units"]
    for perm in itertools.permutations(range(n)):
        seen: set[int] = set()
        ok = True
        for u in perm:
            if not preds[u] <= seen:
                ok = False
                break
            seen.add(u)
        if ok:
            yield list(perm)


def brute_optimum(spec: dict) -> int:
    return min(interval_peak(spec, o) for o in topological_orders(spec))


def closure(preds: list[set[int]], units) -> set[int]:
    out: set[int] = set()
    stack = list(units)
    while stack:
        u = stack.pop()
        if u not in out:
            out.add(u)
            stack.extend(preds[u])
    return out


def step_cost(spec: dict, s: set[int], u: int) -> int:
    """Live bytes while u runs with exactly the units of s done."""
    live = 0
    for b, size in enumerate(spec["sizes"]):
        p = spec["producer"][b]
        if p == u:
            live += size
        elif p < 0 or p in s:
            cons = spec["consumers"][b]
            if b in spec["outputs"] or any(c not in s for c in cons):
                live += size
    return live


def succs_of(spec: dict, u: int) -> list[int]:
    return [v for v, ps in enumerate(predecessors(spec)) if u in ps]


def brute_event(spec: dict, u: int, done=(), not_done=()) -> float:
    """min over downsets S (u runnable from S, done in S, not_done not in S)
    of the live bytes while u runs from S."""
    n = spec["num_units"]
    preds = predecessors(spec)
    best = float("inf")
    for mask in range(1 << n):
        s = {v for v in range(n) if mask >> v & 1}
        if u in s or not preds[u] <= s or any(not preds[v] <= s for v in s):
            continue
        if not set(done) <= s or set(not_done) & s:
            continue
        best = min(best, step_cost(spec, s, u))
    return best


def brute_bounds(spec: dict) -> dict[str, float]:
    n = spec["num_units"]
    preds = predecessors(spec)
    anc = [closure(preds, preds[u]) for u in range(n)]
    ec = max((brute_event(spec, u) for u in range(n)), default=0)
    f = r = j = ec
    for u, v in itertools.combinations(range(n), 2):
        if u in anc[v] or v in anc[u]:
            continue
        d_uv, d_vu = brute_event(spec, u, done=[v]), brute_event(spec, v, done=[u])
        n_uv, n_vu = brute_event(spec, u, not_done=[v]), brute_event(spec, v, not_done=[u])
        f = max(f, min(d_uv, d_vu))
        r = max(r, min(n_uv, n_vu))
        j = max(j, min(max(n_uv, d_vu), max(n_vu, d_uv)))
    # The last unit runs with every other unit done; the first from nothing.
    last = min(
        (step_cost(spec, set(range(n)) - {u}, u) for u in range(n) if not succs_of(spec, u)),
        default=0,
    )
    first = min((step_cost(spec, set(), u) for u in range(n) if not preds[u]), default=0)
    end = max(first, last)
    return {
        "event_cut": ec,
        "forward_trap": f,
        "reverse_trap": r,
        "joint_trap": j,
        "end_steps": end,
    }


# ---------------------------------------------------------------- instances


@st.composite
def problems(draw, max_units: int = 7, max_size: int = 30):
    """The benchmark's buffer model (``buffer_dag``) on 1 to ``max_units`` units, sizes
    from 0, every draw made by Hypothesis (so a failing problem shrinks)."""
    n = draw(st.integers(1, max_units))
    rng = draw(st.randoms(use_true_random=False))
    return buffer_dag(rng, n, max_size=max_size, min_size=0)


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _five_units(sizes: list[int], producer: list[int], consumers: list[list[int]]) -> dict:
    """A hand-made problem of five units and no outputs."""
    return dict(sizes=sizes, producer=producer, consumers=consumers, outputs=[], num_units=5)


def two_hills() -> dict:
    # [0] -10-> [1] -1-> [4] <-1- [3] <-10- [2]
    return _five_units([10, 1, 10, 1], [0, 1, 2, 3], [[1], [4], [3], [4]])


def fork() -> dict:
    # [1] <-1- [0] -1-> [3];  [1] -10-> [2];  [3] -10-> [4]
    return _five_units([1, 1, 10, 10], [0, 0, 1, 3], [[1], [3], [2], [4]])


# ---------------------------------------------------------------- examples


def test_two_hills_forward_trap_certifies():
    p = schedule.Problem(**two_hills())
    assert p.peak([0, 1, 2, 3, 4]) == 12
    assert p.step_costs([0, 1, 2, 3, 4]) == [10, 11, 11, 12, 2]
    assert p.lower_bounds() == {"event_cut": 11, "forward_trap": 12, "reverse_trap": 11}
    s = p.solve(time_limit_s=1.0)
    assert (s.peak, s.lower_bound, s.certified, s.optimal, s.gap) == (12, 12, True, True, 0)
    assert p.peak(s.order) == 12


def test_fork_reverse_trap_certifies():
    p = schedule.Problem(**fork())
    bounds = p.lower_bounds(extended=True)
    assert bounds == {
        "event_cut": 11,
        "forward_trap": 11,
        "reverse_trap": 12,
        "joint_trap": 12,
        "end_steps": 10,
    }
    assert p.solve().certified


def test_conditional_event():
    p = schedule.Problem(**two_hills())
    assert p.conditional_event(1) == 11
    assert p.conditional_event(1, done=[3]) == 12
    assert p.conditional_event(1, done=[4]) is None  # 4 needs 1 first
    with pytest.raises(ValueError):
        p.conditional_event(9)


def test_report_and_plan_unit_order():
    p = schedule.Problem(**two_hills())
    s = schedule.plan_unit_order(p, time_limit_s=0.5)
    report = s.report()
    assert report["original_peak"] == 12 and report["permuted_peak"] == 12
    assert report["certified"] is True
    assert set(report) >= {"event_cut", "forward_trap", "reverse_trap", "lower_bound", "gap"}


def test_empty_and_inferred_num_units():
    p = schedule.Problem(sizes=[5], producer=[-1], consumers=[[]], outputs=[0], num_units=0)
    assert p.peak([]) == 0
    assert p.lower_bounds() == {"event_cut": 0, "forward_trap": 0, "reverse_trap": 0}
    s = p.solve()
    assert s.order == [] and s.peak == 0 and s.certified
    q = schedule.Problem(sizes=[3, 4], producer=[-1, 2], consumers=[[2], []])
    assert q.num_units == 3


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(sizes=[-1, 1, 10, 1]), "negative"),
        (dict(producer=[0, 7, 2, 3]), "producer"),
        (dict(consumers=[[0], [4], [3], [4]]), "producer"),
        (dict(consumers=[[1], [9], [3], [4]]), "consumer"),
        (dict(outputs=[4]), "output"),
        (dict(extra_edges=[(4, 0)]), "cycle"),
        (dict(extra_edges=[(1, 1)]), "self-loop"),
        (dict(extra_edges=[(1, 2, 3)]), "pair"),
        (dict(sizes=[1, 1, 1]), "one entry per buffer"),
        (dict(num_units=-1), "num_units"),
    ],
)
def test_bad_problem_raises_value_error(change, match):
    spec = {**two_hills(), **change}
    with pytest.raises(ValueError, match=match):
        schedule.Problem(**spec)


@pytest.mark.parametrize(
    "change",
    [dict(sizes=[1.5, 1, 10, 1]), dict(sizes=[True, 1, 10, 1]), dict(producer="0123")],
)
def test_bad_types_raise_type_error(change):
    with pytest.raises(TypeError):
        schedule.Problem(**{**two_hills(), **change})


@pytest.mark.parametrize(
    "order, match",
    [
        ([1, 0, 2, 3, 4], "predecessor"),
        ([0, 1, 2, 3], "expected 5"),
        ([0, 1, 1, 3, 4], "twice"),
        ([0, 1, 2, 3, 9], "not a unit"),
    ],
)
def test_bad_order_raises_value_error(order, match):
    p = schedule.Problem(**two_hills())
    with pytest.raises(ValueError, match=match):
        p.peak(order)


def test_bad_time_limit():
    p = schedule.Problem(**two_hills())
    with pytest.raises(ValueError):
        p.solve(time_limit_s=-1)


def test_exhaustive_refuses_large_problems():
    n = schedule.MAX_EXHAUSTIVE_UNITS + 1
    p = schedule.Problem(sizes=[], producer=[], consumers=[], num_units=n)
    with pytest.raises(ValueError, match="at most"):
        p.exhaustive_optimum()


# ---------------------------------------------------------------- properties


@PROPERTY
@given(problems(), st.randoms(use_true_random=False))
def test_peak_matches_interval_simulation(spec, rnd):
    p = schedule.Problem(**spec)
    orders = list(itertools.islice(topological_orders(spec), 50))
    order = rnd.choice(orders)
    assert p.peak(order) == interval_peak(spec, order)


@PROPERTY
@given(problems())
def test_bounds_match_definitions_and_are_sound(spec):
    p = schedule.Problem(**spec)
    got = p.lower_bounds(extended=True)
    want = brute_bounds(spec)
    assert got == want
    opt = brute_optimum(spec)
    assert got["event_cut"] <= got["forward_trap"] <= got["joint_trap"] <= opt
    assert got["event_cut"] <= got["reverse_trap"] <= got["joint_trap"]
    assert got["end_steps"] <= opt


@PROPERTY
@given(problems())
def test_solve_and_exhaustive_find_the_optimum(spec):
    p = schedule.Problem(**spec)
    opt = brute_optimum(spec)
    peak, order = p.exhaustive_optimum()
    assert peak == opt and p.peak(order) == opt
    s = p.solve(time_limit_s=5.0)
    assert s.peak == opt and p.peak(s.order) == opt
    assert s.optimal and s.lower_bound == opt and not s.timed_out
    assert s.certified == (max(s.bounds.values()) == opt)


def test_traps_are_incomparable():
    rng = random.Random(3)
    f_wins = r_wins = 0
    for _ in range(300):
        spec = random_spec(rng, 7)
        b = schedule.Problem(**spec).lower_bounds()
        f_wins += b["forward_trap"] > b["reverse_trap"]
        r_wins += b["reverse_trap"] > b["forward_trap"]
    assert f_wins > 0 and r_wins > 0


def random_spec(rng: random.Random, max_units: int) -> dict:
    """A seeded random instance (same kind as the hypothesis strategy)."""
    n = rng.randint(1, max_units)
    label = list(range(n))
    rng.shuffle(label)
    sizes, producer, consumers, outputs = [], [], [], []
    for p in [-1] * rng.randint(0, 2) + [u for u in range(n) for _ in range(rng.randint(0, 2))]:
        later = list(range(p + 1, n))
        reads = [rng.choice(later) for _ in range(rng.randint(0, 3))] if later else []
        sizes.append(rng.randint(0, 30))
        producer.append(-1 if p < 0 else label[p])
        consumers.append([label[c] for c in reads])
        if rng.randint(0, 5) == 0:
            outputs.append(len(sizes) - 1)
    return dict(sizes=sizes, producer=producer, consumers=consumers, outputs=outputs, num_units=n)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="set TORCH_REPLAY_SLOW=1")
def test_solve_matches_exhaustive_on_larger_graphs():
    rng = random.Random(11)
    for _ in range(300):
        spec = random_spec(rng, 16)
        p = schedule.Problem(**spec)
        opt, _ = p.exhaustive_optimum()
        b = p.lower_bounds(extended=True)
        assert max(b.values()) <= opt
        s = p.solve(time_limit_s=10.0)
        assert s.peak == opt and s.optimal
