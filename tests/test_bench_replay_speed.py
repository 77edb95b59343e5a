"""benchmarks/bench_replay_speed.py's rows (benchmarks/lib/replay_steps.py): the do-nothing callbacks of Note [Observation
floor] change no result and are counted, and the Llama rows, which share one model, each
checkpoint with their own function."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as tcp

from torch_replay._ext import require_extension
from torch_replay._replay.segment import collect_transactions

C = require_extension()


def _grads(step_fn):
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Dropout(0.2))
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(1)
    step_fn(lin, x)
    return [p.grad.clone() for p in lin.parameters()] + [x.grad.clone()]


def test_floor_callbacks_change_no_gradient():
    from benchmarks.lib.replay_steps import floor_fn, watch_floor

    def plain(lin, x):
        tcp.checkpoint(lin, x, use_reentrant=False).pow(2).sum().backward()

    def floored(lin, x):
        watch_floor(
            lambda: tcp.checkpoint(floor_fn(lin), x, use_reentrant=False).pow(2).sum().backward()
        )()

    for a, b in zip(_grads(plain), _grads(floored), strict=True):
        assert torch.equal(a, b)
    assert C._floor_observer(False) == 0  # (both were put back)
    assert C._floor_watch(False) == 0


@pytest.mark.parametrize("switch", ["_floor_observer", "_floor_watch"])
def test_floor_switches_are_counted_and_ignore_a_stray_off(switch):
    f = getattr(C, switch)
    assert f(False) == 0  # stray: nothing registered, nothing removed
    assert [f(True), f(True), f(False), f(False), f(False)] == [1, 2, 1, 0, 0]


def test_the_floor_watch_outlives_a_real_watch():
    """A declared segment registers and removes the real write watch while the floor's
    stays registered: separate registrations."""
    import torch_replay as tr

    assert C._floor_watch(True) == 1
    try:
        lin = torch.nn.Linear(4, 4)
        x = torch.randn(2, 4, requires_grad=True)
        tr.checkpoint(lin, x, use_reentrant=False, state=[lin], engine="guard").sum().backward()
        assert x.grad is not None
    finally:
        assert C._floor_watch(False) == 0


def test_llama_rows_share_one_model_and_each_checkpoints_with_its_own_function():
    pytest.importorskip("transformers")
    from benchmarks.lib.replay_steps import AGAIN, FLOOR, FLOOR_SWITCH, llama_steps

    steps = llama_steps(16)
    # torch's variants (and its floors) run no torch_replay segment; each torch_replay
    # variant one per layer (4), with its engine, whichever variant ran before it.
    for name in (
        "torch",
        "enable(model), guard",
        AGAIN,
        "enable(model), snapshot",
        FLOOR,
        "enable(model), journal",
        FLOOR_SWITCH,
    ):
        with collect_transactions() as txns:
            steps[name]()
        if name.startswith("enable"):
            assert [t.engine for t in txns] == [name.split(", ")[1]] * 4, name
        else:
            assert txns == [], name


def test_perf_symbols_floor_variant_runs_torchs_checkpoint_under_the_floor():
    pytest.importorskip("transformers")
    from benchmarks.lib.replay_steps import llama_step

    step = llama_step(16, "floor")
    with collect_transactions() as txns:
        step()
    assert txns == []
    assert C._floor_observer(False) == 0  # (put back after each segment)
    assert C._floor_watch(False) == 0  # (and after the step)


def test_groups_option_runs_only_the_named_groups(monkeypatch):
    """A child given ``groups`` measures those groups and no other (the bytes kept and
    the heap setting are reported whatever the groups), and ``--groups`` refuses a name
    that is not a group."""
    from benchmarks import bench_replay_speed as brs

    measured = []
    monkeypatch.setattr(brs, "measure_rounds", lambda steps, rounds: measured.append(rounds) or {})
    monkeypatch.setattr(brs, "kept_bytes", lambda seq: {})
    res = brs.child(1, 16, ("segment",))
    assert sorted(res) == [
        "heap",
        "kept",
        "segment, use_reentrant=False",
        "segment, use_reentrant=True",
    ]
    assert measured == [1, 1]
    with pytest.raises(SystemExit):  # (argparse: a group that does not exist)
        brs.main(["--groups", "resnet"])


def test_other_floors_change_no_gradient_and_the_fallback_sees_every_operator():
    """The "floors" group's switches (benchmarks/observer_floors.cpp): torch's checkpoint
    under each gives eager's gradients, each switch is counted and put back, and the
    boxed fallback runs once for every operator the profiler's RecordFunction shows
    (an independent count of the dispatcher's calls)."""
    from benchmarks.lib.replay_steps import floor_fn, floors_extension, other_floors

    def plain(lin, x):
        tcp.checkpoint(lin, x, use_reentrant=False).pow(2).sum().backward()

    for name, switch in other_floors().items():

        def floored(lin, x, switch=switch):
            tcp.checkpoint(floor_fn(lin, switch), x, use_reentrant=False).pow(2).sum().backward()

        for a, b in zip(_grads(plain), _grads(floored), strict=True):
            assert torch.equal(a, b), name
        assert switch(False) == 0, name  # (put back; a stray off is ignored)
        assert [switch(True), switch(True), switch(False), switch(False)] == [1, 2, 1, 0]

    ext = floors_extension()
    x = torch.randn(3, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.tanh(x * 2 + 1).sum(dim=1)
    expected = sum(e.name.startswith("aten::") for e in prof.events())
    before = ext.fallback_calls()
    ext.fallback(True)
    try:
        y = torch.tanh(x * 2 + 1).sum(dim=1)
    finally:
        ext.fallback(False)
    assert ext.fallback_calls() - before == expected > 0
    assert torch.equal(y, torch.tanh(x * 2 + 1).sum(dim=1))


def test_fit_lines_recover_a_line_the_test_chose():
    """The fit group's lines: step times made exactly linear in k (a fixed cost per
    segment the test chose, plus one per operator), given as the ratios ``measure_rounds``
    reports, come back as those two costs, each variant on its own line."""
    from benchmarks import bench_replay_speed as brs

    base_s = 64 * (90e-6 + 1 * 20e-6)  # torch's k=1 step: the ratios' denominator
    chosen = {v: (90e-6 + 5e-6 * i, 20e-6 + 2e-6 * i) for i, v in enumerate(brs.FIT_ROWS)}
    cpu = {"base_s": base_s}
    for v, (fixed, per_op) in chosen.items():
        for k in brs.FIT_OPS:
            cpu[f"{v}, k={k}"] = 64 * (fixed + k * per_op) / base_s
    lines = brs.fit_lines({"cpu": cpu})
    assert set(lines) == set(chosen)
    for v, (fixed, per_op) in chosen.items():
        assert lines[v]["per_segment_us"] == pytest.approx(1e6 * fixed, rel=1e-9)
        assert lines[v]["per_op_us"] == pytest.approx(1e6 * per_op, rel=1e-9)


def test_fit_chains_rerun_every_segment_and_match_eager():
    """The fit group's chains re-run every segment in the backward (torch.sin saves its
    input): the profiler counts twice the forward's sin operators, for torch's
    checkpoint and torch_replay's alike, and each gives eager's gradient."""
    from benchmarks import bench_replay_speed as brs

    x = torch.randn(4, requires_grad=True)
    k = brs.FIT_OPS[1]
    eager = x.detach().clone().requires_grad_()
    h = eager
    for _ in range(64 * k):
        h = torch.sin(h)
    h.sum().backward()
    for reentrant in (False, True):
        steps = brs.fit_steps(reentrant, x)
        for variant in brs.FIT_ROWS:
            x.grad = None
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                steps[f"{variant}, k={k}"]()
            sins = sum(e.name == "aten::sin" for e in p.events())
            assert sins == 2 * 64 * k, (variant, reentrant)
            torch.testing.assert_close(x.grad, eager.grad, rtol=0, atol=0)
