"""Kernel timing (torch_replay/_planning/kernel_timing.py): CUPTI on CUDA, wall time elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType

from torch_replay._planning.kernel_timing import cupti_status, device_activity, time_kernels

from .conftest import DEVICES


class _Event:
    def __init__(self, name, device, kind, start, dur):
        self._v = (name, device, kind, start, dur)

    def name(self):
        return self._v[0]

    def device_type(self):
        return self._v[1]

    def activity_type(self):
        return self._v[2]

    def start_ns(self):
        return self._v[3]

    def duration_ns(self):
        return self._v[4]


def test_device_activity_unions_overlaps_and_ignores_host_records():
    cuda = DeviceType.CUDA
    events = [
        # kernels on two streams:  a [0,10)  b [5,20)  c [30,40)  -> busy 30, sum 35
        _Event("a", cuda, "kernel", 0, 10),
        _Event("b", cuda, "kernel", 5, 15),
        _Event("c", cuda, "kernel", 30, 10),
        _Event("copy", cuda, "gpu_memcpy", 40, 5),
        _Event("zero", cuda, "gpu_memset", 50, 1),
        _Event("ann", cuda, "gpu_user_annotation", 0, 100),  # spans kernels: not counted
        _Event("cudaLaunchKernel", DeviceType.CPU, "cuda_runtime", 0, 1000),
        _Event("a", cuda, "kernel", 60, 4),
    ]
    act = device_activity(events, cuda)
    assert act["busy_ns"] == 30 + 5 + 1 + 4
    assert act["sum_ns"] == 10 + 15 + 10 + 5 + 1 + 4
    assert (act["kernels"], act["memcpy"], act["memset"]) == (4, 1, 1)
    assert act["by_name"] == {"a": [14, 2], "b": [15, 1], "c": [10, 1]}


def test_device_activity_reads_real_profiler_records():
    # The same reader on a CPU trace: proves the Kineto record methods it calls
    # exist in this torch (the CUDA path reads the same objects).
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            a @ a
    act = device_activity(prof.profiler.kineto_results.events(), DeviceType.CPU)
    assert act["kernels"] >= 3
    assert act["by_name"]["aten::mm"][1] == 3
    assert 0 < act["busy_ns"] <= act["sum_ns"]


def test_wall_fallback_off_cuda_counts_calls_and_says_why():
    calls = []
    t = time_kernels(lambda: calls.append(1), device="cpu", reps=4, warmup=2)
    assert len(calls) == 6
    assert t.source == "wall" and t.reps == 4 and t.kernels == 0
    assert "not a CUDA device" in t.note
    assert t.seconds == t.wall_seconds >= 0
    assert set(t.as_dict()) >= {"seconds", "source", "note", "top"}


def test_reps_must_be_positive():
    with pytest.raises(ValueError, match="reps"):
        time_kernels(lambda: None, device="cpu", reps=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU")
def test_cupti_status_without_gpu_says_why():
    ok, why = cupti_status()
    assert not ok and "no CUDA device" in why
    t = time_kernels(lambda: None, device="cuda", reps=1, warmup=0)
    assert t.source == "wall" and "not available" in t.note


@pytest.mark.cuda
def test_cuda_kernels_come_from_cupti():
    ok, why = cupti_status()
    assert ok, why
    a = torch.randn(2048, 2048, device="cuda")
    t = time_kernels(lambda: a @ a, device="cuda", reps=3)
    assert t.source == "cupti", t.note
    assert t.kernels >= 1 and t.top
    # Device-busy time of a 2048^3 matmul: positive and below the synchronised wall time.
    assert 0 < t.seconds <= t.wall_seconds * 1.05
    assert t.kernel_sum_seconds >= t.seconds * 0.999


@pytest.mark.parametrize("device", DEVICES)
def test_time_kernels_on_each_device(device):
    x = torch.randn(512, 512, device=device)
    t = time_kernels(lambda: (x @ x).sum(), device=device, reps=2, warmup=1)
    assert t.seconds > 0
    assert t.source == ("cupti" if device == "cuda" else "wall"), t.note
