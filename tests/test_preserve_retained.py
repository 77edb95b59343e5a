"""Graphs kept alive under ``detect="preserve"``: past their first
backward (``retain_graph=True``) or never backwarded. What their segments read stays
preserved for every backward, and the journal keeps one copy of what later steps
overwrite, not one per step (Note [Region journal]). References: eager PyTorch (the
same model without checkpointing, on the forward-time values) and ``tr.engine_bytes()``
against the parameters' own bytes."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn

import torch_replay as tr

from .reference import REENTRANT, grads


@pytest.fixture(autouse=True)
def preserve():
    gc.collect()  # transactions an earlier test left in reference cycles: their bytes go now
    with tr.config.patch(detect="preserve"):
        yield


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
def test_optimizer_steps_after_a_retained_backward_keep_one_copy(observer, reentrant):
    """The kept graph's second backward is the gradient of the forward that ran (eager
    on the forward-time weights; eager itself refuses it, its saved weights having
    changed), and the journal holds one copy of the parameters however many steps
    write them, none once the graph is dropped."""
    blocks = _blocks()
    forward_weights = [p.detach().clone() for p in blocks.parameters()]
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    x = torch.randn(8, 64, requires_grad=True)
    loss = _forward(blocks, x, reentrant)
    loss.backward(retain_graph=True)
    first = grads(x, *blocks.parameters())
    held = []
    for _ in range(3):
        opt.step()  # writes every parameter the kept graph's segments read
        held.append(tr.engine_bytes())
    assert held == [_param_bytes(blocks)] * 3
    for t in (x, *blocks.parameters()):
        t.grad = None
    loss.backward()
    # Eager on the forward-time weights gives the same gradient twice.
    eager = _blocks()
    with torch.no_grad():
        for p, v in zip(eager.parameters(), forward_weights, strict=True):
            p.copy_(v)
    x2 = x.detach().clone().requires_grad_(True)
    eager(x2).pow(2).sum().backward()
    for a, b, c in zip(
        grads(x, *blocks.parameters()), first, grads(x2, *eager.parameters()), strict=True
    ):
        assert torch.equal(a, c) and torch.equal(b, c)
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
