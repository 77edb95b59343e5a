"""torch_replay.checkpoint against eager PyTorch and torch.utils.checkpoint: pure
segments (bitwise equal, the same memory saved) and gradients (gradcheck, central
differences). State that changes before backward: ``test_checkpoint_state.py``;
refusals: ``test_checkpoint_errors.py``; torch's keywords: ``test_checkpoint_options.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr

from .reference import (
    ALL_ENGINES,
    REENTRANT,
    assert_bitwise,
    grads,
)

# --------------------------------------------------------------------------- pure


class Pure(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x, scale=1.0, *, drop=True):
        h = torch.relu(self.a(x)) * scale
        if drop:
            h = torch.nn.functional.dropout(h, 0.3, training=True)
        return torch.tanh(self.b(h)), h.sum()


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_pure_segment_bitwise_equal_to_torch(reentrant):
    def run(ckpt):
        torch.manual_seed(3)
        m = Pure()
        x = torch.randn(8, 16, requires_grad=True)
        if reentrant:
            y, s = ckpt(m, x, 0.5, use_reentrant=True)
        else:
            y, s = ckpt(m, x, 0.5, use_reentrant=False, drop=True)
        (y.pow(2).sum() + s).backward()
        return [y.detach(), s.detach(), torch.get_rng_state()] + grads(x, *m.parameters())

    ours = run(tr.checkpoint)
    theirs = run(tcp.checkpoint)
    assert_bitwise(ours, theirs)


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every storage an operator creates; live_bytes() sums those still alive."""

    def __init__(self):
        super().__init__()
        import weakref

        self.refs = []
        self._weakref = weakref

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.refs.append(self._weakref.ref(t.untyped_storage()))
        return out

    def live_bytes(self):
        import gc

        gc.collect()
        seen = {}
        for r in self.refs:
            s = r()
            if s is not None:
                seen[s.data_ptr()] = s.nbytes()
        return sum(seen.values())


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_pure_segment_saves_the_same_memory_as_torch(reentrant):
    def kept(ckpt):
        torch.manual_seed(0)
        layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)])
        x = torch.randn(32, 64, requires_grad=True)
        mode = LiveBytes()
        with mode:
            y = x
            for layer in layers:
                y = ckpt(layer, y, use_reentrant=reentrant) if ckpt else layer(y)
            loss = y.sum()
        held = mode.live_bytes()
        loss.backward()
        return held

    eager, theirs, ours = kept(None), kept(tcp.checkpoint), kept(tr.checkpoint)
    assert ours == theirs
    assert ours < eager


def test_checkpoint_sequential_matches_torch():
    def run(fn):
        torch.manual_seed(1)
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)], nn.Dropout(0.2))
        x = torch.randn(4, 8, requires_grad=True)
        y = fn(model, 3, x, use_reentrant=False)
        y.sum().backward()
        return [y.detach()] + grads(x, *model.parameters())

    assert_bitwise(run(tr.checkpoint_sequential), run(tcp.checkpoint_sequential))


# ------------------------------------------------------------- gradcheck (float64)


class Stateful(nn.Module):
    """Reads a buffer, writes a counter buffer, draws from an explicit generator."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3).double()
        self.register_buffer("shift", torch.randn(3, dtype=torch.float64))
        self.register_buffer("count", torch.zeros(1, dtype=torch.float64))
        self.gen = torch.Generator().manual_seed(5)

    def forward(self, x, write=True):
        if write:
            self.count.add_(1)
        noise = torch.rand(x.shape, generator=self.gen, dtype=x.dtype)
        return torch.tanh(self.lin(x) + self.shift * self.count) * (1 + noise)


def _stateful_fn(engine, reentrant):
    m = Stateful()
    shift0 = m.shift.clone()

    def later_segment(y):
        # The declared buffers change before every backward (inside a segment, so
        # that the journal records it too).
        m.shift.add_(0.25)
        m.count.add_(1.0)
        return y * 1.5

    def f(x):
        # Reset so every evaluation (including the numeric ones) starts the same.
        m.gen.manual_seed(5)
        m.count.zero_()
        m.shift.copy_(shift0)
        y = tr.checkpoint(m, x, True, state=[m, m.gen], engine=engine, use_reentrant=reentrant)
        return tr.checkpoint(later_segment, y, state=[m], engine=engine, use_reentrant=reentrant)

    return f


@pytest.mark.parametrize("engine", ALL_ENGINES[:4])
def test_gradcheck_and_gradgradcheck_with_declared_state(engine):
    f = _stateful_fn(engine, reentrant=False)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_gradcheck_guard_engine():
    m = Stateful()

    def f(x):
        m.gen.manual_seed(5)
        return tr.checkpoint(m, x, False, state=[m, m.gen], engine="guard", use_reentrant=False)

    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.parametrize("engine", ALL_ENGINES[:4])
def test_reentrant_gradient_matches_central_differences(engine):
    # use_reentrant=True refuses torch.autograd.grad (as torch does), so gradcheck
    # cannot drive it: compare .backward() with central differences instead.
    f = _stateful_fn(engine, reentrant=True)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, dtype=torch.float64)
    (f(x) * w).sum().backward()
    numeric = torch.zeros_like(x)
    eps = 1e-6
    with torch.no_grad():
        for i in range(x.numel()):
            for sign in (1, -1):
                xp = x.detach().clone()
                xp.view(-1)[i] += sign * eps
                with torch.enable_grad():
                    val = (f(xp.requires_grad_()) * w).sum().item()
                numeric.view(-1)[i] += sign * val / (2 * eps)
    torch.testing.assert_close(x.grad, numeric, atol=1e-7, rtol=1e-6)
