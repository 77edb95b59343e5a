"""The byte-range ops (torch.ops.torch_replay.*) against a plain-PyTorch reference,
with torch.library.opcheck and a torch.compile(fullgraph=True) smoke test."""

from __future__ import annotations

import pytest
import torch

import torch_replay  # noqa: F401  (registers the ops)

from .conftest import DEVICES

ops = torch.ops.torch_replay


def sample_inputs(device, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    for size in (1, 17, 1000):
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(device)
        cuts = sorted(set(torch.randint(0, size + 1, (6,), generator=g).tolist()))
        ranges = [[cuts[i], cuts[i + 1]] for i in range(0, len(cuts) - 1, 2)]
        yield data, torch.tensor(ranges or [[0, 0]], dtype=torch.int64).reshape(-1, 2)


def reference_gather(data, ranges):
    parts = [data[b:e] for b, e in ranges.tolist()]
    return torch.cat(parts) if parts else data[:0]


@pytest.mark.parametrize("device", DEVICES)
def test_gather_scatter_match_reference(device):
    for data, ranges in sample_inputs(device):
        total = int((ranges[:, 1] - ranges[:, 0]).sum())
        packed = ops.gather_ranges(data, ranges, total)
        assert torch.equal(packed, reference_gather(data, ranges))
        target = torch.zeros_like(data)
        ops.scatter_ranges_(target, ranges, packed)
        expect = torch.zeros_like(data)
        for b, e in ranges.tolist():
            expect[b:e] = data[b:e]
        assert torch.equal(target, expect)


@pytest.mark.parametrize("device", DEVICES)
def test_hash_detects_changes_inside_ranges_only(device):
    for data, ranges in sample_inputs(device, seed=1):
        h = ops.hash_ranges(data, ranges)
        covered = torch.zeros(data.numel(), dtype=torch.bool)
        for b, e in ranges.tolist():
            covered[b:e] = True
        for i in range(0, data.numel(), max(1, data.numel() // 7)):
            changed = data.clone()
            changed[i] ^= 1
            same = torch.equal(ops.hash_ranges(changed, ranges), h)
            assert same == (not covered[i].item())


def test_ranges_are_validated():
    data = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="sorted, disjoint"):
        ops.gather_ranges(data, torch.tensor([[4, 8], [2, 3]]), 5)
    with pytest.raises(RuntimeError, match="inside data"):
        ops.gather_ranges(data, torch.tensor([[4, 12]]), 8)
    with pytest.raises(RuntimeError, match="total"):
        ops.gather_ranges(data, torch.tensor([[0, 4]]), 3)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for data, ranges in sample_inputs(device):
        total = int((ranges[:, 1] - ranges[:, 0]).sum())
        torch.library.opcheck(ops.gather_ranges, (data, ranges, total))
        torch.library.opcheck(ops.hash_ranges, (data, ranges))
        src = ops.gather_ranges(data, ranges, total)
        torch.library.opcheck(ops.scatter_ranges_, (data.clone(), ranges, src))


def test_compile_fullgraph_smoke():
    data, ranges = next(iter(sample_inputs("cpu")))
    total = int((ranges[:, 1] - ranges[:, 0]).sum())

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(d, r):
        return ops.gather_ranges(d, r, total).to(torch.int32).sum()

    assert f(data, ranges).item() == reference_gather(data, ranges).to(torch.int32).sum().item()
