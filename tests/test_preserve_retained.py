"""Note [Preserved reads after the first re-run]: under ``detect="preserve"`` a graph
kept past its first backward (``retain_graph=True``) stops journaling what its segments
read and no write had touched: the optimizer's step then keeps no copy of the
parameters (torch and the "reads" level keep none), and a second backward through the
kept graph after such a write is refused as eager autograd refuses it. What was
written before the first backward stays preserved for every later one. References:
eager PyTorch (the same model without checkpointing) and ``tr.engine_bytes()`` against
the parameters' own bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_replay as tr

from .reference import REENTRANT, grads


@pytest.fixture(autouse=True)
def preserve():
    old = tr.config.detect
    tr.config.detect = "preserve"
    yield
    tr.config.detect = old


def _blocks():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(3)])


def _forward(blocks, x, reentrant):
    h = x
    for b in blocks:
        h = tr.checkpoint(b, h, use_reentrant=reentrant)
    return h.pow(2).sum()


def _param_bytes(blocks):
    return sum(p.numel() * p.element_size() for p in blocks.parameters())


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_optimizer_step_after_a_retained_backward_keeps_no_copy(observer, reentrant):
    blocks = _blocks()
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    x = torch.randn(8, 64, requires_grad=True)
    loss = _forward(blocks, x, reentrant)
    loss.backward(retain_graph=True)
    before = tr.engine_bytes()
    opt.step()  # writes every parameter the kept graph's segments read
    assert tr.engine_bytes() - before == 0, _param_bytes(blocks)
    # Eager autograd refuses the same second backward (the weights it saved changed).
    eager = _blocks()
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    eager_loss = eager(x.detach().requires_grad_(True)).pow(2).sum()
    eager_loss.backward(retain_graph=True)
    eager_opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        eager_loss.backward()
    with pytest.raises(tr.StateMutationError, match="earlier backward") as err:
        loss.backward()
    assert "weight" in str(err.value) or "bias" in str(err.value)
    del loss
    assert tr.engine_bytes() == 0


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_second_backward_without_writes_equals_eager(observer, reentrant):
    blocks = _blocks()
    x = torch.randn(8, 64, requires_grad=True)
    loss = _forward(blocks, x, reentrant)
    loss.backward(retain_graph=True)
    loss.backward()
    got = grads(x, *blocks.parameters())
    eager = _blocks()
    x2 = x.detach().clone().requires_grad_(True)
    eager_loss = eager(x2).pow(2).sum()
    eager_loss.backward(retain_graph=True)
    eager_loss.backward()
    for a, b in zip(got, grads(x2, *eager.parameters()), strict=True):
        assert torch.equal(a, b)


class _Queue(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.proj = nn.Linear(16, 16)
        self.register_buffer("queue", torch.randn(16, 32))

    def forward(self, x):
        return torch.tanh(self.proj(x) @ self.queue)


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_written_before_the_first_backward_stays_preserved(observer, reentrant):
    """The queue, changed between the forward and the first backward, is restored for
    each re-run; it and the weights (untouched) then give eager's gradient twice, and a
    write to the queue between the two backwards is journaled too."""
    m = _Queue()
    x = torch.randn(4, 16, requires_grad=True)
    forward_queue = m.queue.clone()
    loss = tr.checkpoint(m, x, use_reentrant=reentrant).pow(2).sum()
    with torch.no_grad():
        m.queue[:, :8] = torch.randn(16, 8)  # an enqueue before backward
    loss.backward(retain_graph=True)
    with torch.no_grad():
        m.queue[:, 8:16] = torch.randn(16, 8)  # another, between the backwards
    loss.backward()
    got = grads(x, m.proj.weight, m.proj.bias)
    # Eager on the forward-time queue, backward twice.
    ref = _Queue()
    with torch.no_grad():
        ref.queue.copy_(forward_queue)
    x2 = x.detach().clone().requires_grad_(True)
    ref_loss = ref(x2).pow(2).sum()
    ref_loss.backward(retain_graph=True)
    ref_loss.backward()
    for a, b in zip(got, grads(x2, ref.proj.weight, ref.proj.bias), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(m.queue, forward_queue)  # the live queue is put back


def test_weights_written_after_a_retained_backward_are_named(observer):
    """A weight of the kept graph written between the two backwards is refused, naming
    it, while the queue written before the first stays preserved."""
    m = _Queue()
    x = torch.randn(4, 16, requires_grad=True)
    loss = tr.checkpoint(m, x, use_reentrant=False).pow(2).sum()
    with torch.no_grad():
        m.queue.mul_(2)
    loss.backward(retain_graph=True)
    with torch.no_grad():
        m.proj.bias.add_(1)
    with pytest.raises(tr.StateMutationError, match=r"(?s)earlier backward.*proj\.bias"):
        loss.backward()


def test_a_graph_never_backwarded_keeps_one_copy_not_one_per_step(observer):
    """Note [Region journal]: an output kept with its graph (an evaluation forward run
    with grad enabled) keeps what its segments read once, however many optimizer steps
    write it afterwards, and nothing once it is dropped."""
    blocks = _blocks()
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    x = torch.randn(8, 64)
    kept = _forward(blocks, x, False)  # never backwarded
    held = []
    for _ in range(4):
        loss = _forward(blocks, x, False)
        loss.backward()
        opt.step()
        opt.zero_grad()
        held.append(tr.engine_bytes())
    assert held == [_param_bytes(blocks)] * 4
    del kept
    assert tr.engine_bytes() == 0
