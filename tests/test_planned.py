"""PlannedSequential: plans from measured costs, runs them, gradients bitwise equal to eager."""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_replay as tr
from torch_replay import calibrate as cal
from torch_replay.planned import LiveBytesTracker, PlannedSequential, static_bytes

ENGINES = ["snapshot", "journal", "readset"]


def workload(seed=0, **kw):
    args = dict(segments=4, queue_mib=0.5, write_ratio=0.01, batch=16, width=64, wide=16, narrow=2)
    args.update(kw)
    return cal.queue_workload(seed=seed, **args)


def step(model, w):
    x = w.make_input()
    out = model(x)
    out.pow(2).mean().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    return out.detach(), grads, [t.clone() for t in w.state]


def reference(**kw):
    w = workload(**kw)
    return step(PlannedSequential(w.segments, state=w.state, choices=["eager"] * 4), w)


@pytest.fixture(scope="module")
def costs():
    w = workload()
    res = cal.measure_segments(w, ["eager", "snapshot", "journal", "readset"], reps=1, warmup=0)
    return [[tr.Option(**o) for o in seg] for seg in res["segments"]], res["persistent"]


def explicit_peak(chosen, persistent):
    """The peak of one option per segment, written out: persistent + retained (the
    journal's shared log counted once, as its largest part) + the largest transient."""
    logs = [o.preserved for o in chosen if o.name == "journal"]
    retained = sum(o.retained for o in chosen) - sum(logs) + max(logs, default=0)
    return persistent + retained + max(o.transient for o in chosen)


def brute_force_time(opts, persistent, budget):
    """Least summed time (segment order) over every plan whose explicit peak fits."""
    fits = [
        sum(o.time for o in combo)
        for combo in itertools.product(*opts)
        if explicit_peak(combo, persistent) <= budget
    ]
    return min(fits) if fits else None


def independent_persistent(w):
    """Distinct storages of the parameters, buffers and declared state, plus one
    gradient per parameter that requires grad (counted here, not by the model)."""
    params = [p for m in w.segments for p in m.parameters()]
    tensors = params + [b for m in w.segments for b in m.buffers()] + list(w.state)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return sum(storages.values()) + grads


def chosen_options(opts, choices):
    return [next(o for o in seg if o.name == c) for seg, c in zip(opts, choices, strict=True)]


def assert_bitwise(a, b):
    out_a, grads_a, state_a = a
    out_b, grads_b, state_b = b
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b)
    for x, y in zip(grads_a, grads_b, strict=True):
        assert torch.equal(x, y)
    for x, y in zip(state_a, state_b, strict=True):
        assert torch.equal(x, y)  # the buffer ends as eager left it (replays are invisible)


@pytest.mark.parametrize(
    "choices",
    [[e] * 4 for e in ENGINES]
    + [["eager", "journal", "snapshot", "readset"], ["journal", "eager", "journal", "eager"]],
)
def test_gradients_bitwise_equal_to_eager(choices):
    ref = reference()
    w = workload()
    got = step(PlannedSequential(w.segments, state=w.state, choices=choices), w)
    assert_bitwise(ref, got)


def test_planned_model_gradients_and_plan(costs):
    opts, persistent = costs
    eager_peak = persistent + sum(s[0].retained for s in opts) + max(s[0].transient for s in opts)
    joint_min = tr.plan(opts, budget=10**12, persistent=persistent).min_budget
    budget = (joint_min + eager_peak) // 2
    w = workload()
    model = PlannedSequential(w.segments, state=w.state, costs=opts, budget=budget)
    assert model.plan is not None and model.plan.fits
    # The plan is optimal: its time is the least over all 4^4 plans that fit (brute
    # force, peak written out), and its own peak fits.
    chosen = chosen_options(opts, model.choices)
    assert explicit_peak(chosen, persistent) <= budget
    assert sum(o.time for o in chosen) == pytest.approx(
        brute_force_time(opts, persistent, budget), rel=1e-12
    )
    assert model.persistent == persistent == independent_persistent(w)
    assert set(model.choices) != {"eager"}  # the budget forces recomputation somewhere
    assert_bitwise(reference(), step(model, w))


def test_predicted_peak_bounds_measured(costs):
    opts, persistent = costs
    for budget_share in (0.0, 0.5, 1.0):
        eager_peak = (
            persistent + sum(s[0].retained for s in opts) + max(s[0].transient for s in opts)
        )
        joint_min = tr.plan(opts, budget=10**12, persistent=persistent).min_budget
        budget = int(joint_min + budget_share * (eager_peak - joint_min))
        w = workload()
        model = PlannedSequential(w.segments, state=w.state, costs=opts, budget=budget)
        report = model.measure(w.make_input())
        predicted = explicit_peak(chosen_options(opts, model.choices), persistent)
        assert report.predicted_peak == predicted <= budget
        assert report.measured_peak > report.static_bytes
        # the static model is conservative here: it charges a journal segment the whole
        # log since it began, and counts a segment's output in its retained bytes
        assert report.predicted_peak >= report.measured_peak, (model.choices, report)
        assert [s.engine for s in report.segments] == model.choices


def test_fixed_choices_report_predicted_peak(costs):
    opts, _ = costs
    w = workload()
    model = PlannedSequential(w.segments, state=w.state, costs=opts, choices=["journal"] * 4)
    assert model.plan is None
    journal = [s[2] for s in opts]
    assert all(o.name == "journal" for o in journal)
    # Each segment's own retained bytes, the shared log once (its largest part: the
    # log kept from the first segment's start holds every later one's).
    logs = [o.preserved for o in journal]
    assert logs[0] == max(logs)
    assert model.predicted_peak == (
        model.persistent
        + sum(o.retained - o.preserved for o in journal)
        + logs[0]
        + max(o.transient for o in journal)
    )
    assert "journal" in repr(model)


def test_infeasible_budget(costs):
    opts, persistent = costs
    w = workload()
    with pytest.raises(tr.InfeasibleBudgetError) as info:
        PlannedSequential(w.segments, state=w.state, costs=opts, budget=persistent)
    m = info.value.min_budget
    assert m > persistent
    PlannedSequential(w.segments, state=w.state, costs=opts, budget=m)  # the named budget works
    with pytest.raises(tr.InfeasibleBudgetError):
        PlannedSequential(w.segments, state=w.state, costs=opts, budget=m - 1)


def test_eager_whole_infeasible_where_joint_fits(costs):
    opts, persistent = costs
    joint_min = tr.plan(opts, budget=10**12, persistent=persistent).min_budget
    w = workload()
    with pytest.raises(tr.InfeasibleBudgetError):
        PlannedSequential(
            w.segments, state=w.state, costs=opts, budget=joint_min, objective="eager_whole"
        )


def test_state_agnostic_overshoot_is_reported(costs):
    opts, persistent = costs
    joint_min = tr.plan(opts, budget=10**12, persistent=persistent).min_budget
    w = workload()
    model = PlannedSequential(
        w.segments, state=w.state, costs=opts, budget=joint_min, objective="state_agnostic"
    )
    assert model.plan.peak >= model.plan.predicted.peak
    assert model.plan.overshoot == max(0, model.plan.peak - joint_min)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"choices": ["eager"] * 3}, ValueError, "3 choices for 4"),
        ({"choices": ["eager", "eager", "eager", "lazy"]}, ValueError, "unknown option"),
        ({}, ValueError, "give budget= and costs="),
        (
            {"budget": 1, "costs": [[tr.Option("eager", retained=1, transient=0, time=1.0)]]},
            ValueError,
            "describe 1 segments",
        ),
        ({"choices": ["eager"] * 4, "objective": "fast"}, ValueError, "objective"),
        ({"budget": 1, "costs": 3}, TypeError, "costs must be"),
    ],
)
def test_argument_errors(kwargs, error, message):
    w = workload()
    with pytest.raises(error, match=message):
        PlannedSequential(w.segments, state=w.state, **kwargs)


def test_per_segment_state():
    w = workload()
    buf = w.state[0]
    state = [[buf], [buf], [buf], None]
    model = PlannedSequential(w.segments, state=state, choices=["journal"] * 3 + ["eager"])
    assert_bitwise(reference(), step(model, w))


def test_costs_from_calibration_json(tmp_path):
    w = workload(segments=2)
    res = cal.measure_segments(w, ["eager", "journal"], reps=1, warmup=0)
    doc = {"schema": cal.SCHEMA, "model": res}
    model = PlannedSequential(w.segments, state=w.state, costs=doc, budget=10**12)
    # The file's options are the measured ones, and with room for everything the plan
    # is the least-time one (brute force over the 2 x 2 plans).
    measured = [[tr.Option(**o) for o in seg] for seg in res["segments"]]
    assert model.costs == measured
    chosen = chosen_options(measured, model.choices)
    assert sum(o.time for o in chosen) == brute_force_time(measured, res["persistent"], 10**12)


def test_tracker_counts_new_storages_only():
    a = torch.zeros(1024)
    with LiveBytesTracker() as t:
        b = a + 1  # new: 4 KiB
        a.add_(1)  # in place: not new
        v = b.view(32, 32)  # view: not new
        peak_with_b = t.live
        del b, v
    assert peak_with_b == 4096
    assert t.live == 0 and t.peak == 4096
    assert static_bytes([a, a[:10], a.view(2, 512)]) == 4096


def test_reentrant_segments_bitwise_equal_to_eager():
    w = workload()
    model = PlannedSequential(
        w.segments,
        state=w.state,
        choices=["eager", "journal", "snapshot", "readset"],
        use_reentrant=True,
    )
    assert_bitwise(reference(), step(model, w))
