"""Note [Storage keys] (csrc/aten/transaction.h): a run forgets the storages it made once
they die, before its next operator. What glibc reports shows that no StorageImpl is held
per dead intermediate, and a storage the run did not see made, at an address a forgotten
one had, counts as pre-existing state (its write is put back for the re-run, and the
gradient is eager's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.counters import GLIBC, heap_in_use


def _growth_in_forward(checkpoint, steps: int) -> int:
    """Bytes still handed out, inside the segment's forward, after it made and dropped
    ``steps`` intermediate tensors (each one storage); the re-run is not measured."""
    grown = []

    def segment(x):
        before = heap_in_use()
        h = x
        for _ in range(steps):
            h = h + 1  # the previous h dies here
        if not grown:
            grown.append(heap_in_use() - before)
        return h * x

    x = torch.randn(16, requires_grad=True)
    checkpoint(segment, x, use_reentrant=False).sum().backward()
    return grown[0]


@pytest.mark.skipif(not GLIBC, reason="reads glibc's mallinfo2")
def test_a_segment_holds_no_storage_per_dead_intermediate():
    """Against torch's checkpoint (which holds nothing of the forward's intermediates):
    5,000 intermediates made and dropped leave at most a few KiB more handed out. Before
    the run forgot dead storages, each one kept its StorageImpl (and its entry) until the
    forward's end: hundreds of KiB here."""
    steps = 5000
    torch_growth = _growth_in_forward(tcp.checkpoint, steps)
    ours = _growth_in_forward(tr.checkpoint, steps)
    assert ours - torch_growth < 32 * 1024, (ours, torch_growth)


def test_a_storage_not_seen_made_at_a_forgotten_address_counts_as_preexisting():
    """Inside the segment: a tensor made and dropped (its storage forgotten before the next
    operator), then numpy memory that existed before the segment wrapped with
    torch.from_numpy (no operator: not seen made), whose StorageImpl glibc gives the
    address the dropped one had. The segment doubles it in place and reads it. If the
    address made it pass for the segment's own, the re-run would double it again and
    compute from the doubled values; counted as pre-existing, its start bytes are put
    back for the re-run and its end bytes after: eager's gradient and eager's bytes."""
    start = np.linspace(0.5, 2.0, 8, dtype=np.float32)
    reused = []

    def run(checkpoint):
        arr = start.copy()

        def segment(x):
            dropped = []
            buf = None
            for _ in range(64):  # glibc's per-size cache may hold other blocks first
                t = x * 1.0
                dropped.append(t.untyped_storage()._cdata)
                del t
                x.is_same_size(x)  # an operator that makes no storage: the drop is seen
                buf = torch.from_numpy(arr)
                if buf.untyped_storage()._cdata in dropped:
                    break
            reused.append(buf.untyped_storage()._cdata in dropped)
            buf.mul_(2.0)
            return (x * buf).sum() + x.pow(2).sum()

        x = torch.linspace(-1.0, 1.0, 8, requires_grad=True)
        if checkpoint is None:
            segment(x).backward()
        else:
            checkpoint(segment, x, use_reentrant=False).backward()
        return x.grad, arr

    eager_grad, eager_arr = run(None)
    reused.clear()
    grad, arr = run(tr.checkpoint)
    assert torch.equal(grad, eager_grad)
    assert np.array_equal(arr, eager_arr)
    assert np.array_equal(arr, start * 2)  # written once, not once per run
    if GLIBC:
        # (The case this test is for: glibc's cache of freed blocks hands the forgotten
        # StorageImpl's memory to the next one of its size.)
        assert reused[0], "the forward's numpy storage did not take a forgotten address"


def test_a_preexisting_tensor_written_then_dropped_inside_the_segment():
    """The segment doubles a tensor that existed before it, then replaces it (the only
    reference to the written one dies inside the forward). Nothing can read the dropped
    storage again, so the forward's end and the re-run's start skip it (before, both
    failed on it with an internal "byte range outside its storage"); the gradient and
    the state after backward are eager's."""

    def run(checkpoint):
        holder = [torch.ones(4)]

        def segment(x):
            g = holder[0]
            g.mul_(2.0)
            holder[0] = torch.ones(4)
            return (x * g).sum()

        x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
        if checkpoint is None:
            segment(x).backward()
        else:
            checkpoint(segment, x, use_reentrant=False).backward()
        return x.grad, holder[0]

    eager_grad, eager_state = run(None)
    grad, state = run(tr.checkpoint)
    assert torch.equal(grad, eager_grad)
    assert torch.equal(state, eager_state)
