"""Comparison helpers shared by the checkpoint tests (the reference is eager PyTorch
or torch.utils.checkpoint, computed in each test), and the small models several of the
``test_checkpoint*.py`` files use; the opt-in marker and the C++ planner handle of the
``test_planner*.py`` files."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

ENGINES_WRITING = ["auto", "snapshot", "readset", "journal"]
ALL_ENGINES = ["auto", "snapshot", "readset", "journal", "guard"]
REENTRANT = [False, True]


def storage_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().untyped_storage())


def grads(*tensors):
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def assert_refused_leaving(y: torch.Tensor, t: torch.Tensor, match: str) -> None:
    """``y.sum()``'s backward raises StateMutationError (message matching ``match``) and
    leaves ``t``'s bytes as they were before it."""
    import torch_replay as tr

    before = storage_bytes(t)
    with pytest.raises(tr.StateMutationError, match=match):
        y.sum().backward()
    assert storage_bytes(t) == before


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert x.device == y.device and x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y), (x - y).abs().max()


class BufferedLinear(nn.Module):
    """``lin``, an ``nn.Linear(n, n)``, then one buffer ``name`` made by ``value()``
    (after the layer, so that the default generator draws in that order); the forward
    is the subclass's."""

    def __init__(self, n: int, name: str, value):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.register_buffer(name, value())


class ShiftBlock(BufferedLinear):
    def __init__(self):
        super().__init__(8, "shift", lambda: torch.randn(8))

    def forward(self, x):
        return torch.tanh(self.lin(x) + self.shift)


class MoCoHead(nn.Module):
    """Logits of a query against a negative queue that the training loop enqueues into
    in place, outside any segment, between the forward and the backward (as MoCo)."""

    def __init__(self, slots=256, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("queue", torch.randn(slots, dim))
        self.ptr = 0

    def forward(self, x):
        q = torch.nn.functional.normalize(self.proj(x), dim=1)
        return torch.log_softmax(q @ self.queue.t() / 0.07, dim=-1)

    def enqueue(self, keys):
        with torch.no_grad():
            n = keys.shape[0]
            self.queue[self.ptr : self.ptr + n] = keys
            self.ptr = (self.ptr + n) % self.queue.shape[0]


class ConstantScaled(nn.Module):
    """A tensor constant in the user's code: a graph compiled from it holds a real
    ``_tensor_constant`` (this module imports only torch, so a fresh interpreter can use it
    with or without the Inductor pass)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 1


# ------------------------------------------------------------------ planner tests

SLOW = os.environ.get("TORCH_REPLAY_SLOW", "0") == "1"


def slow(test):
    """Marks an opt-in full-size run (``-m slow``; runs only with TORCH_REPLAY_SLOW=1)."""
    skip = pytest.mark.skipif(not SLOW, reason="full-size run: set TORCH_REPLAY_SLOW=1")
    return pytest.mark.slow(skip(test))


def planner_core():
    """The C++ planner module of the compiled extension."""
    from torch_replay._ext import require_extension

    return require_extension().planner
