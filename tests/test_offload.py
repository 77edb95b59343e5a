"""Offloading around a non-reentrant checkpoint: outer saved-tensor hooks
(save_on_cpu, torch's offload_wrapper) see and pack exactly the tensors
torch.utils.checkpoint exposes to them (the segment's positional tensor inputs, kept
for the re-run), and the input is freed when torch frees it. The reference is
torch.utils.checkpoint under the same hooks."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper as torch_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import offload_wrapper

import torch_replay as tr
from tests.reference import assert_bitwise

CHECKPOINTS = {"torch": tcp.checkpoint, "tr": tr.checkpoint}
# torch < 2.13 saves the inputs through an autograd Function whose first saved tensor is
# a (0,) dummy, which an outer hook packs too; 2.13 saves the inputs alone.
TORCH_DUMMY = [] if hasattr(tcp._CheckpointFrame, "save_inputs") else [((0,), "other")]


def _segment(lin):
    def f(a, b, k, *, bias):
        return torch.sin(lin(a) * b) * k + bias

    return f


def _seen_by_outer_hook(ck):
    """What an outer hook packs and unpacks around one checkpointed segment, whether
    the first input is alive after the caller drops it, and the gradients."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4, requires_grad=True)
    a = x * 2  # an activation: only the checkpoint can keep it
    bias = torch.randn(4, requires_grad=True)
    alive = weakref.ref(a)
    ids = {id(a): "a", id(b): "b"}
    packed, unpacked = [], []

    def pack(t):
        packed.append((tuple(t.shape), ids.get(id(t), "other")))
        return t.clone()  # a copy: the original can go

    def unpack(t):
        unpacked.append(tuple(t.shape))
        return t

    with saved_tensors_hooks(pack, unpack):
        y = ck(_segment(lin), a, b, 0.5, bias=bias, use_reentrant=False)
    del a
    gc.collect()
    freed = alive() is None
    y.sum().backward()
    return packed, unpacked, freed, [x.grad, b.grad, bias.grad] + [p.grad for p in lin.parameters()]


def test_outer_hook_sees_and_frees_the_inputs_as_torch():
    p_t, u_t, freed_t, g_t = _seen_by_outer_hook(tcp.checkpoint)
    p_r, u_r, freed_r, g_r = _seen_by_outer_hook(tr.checkpoint)
    # torch's own figure: the positional inputs (after the dummy, on torch < 2.13)
    assert p_t == TORCH_DUMMY + [((3, 4), "a"), ((3, 4), "b")]
    assert (p_r, u_r, freed_r) == (p_t, u_t, freed_t)
    assert freed_t
    assert_bitwise(g_r, g_t)


@pytest.mark.parametrize("which", ["torch", "tr"])
def test_save_on_cpu_pinned_copies_and_frees_the_input(which):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    h = x.tanh()
    alive = weakref.ref(h)
    with save_on_cpu(pin_memory=True):  # on CPU: a fresh copy of every packed tensor
        y = CHECKPOINTS[which](lin, h, use_reentrant=False)
    del h
    gc.collect()
    assert alive() is None
    y.square().sum().backward()
    torch.manual_seed(0)
    lin_e = nn.Linear(8, 8)
    x_e = x.detach().clone().requires_grad_(True)
    lin_e(x_e.tanh()).square().sum().backward()
    assert_bitwise([x.grad, lin.weight.grad], [x_e.grad, lin_e.weight.grad])


class _NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.norm(self.lin(x))).relu()


def _offloaded_step(wrap):
    torch.manual_seed(0)
    model = nn.Sequential(_NormBlock(), _NormBlock())
    if wrap is not None:
        for i in range(2):
            model[i] = offload_wrapper(wrap(model[i]))
    x = torch.randn(6, 8, requires_grad=True)
    h = x * 1.5
    alive = weakref.ref(h)
    torch.manual_seed(1)
    out = model[1](model[0](h))
    del h
    gc.collect()
    freed = alive() is None
    out.sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return freed, grads, [b.clone() for b in model.buffers()]


def test_offload_wrapper_around_checkpoint_wrapper():
    """torch's offload_wrapper around each checkpoint wrapper: the input is freed as
    around torch's wrapper; with BatchNorm, eager's gradients and statistics."""
    _, g_e, b_e = _offloaded_step(None)
    freed_t, _, b_t = _offloaded_step(torch_wrapper)
    freed_r, g_r, b_r = _offloaded_step(tr.checkpoint_wrapper)
    assert freed_t and freed_r
    assert not all(torch.equal(a, b) for a, b in zip(b_t, b_e, strict=True))  # torch: twice
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)


def _product_and_eager_grad():
    """``w`` (requires grad), ``a``, and eager's gradient of ``sin(a * w).sum()`` in w."""
    torch.manual_seed(0)
    w = torch.randn(4, requires_grad=True)
    a = torch.randn(4)
    (a * w).sin().sum().backward()
    eager = w.grad.clone()
    w.grad = None
    return w, a, eager


def test_declared_input_changed_before_backward_under_an_outer_hook_is_eager():
    """An argument that is declared state and changed before backward: the re-run sees
    its forward bytes also when an outer hook packed it (no SavedTensor version check)."""
    w, a, eager = _product_and_eager_grad()
    with save_on_cpu(pin_memory=True):
        y = tr.checkpoint(lambda a, w: (a * w).sin(), a, w, use_reentrant=False, state=[a])
    a.add_(1.0)
    y.sum().backward()
    assert torch.equal(w.grad, eager)


@pytest.mark.detect("preserve")
@pytest.mark.parametrize("outer_hook", [False, True])
def test_undeclared_input_changed_before_backward_is_eager_under_preserve(outer_hook):
    """detect="preserve": an argument changed before backward, with or
    without an outer hook packing it, gives eager's gradient without state=."""
    w, a, eager = _product_and_eager_grad()
    with save_on_cpu(pin_memory=True) if outer_hook else contextlib.nullcontext():
        y = tr.checkpoint(lambda a, w: (a * w).sin(), a, w, use_reentrant=False)
    a.add_(1.0)
    y.sum().backward()
    assert torch.equal(w.grad, eager)


@pytest.mark.detect("reads")  # what the refusing level says
def test_undeclared_input_changed_before_backward_is_named():
    w = torch.randn(4, requires_grad=True)
    a = torch.randn(4)
    y = tr.checkpoint(lambda a, w: (a * w).sin(), a, w, use_reentrant=False)
    a.add_(1.0)
    with pytest.raises(tr.StateMutationError, match="argument 0 of the segment"):
        y.sum().backward()


@pytest.mark.parametrize("outer_hook", [False, True])
def test_nested_checkpoints_pack_and_differentiate_as_torch(outer_hook):
    """A checkpoint inside a checkpoint: the inner one's inputs go through the outer
    segment's hooks, as with torch; with an outer save_on_cpu too."""
    results = {}
    for which, ck in CHECKPOINTS.items():
        torch.manual_seed(0)
        a, b = nn.Linear(6, 6), nn.Linear(6, 6)
        x = torch.randn(3, 6, requires_grad=True)
        packed = []

        def pack(t, packed=packed):
            packed.append(tuple(t.shape))
            return t.clone()

        def inner(h, ck=ck, b=b):
            return ck(lambda u: torch.tanh(b(u)), h.sin(), use_reentrant=False)

        def outer(h, ck=ck, a=a):
            return ck(inner, a(h), use_reentrant=False).cos()

        hooks = saved_tensors_hooks(pack, lambda t: t) if outer_hook else contextlib.nullcontext()
        with hooks:
            y = outer(x * 1.0)
        y.sum().backward()
        results[which] = (packed, [x.grad] + [p.grad for p in (*a.parameters(), *b.parameters())])
    assert results["tr"][0] == results["torch"][0]
    assert_bitwise(results["tr"][1], results["torch"][1])


@pytest.mark.parametrize("drop", [False, True], ids=["input-kept", "input-dropped"])
def test_input_written_in_place_under_an_offloading_hook_is_eager(drop):
    """A segment that writes its input in place, under save_on_cpu: torch re-runs on the
    hook's copy (the bytes from before the write); torch_replay keeps that input itself
    (Note [Inputs through outer hooks]). Both give eager's gradient, and the caller's
    tensor ends as the forward left it."""

    def f(a, w):
        a.add_(1.0)
        return (a * w).sin()

    torch.manual_seed(0)
    w, a = torch.randn(4, requires_grad=True), torch.randn(4)
    eager = torch.autograd.grad(f(a.clone(), w).sum(), w)[0]
    for ck in (tcp.checkpoint, tr.checkpoint):
        w.grad = None
        x = a.clone()
        with save_on_cpu(pin_memory=True):
            y = ck(f, x, w, use_reentrant=False)
        if drop:
            del x
            gc.collect()
        y.sum().backward()
        assert torch.equal(w.grad, eager), ck.__module__
        if not drop:
            assert torch.equal(x, a + 1.0)
