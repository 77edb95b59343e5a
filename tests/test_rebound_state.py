"""State re-bound between forward and backward (Note [Re-bound state] in
torch_replay/_replay/bindings.py): a buffer assigned a new tensor (the non-in-place MoCo
enqueue), a parameter's ``.data`` replaced, and ``torch.func.functional_call`` returning
before backward. The re-run would read the new tensor; torch's checkpoint does, and its
gradient differs from eager's (shown here, so each test can fail). torch_replay refuses
with ``StateMutationError`` naming the attribute, before the re-run touches anything, in
every mode: nothing declared, ``state=[model]`` with each engine, reentrant or not.
A name the forward did not read may still be re-bound, and in-place updates stay right.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as tcp

import torch_replay as tr
from torch_replay.errors import StateMutationError

ENGINES = ("auto", "journal", "readset", "snapshot", "guard")
MODES = [(r, None) for r in (False, True)] + [(r, e) for r in (False, True) for e in ENGINES]


class Queue(torch.nn.Module):
    """Reads a queue buffer (MoCo's negatives) and a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("queue", torch.randn(6, 4))
        self.register_buffer("unused", torch.zeros(3))

    def forward(self, x):
        return (self.lin(x) @ self.queue.t()).tanh()


def _run(model, x, checkpoint, between):
    """Gradient of x and of the weight after a forward, ``between()``, backward."""
    x = x.detach().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out = checkpoint(model, x)
    between()
    out.pow(2).sum().backward()
    return x.grad.clone(), model.lin.weight.grad.clone()


def _eager(model, x):
    return lambda m, a: m(a)


def _enqueue(model):
    def between():
        model.queue = torch.cat([torch.randn(2, 4), model.queue[:-2]])  # not in place

    return between


def _replace_data(model):
    def between():
        model.lin.weight.data = model.lin.weight.data * 0.5  # old-style EMA

    return between


@pytest.mark.parametrize("between_of", [_enqueue, _replace_data], ids=["enqueue", "data"])
def test_torch_checkpoint_is_wrong_here(between_of):
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    eager = _run(model, x, lambda m, a: m(a), between_of(model))
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    torch_ = _run(
        model, x, lambda m, a: tcp.checkpoint(m, a, use_reentrant=False), between_of(model)
    )
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(eager, torch_, strict=True))


@pytest.mark.parametrize("between_of", [_enqueue, _replace_data], ids=["enqueue", "data"])
@pytest.mark.parametrize(("reentrant", "engine"), MODES)
def test_rebound_state_is_refused_by_name(between_of, reentrant, engine):
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    kw = {} if engine is None else {"state": [model], "engine": engine}

    def ckpt(m, a):
        return tr.checkpoint(m, a, use_reentrant=reentrant, **kw)

    between = between_of(model)
    with pytest.raises(StateMutationError) as info:
        _run(model, x, ckpt, lambda: (between(), torch.set_rng_state(rng)))
    name = "queue" if between_of is _enqueue else "weight"
    assert f"[tensor: {name} (" in str(info.value)
    assert "in place" in str(info.value)
    # Nothing was re-run or put back: the module holds what the user bound.
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    if between_of is _enqueue:
        assert not torch.equal(after["queue"], before["queue"])  # the user's new queue
        assert torch.equal(after["lin.weight"], before["lin.weight"])
    else:
        assert torch.equal(after["lin.weight"], before["lin.weight"] * 0.5)


@pytest.mark.parametrize("reentrant", [False, True])
def test_in_place_update_stays_right(reentrant):
    # The same step with the queue updated in place and declared: the gradient of the
    # forward's values (eager's autograd would refuse this write; its gradient without
    # the write is the reference).
    def in_place(model):
        def between():
            with torch.no_grad():
                model.queue.copy_(torch.cat([torch.ones(2, 4), model.queue[:-2]]))

        return between

    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    eager = _run(model, x, lambda m, a: m(a), lambda: None)
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    ours = _run(
        model,
        x,
        lambda m, a: tr.checkpoint(m, a, use_reentrant=reentrant, state=[m]),
        in_place(model),
    )
    for a, b in zip(eager, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_name_the_forward_did_not_read_may_be_rebound(reentrant):
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)

    def rebind_unused():
        model.unused = torch.ones(3)

    eager = _run(model, x, lambda m, a: m(a), rebind_unused)
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(3, 4)
    ours = _run(
        model,
        x,
        lambda m, a: tr.checkpoint(m, a, use_reentrant=reentrant, state=[m]),
        rebind_unused,
    )
    for a, b in zip(eager, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).tanh()


class Outer(torch.nn.Module):
    """Checkpoints its inner layer, as a model under meta-learning would."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inner = Inner()
        self.reentrant = reentrant
        self.checkpoint = None

    def forward(self, x):
        if self.checkpoint is None:
            return self.inner(x)
        return self.checkpoint(self.inner, x, use_reentrant=self.reentrant)


def _fast_weights_grads(checkpoint, reentrant):
    torch.manual_seed(0)
    model = Outer(reentrant)
    model.checkpoint = checkpoint
    x = torch.randn(3, 4, requires_grad=not reentrant or True)
    fast = {n: (p * 0.9).detach().requires_grad_(True) for n, p in model.named_parameters()}
    out = torch.func.functional_call(model, fast, (x,))
    out.pow(2).sum().backward()  # after functional_call returned
    return [fast[n].grad for n in sorted(fast)]


@pytest.mark.parametrize("reentrant", [False, True])
def test_functional_call_returned_before_backward(reentrant):
    eager = _fast_weights_grads(None, reentrant)
    torch_ = _fast_weights_grads(tcp.checkpoint, reentrant)
    wrong = [t is None or (t - e).abs().max() > 1e-3 for t, e in zip(torch_, eager, strict=True)]
    assert any(wrong)  # torch's checkpoint: another gradient (or none, reentrant)
    with pytest.raises(StateMutationError, match=r"functional_call") as info:
        _fast_weights_grads(tr.checkpoint, reentrant)
    assert "[tensor: " in str(info.value)
