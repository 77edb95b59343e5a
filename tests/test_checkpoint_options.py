"""torch's keywords through torch_replay.checkpoint (determinism_check, context_fn,
debug, nesting) against torch.utils.checkpoint, and the observer / engine-bytes options."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp

import torch_replay as tr

from .reference import (
    REENTRANT,
    MoCoHead,
    ShiftBlock,
    assert_bitwise,
    grads,
)

# ------------------------------------------------------------- torch keywords


def test_determinism_check_reports_a_different_recomputation():
    flag = {"extra": False}
    x = torch.randn(4, requires_grad=True)

    def seg(a):
        y = a.sin()
        if flag["extra"]:
            y = y.exp()  # saves one more tensor in the re-run
        return y.cos()

    y = tr.checkpoint(seg, x, early_stop=False, use_reentrant=False)
    flag["extra"] = True
    with pytest.raises(tcp.CheckpointError):
        y.sum().backward()


def test_context_fn_and_kwargs_keep_their_meaning():
    seen = []

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(self.name)

        def __exit__(self, *exc):
            return False

    x = torch.randn(4, requires_grad=True)
    y = tr.checkpoint(
        lambda a, *, k: (a * k).sin(),
        x,
        k=3.0,
        context_fn=lambda: (Ctx("fwd"), Ctx("re")),
        use_reentrant=False,
    )
    y.sum().backward()
    assert seen == ["fwd", "re"]
    torch.testing.assert_close(x.grad, 3.0 * (3.0 * x.detach()).cos())
    with pytest.raises(ValueError, match="Unexpected keyword"):
        tr.checkpoint(lambda a, k: a * k, x, k=1.0, use_reentrant=True)


def test_nested_checkpoints_match_eager():
    def run(ckpt):
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        outer_lin = nn.Linear(6, 6)
        x = torch.randn(3, 6, requires_grad=True)

        def outer(a):
            return outer_lin(ckpt(inner, a) if ckpt else inner(a)).sin()

        y = ckpt(outer, x) if ckpt else outer(x)
        y.pow(2).sum().backward()
        return grads(x, outer_lin.weight, inner[0].weight)

    assert_bitwise(run(functools.partial(tr.checkpoint, use_reentrant=False)), run(None))


def test_without_observer_declared_state_uses_the_snapshot():
    torch.manual_seed(0)
    m = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    with tr.config.patch(observe=False):
        with pytest.raises(ValueError, match="observer"):
            tr.checkpoint(m, x, state=[m], engine="readset", use_reentrant=False)
        y = tr.checkpoint(m, x, state=[m], use_reentrant=False)
        assert tr.last_transaction().engine == "snapshot"
        m.shift.mul_(2.0)
        y.sum().backward()
        ref = x.grad.clone()
    m.shift.div_(2.0)
    x.grad = None
    m(x).sum().backward()
    assert torch.equal(ref, x.grad)


@pytest.mark.parametrize("setting", ["detect", "verify", "observer"])
def test_an_unknown_level_is_refused_naming_the_valid_ones(setting, monkeypatch):
    monkeypatch.setattr(tr.config, setting, "everything")
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(ValueError, match=f"torch_replay.config.{setting} must be one of"):
        tr.checkpoint(torch.sin, x, use_reentrant=False)


@pytest.mark.detect("reads")  # what the refusing level says
@pytest.mark.parametrize("reentrant", REENTRANT)
def test_read_through_a_temporary_view_is_checked(reentrant):
    # Found by the cohort suite: the view dies after the forward, its base's
    # version counter still moves.
    torch.manual_seed(0)
    buf = torch.randn(6)
    lin = nn.Linear(4, 4)
    x = torch.randn(4, requires_grad=True)
    y = tr.checkpoint(lambda i: torch.tanh(lin(i) + buf[:4]), x, use_reentrant=reentrant)
    with torch.no_grad():
        buf.mul_(2.0)
    with pytest.raises(tr.StateMutationError):
        y.sum().backward()


def test_debug_flag_runs_like_torch():
    def run(ckpt):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(2, 4, requires_grad=True)
        ckpt(lin, x, use_reentrant=False, debug=True).sum().backward()
        return grads(x, lin.weight)

    assert_bitwise(run(tr.checkpoint), run(tcp.checkpoint))


@pytest.mark.parametrize("engine", ["snapshot", "journal"])
def test_engine_bytes_counts_what_the_engines_hold(engine):
    gc_base = tr.engine_bytes()
    head = MoCoHead(slots=1024)  # a 64 KiB queue
    x = torch.randn(8, 16, requires_grad=True)
    y = tr.checkpoint(head, x, use_reentrant=False, state=[head.queue], engine=engine)
    head.enqueue(torch.randn(8, 16))
    held = tr.engine_bytes() - gc_base
    # snapshot: the whole queue; journal: the enqueued rows only.
    assert held == (head.queue.nbytes if engine == "snapshot" else 8 * 16 * 4)
    y.sum().backward()
    del y
    assert tr.engine_bytes() == gc_base  # released with the graph


def test_cpp_observer_state_is_bounded_and_scoped():
    """Note [C++ observer]: the schema cache holds one entry per operator overload (not
    per call), and no observer or nesting is left behind after a segment."""
    from torch_replay._ext import require_extension

    C = require_extension()
    x = torch.randn(4, requires_grad=True)

    def run(n):
        for _ in range(n):
            tr.checkpoint(lambda a: (a * 2).sin(), x, use_reentrant=False).sum().backward()
        return C.observer_known_operators()

    assert run(5) == run(200)
    assert C.observer_depth() == 0 and C.observer_nesting() == 0


def test_observer_nesting_survives_an_operator_that_raises():
    """Note [C++ observer]: the start and end callbacks pair through a per-thread frame
    stack; an operator that raises inside a nested operator (caught by the segment) must
    leave the nesting balanced, or the segment's later top-level writes would be taken for
    a kernel's internals and not protected. Reference: eager updates the buffer once."""
    from torch_replay._ext import require_extension

    C = require_extension()
    buf = torch.zeros(3)
    w_bad = torch.randn(5, 7)
    x = torch.randn(2, 3, requires_grad=True)

    def seg(a):
        for _ in range(3):
            try:
                F.linear(a, w_bad)  # raises inside linear's implementation
            except RuntimeError:
                pass
        buf.add_(1.0)  # an undeclared write, after the failed operators
        return a.sin() * buf

    y = tr.checkpoint(seg, x, use_reentrant=False)
    y.sum().backward()
    assert torch.equal(buf, torch.ones(3))  # eager's: one update, not two
    assert torch.allclose(x.grad, x.detach().cos() * 1.0)
    assert C.observer_depth() == 0 and C.observer_nesting() == 0


# ----------------------------------- Note [Early stop of a stateful re-run]


def _tail_counting_segment(lin, calls, draw_after):
    def seg(a):
        h = F.dropout(lin(a), 0.5, training=True)  # draws: a stateful segment
        calls.append("tail")  # after the last tensor the segment saves
        if draw_after:
            torch.rand(3)  # a draw no saved tensor depends on
        return h * 2.0  # saves nothing

    return seg


@pytest.mark.parametrize("state", [False, True])
def test_a_stateful_rerun_stops_where_torchs_does(state):
    """The re-run stops once every saved tensor is recomputed, as torch's does (its
    tail does not run), since the state is already reproduced there; gradients equal
    torch's checkpoint's (right here: nothing changes before backward)."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    results = {}
    for name, ckpt in (("torch", tcp.checkpoint), ("ours", tr.checkpoint)):
        calls: list[str] = []
        seg = _tail_counting_segment(lin, calls, draw_after=False)
        kwargs = {"state": [lin]} if name == "ours" and state else {}
        torch.manual_seed(1)
        ckpt(seg, x, use_reentrant=False, **kwargs).sum().backward()
        results[name] = (len(calls), grads(x, *lin.parameters()))
        for t in (x, *lin.parameters()):
            t.grad = None
    assert results["ours"][0] == results["torch"][0] == 1
    assert_bitwise(results["ours"][1], results["torch"][1])


def test_a_rerun_whose_tail_draws_runs_to_the_end_and_is_verified():
    """A draw after the last saved tensor: at that point the generator is not yet where
    the forward left it, so the re-run goes on and is verified at its end; the
    generator after backward is where the forward left it."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    calls: list[str] = []
    seg = _tail_counting_segment(lin, calls, draw_after=True)
    torch.manual_seed(1)
    y = tr.checkpoint(seg, x, use_reentrant=False)
    after_forward = torch.get_rng_state()
    y.sum().backward()
    assert len(calls) == 2  # the forward's and the re-run's, which did not stop
    assert torch.equal(torch.get_rng_state(), after_forward)
    got = grads(x, *lin.parameters())
    for t in (x, *lin.parameters()):
        t.grad = None
    torch.manual_seed(1)  # eager, the same draws
    seg(x).sum().backward()
    assert_bitwise(got, grads(x, *lin.parameters()))
