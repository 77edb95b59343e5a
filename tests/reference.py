"""Comparison helpers shared by the checkpoint tests (the reference is eager PyTorch
or torch.utils.checkpoint, computed in each test)."""

from __future__ import annotations

import torch


def storage_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.untyped_storage())


def grads(*tensors):
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y), (x - y).abs().max()
