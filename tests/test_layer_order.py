"""The ordered layer planner (``torch_replay._planning.layer_order``, Note [Ordered layer peak] in
``csrc/core/ordered_planner.h``) against every choice enumerated, with the peak written
term by term, and against the quadratic dynamic program it replaces (frontier sizes,
states generated and the plan returned, bit for bit)."""

from __future__ import annotations

import itertools
import random

import pytest

import torch_replay as tr
from torch_replay._planning.layer_order import ordered_peak, plan_ordered


def _formula_peak(chosen, grads, *, persistent=0, floor=0, head=0):
    """Note [Ordered layer peak]'s formula, each term summed on its own."""
    n = len(chosen)
    terms = [floor, head + sum(o.retained for o in chosen)]
    for i in range(n):
        kept = sum(chosen[j].retained for j in range(i + 1))
        terms.append(kept + chosen[i].transient + sum(grads[i + 1 :]))
    return persistent + max(terms)


def _quadratic_dp(options, grads, *, budget, persistent=0, floor=0, head=0):
    """The Pareto DP with the quadratic filter (the planner's Python version before it
    moved to C++): (path, time, peak, frontier sizes, states generated) or None."""
    after = [sum(grads[i + 1 :]) for i in range(len(grads))]
    room = budget - persistent
    states, sizes, generated = [(0, floor, 0.0, ())], [], 0
    for i, (seg, a) in enumerate(zip(options, after, strict=True)):
        grown = [
            (h + o.retained, max(t, h + o.retained + o.transient + a), c + o.time, (*p, k))
            for h, t, c, p in states
            for k, o in enumerate(seg)
            if max(t, h + o.retained + o.transient + a) <= room and h + o.retained + head <= room
        ]
        generated += len(grown)
        if i == len(options) - 1:
            grown = [(h, max(t, h + head), c, p) for h, t, c, p in grown]
        grown.sort()
        states = []
        for s in grown:
            if not any(k[1] <= s[1] and k[2] <= s[2] for k in states):
                states.append(s)
        sizes.append(len(states))
    if not states:
        return None
    _, top, c, path = min(states, key=lambda s: (s[2], s[1], s[3]))
    return list(path), c, persistent + top, sizes, generated


def _instance(rng, n, time=lambda rng: rng.randint(2, 6)):
    options = [
        [tr.Option("eager", retained=rng.randint(5, 40), transient=rng.randint(1, 9), time=1)]
        + [
            tr.Option(name, retained=rng.randint(0, 6), transient=rng.randint(5, 50),
                      time=time(rng))
            for name in rng.sample(["snapshot", "journal", "guard"], rng.randint(1, 2))
        ]
        for _ in range(n)
    ]  # fmt: skip
    grads = [rng.randint(0, 12) for _ in range(n)]
    kw = dict(persistent=rng.randint(0, 20), floor=rng.randint(0, 30), head=rng.randint(0, 9))
    return options, grads, kw


@pytest.mark.parametrize("times", ["integers", "quarters"])
def test_ordered_planner_is_the_brute_force_optimum(times):
    """The least time among the choices whose ordered peak fits, the lowest such peak
    among those, and the smallest budget; integer and quarter-step times (exact sums, so
    ties in time are real ties)."""
    rng = random.Random(7)
    step = (lambda r: r.randint(2, 6)) if times == "integers" else (lambda r: r.randint(4, 24) / 4)
    for _ in range(60):
        options, grads, kw = _instance(rng, rng.randint(1, 5), step)
        every = [
            (sum(o.time for o in c), _formula_peak(c, grads, **kw))
            for c in itertools.product(*options)
        ]
        smallest = min(p for _, p in every)
        for budget in (smallest - 1, smallest, smallest + rng.randint(0, 60)):
            fits = [(t, p) for t, p in every if p <= budget]
            if not fits:
                with pytest.raises(tr.InfeasibleBudgetError) as e:
                    plan_ordered(options, grads, budget=budget, **kw)
                assert e.value.min_budget == smallest
                continue
            got = plan_ordered(options, grads, budget=budget, **kw)
            assert (got.time, got.peak) == min(fits)
            assert got.peak == _formula_peak(got.options, grads, **kw)
            assert got.peak == ordered_peak(got.options, grads, **kw)
            assert got.min_budget == smallest
            assert got.retained == sum(o.retained for o in got.options)
            assert got.transient == max(o.transient for o in got.options)
            assert got.options == [seg[k] for seg, k in zip(options, got.indices, strict=True)]


def test_ordered_planner_is_the_quadratic_dp_bit_for_bit():
    """Same plan, frontier sizes and states generated as the quadratic filter, on
    instances large enough for real frontiers (12 layers, real-valued times)."""
    rng = random.Random(3)
    for _ in range(30):
        options, grads, kw = _instance(rng, 12, lambda r: r.uniform(1, 6))
        budget = kw["persistent"] + rng.randint(60, 200)
        want = _quadratic_dp(options, grads, budget=budget, **kw)
        if want is None:
            with pytest.raises(tr.InfeasibleBudgetError):
                plan_ordered(options, grads, budget=budget, **kw)
            continue
        got = plan_ordered(options, grads, budget=budget, **kw)
        assert (got.indices, got.time, got.peak) == want[:3]
        assert got.frontier_sizes == want[3]
        assert got.stats.states_generated == want[4]


def test_ordered_peak_is_the_formula():
    rng = random.Random(5)
    for _ in range(100):
        n = rng.randint(0, 6)
        chosen = [
            tr.Option("eager", retained=rng.randint(0, 50), transient=rng.randint(0, 50), time=1)
            for _ in range(n)
        ]
        grads = [rng.randint(0, 20) for _ in range(n)]
        kw = dict(persistent=rng.randint(0, 9), floor=rng.randint(0, 80), head=rng.randint(0, 30))
        assert ordered_peak(chosen, grads, **kw) == _formula_peak(chosen, grads, **kw)


def test_no_layer_holds_the_floor_and_the_head():
    """Without layers the peak is still persistent + max(floor, head), and a budget below
    it has no plan."""
    with pytest.raises(tr.InfeasibleBudgetError) as e:
        plan_ordered([], [], budget=12, persistent=5, floor=3, head=8)
    assert e.value.min_budget == 13
    plan = plan_ordered([], [], budget=13, persistent=5, floor=3, head=8)
    assert (plan.peak, plan.choices) == (13, [])


def test_bad_sizes_are_refused():
    eager = [tr.Option("eager", retained=4, transient=1, time=1)]
    with pytest.raises(ValueError, match="gradient sizes"):
        plan_ordered([eager], [], budget=100)
    with pytest.raises(ValueError, match="gradient bytes"):
        plan_ordered([eager], [-1], budget=100)
    with pytest.raises(ValueError, match="floor bytes"):
        plan_ordered([eager], [0], budget=100, floor=-1)
    with pytest.raises(ValueError, match="gradients"):
        ordered_peak(eager, [0, 0])
