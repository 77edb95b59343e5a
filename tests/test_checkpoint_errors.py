"""torch_replay.checkpoint's refusals: a replay that differs from the forward, and
bad input (overlapping copies, integer writes, malformed state), each leaving the
user's tensors as they were."""

from __future__ import annotations

import pytest
import torch

import torch_replay as tr

from .reference import (
    REENTRANT,
    assert_refused_leaving,
    storage_bytes,
)

# ---------------------------------------------------------------- replay checks


def test_replay_drawing_a_different_amount_raises_rng_mismatch():
    with tr.config.patch(detect="saved"):  # let the hidden counter through to the RNG check
        n = torch.tensor([3])
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3, requires_grad=True)

        def seg(a):
            extra = torch.rand(int(n.item()), generator=g)  # how much it draws is hidden
            return a * extra[:3]

        y = tr.checkpoint(seg, x, state=[g], use_reentrant=False)
        n.fill_(7)
        gen_before = bytes(g.get_state().numpy())
        with pytest.raises(tr.RngMismatchError, match="position"):
            y.sum().backward()
        assert bytes(g.get_state().numpy()) == gen_before


def test_replay_reaching_another_end_state_raises():
    with tr.config.patch(detect="saved"):
        c = torch.tensor([2.0])  # hidden, read only
        out_buf = torch.zeros(3)
        x = torch.randn(3, requires_grad=True)

        def seg(a):
            out_buf.copy_(c.expand(3))
            return a * a

        y = tr.checkpoint(seg, x, state=[out_buf], use_reentrant=False)
        c.fill_(9.0)
        assert_refused_leaving(y, out_buf, "end state")


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_overlapping_copy_is_rejected_and_state_untouched(reentrant):
    buf = torch.arange(8.0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, requires_grad=True)
    before, gen_before = storage_bytes(buf), bytes(g.get_state().numpy())

    def seg(a):
        buf.mul_(3.0)
        torch.rand(2, generator=g)
        buf[1:].copy_(buf[:-1])
        return a * 2

    with pytest.raises(tr.OverlapError):
        tr.checkpoint(seg, x, state=[buf, g], use_reentrant=reentrant)
    assert storage_bytes(buf) == before
    assert bytes(g.get_state().numpy()) == gen_before


def test_overlapping_copy_of_an_internal_tensor_is_rejected():
    x = torch.randn(5, requires_grad=True)

    def seg(a):
        t = a * 2
        with torch.no_grad():
            t[1:].copy_(t[:-1])
        return t

    with pytest.raises(tr.OverlapError):
        tr.checkpoint(seg, x, use_reentrant=False)


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_float_gradient_through_integer_write_is_unsupported(reentrant):
    ibuf = torch.zeros(4, dtype=torch.int32)
    fbuf = torch.ones(4)
    x = torch.randn(4, requires_grad=True)
    before = (storage_bytes(ibuf), storage_bytes(fbuf))

    def seg(a):
        fbuf.add_(1.0)
        ibuf.copy_(a * 10)
        return a * ibuf

    with pytest.raises(tr.UnsupportedReplayError, match="integer"):
        tr.checkpoint(seg, x, state=[ibuf, fbuf], use_reentrant=reentrant)
    assert (storage_bytes(ibuf), storage_bytes(fbuf)) == before


def test_non_tensor_state_is_refused():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="state\\[1\\]"):
        tr.checkpoint(lambda a: a * 2, x, state=[torch.zeros(1), "buffer"], use_reentrant=False)
    with pytest.raises(ValueError, match="engine"):
        tr.checkpoint(lambda a: a * 2, x, engine="bogus", use_reentrant=False)


@pytest.mark.cuda
def test_generator_on_a_device_the_segment_never_used():
    x = torch.randn(3, requires_grad=True)
    g = torch.Generator(device="cuda")
    with pytest.raises(ValueError, match="never used"):
        tr.checkpoint(lambda a: a * 2, x, state=[g], use_reentrant=False)


def test_reentrant_refuses_autograd_grad_like_torch():
    x = torch.randn(3, requires_grad=True)
    y = tr.checkpoint(lambda a: a.sin(), x, use_reentrant=True)
    with pytest.raises(RuntimeError, match="use_reentrant"):
        torch.autograd.grad(y.sum(), x)


def test_no_grad_runs_plainly():
    x = torch.randn(3)
    with torch.no_grad():
        y = tr.checkpoint(lambda a: a * 2, x, use_reentrant=False)
    assert torch.equal(y, x * 2)
