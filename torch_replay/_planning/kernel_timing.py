"""Kernel timing: device time of a callable from CUPTI, with a clean fallback.

On a CUDA device the time a callable keeps the GPU busy is read from CUPTI
through ``torch.profiler`` (Kineto's CUPTI activity records: one record per
kernel, memcpy and memset, with device timestamps). That is the time the
calibration and the Inductor pass's CUDA guard report as ``kernel_s``: it
excludes launch gaps, Python overhead and synchronisation, which wall time
includes.

Fallbacks, each named in :attr:`KernelTiming.source` with the reason in
:attr:`KernelTiming.note`:

* ``"cupti"``: CUPTI records (torch.profiler, CUDA activity);
* ``"cuda-events"``: CUDA events around each call, when the profiler has no
  CUDA activity or records no device activity (CUPTI not loadable): elapsed
  device time including launch gaps;
* ``"wall"``: ``time.perf_counter`` around each call, on CPU or when CUDA is
  not available.

Usage::

    from torch_replay._planning.kernel_timing import time_kernels
    t = time_kernels(lambda: model(x), device="cuda", reps=3)
    t.seconds, t.source, t.kernels
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["KernelTiming", "cupti_status", "device_activity", "time_kernels"]

_DEVICE_KINDS = {"kernel": "kernels", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
"""Kineto activity types that occupy the device, and the counter each feeds."""


@dataclass(kw_only=True, slots=True)
class KernelTiming:
    """Device time of one call of a callable (see the module docstring)."""

    seconds: float
    """Per call: device-busy time (union of the device records' intervals) for
    ``cupti``, event-elapsed time for ``cuda-events``, wall time for ``wall``
    (median over the calls for the latter two)."""
    source: str
    """``"cupti"``, ``"cuda-events"`` or ``"wall"``."""
    wall_seconds: float
    """Per call wall time (median), synchronised on CUDA."""
    reps: int
    """Calls measured."""
    kernels: int = 0
    """Kernels per call (``cupti`` only)."""
    memcpy: int = 0
    """Device copies per call (``cupti`` only)."""
    memset: int = 0
    """Device memsets per call (``cupti`` only)."""
    kernel_sum_seconds: float = 0.0
    """Per call sum of the records' durations (``cupti`` only); above
    ``seconds`` when records overlap (several streams)."""
    top: list[tuple[str, float, int]] = field(default_factory=list)
    """Up to five costliest kernel names: (name, seconds per call, launches per call)."""
    note: str = ""
    """Why a fallback was used (empty for ``cupti``)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {**asdict(self), "top": [list(t) for t in self.top]}


def _activity(e) -> str:
    """The Kineto activity type of a profiler record. torch 2.11's records have no
    ``activity_type()``: there it is told from what Kineto names device copies and memsets
    (``Memcpy ...``, ``Memset ...``) and from ``is_user_annotation()``."""
    get = getattr(e, "activity_type", None)
    if get is not None:
        return str(get())
    name = e.name()
    if e.is_user_annotation():
        return "user_annotation"
    if e.device_type() == torch.autograd.DeviceType.CPU:
        return "cpu_op"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "kernel"


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total = 0
    end = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def device_activity(events: Iterable[Any], device_type: Any) -> dict[str, Any]:
    """Summarise Kineto records that ran on ``device_type``.

    Args:
        events: Kineto events (``prof.profiler.kineto_results.events()``):
            objects with ``name()``, ``device_type()``, ``activity_type()``,
            ``start_ns()`` and ``duration_ns()``.
        device_type: The ``torch.autograd.DeviceType`` to keep (``CUDA`` for
            GPU records; ``CPU`` lets tests drive this on any machine).

    Returns:
        ``{"busy_ns", "sum_ns", "kernels", "memcpy", "memset", "by_name"}``:
        the union and the sum of the kept records' intervals, counts per kind
        and ``{name: [ns, count]}`` for kernels. On ``CPU`` every ``cpu_op``
        record counts as a kernel (nested operators overlap, so only
        ``busy_ns`` is meaningful there).
    """
    kinds = dict(_DEVICE_KINDS)
    if device_type == torch.autograd.DeviceType.CPU:
        kinds["cpu_op"] = "kernels"
    out: dict[str, Any] = {"kernels": 0, "memcpy": 0, "memset": 0, "by_name": {}}
    intervals = []
    total = 0
    for e in events:
        if e.device_type() != device_type:
            continue
        kind = kinds.get(_activity(e))
        if kind is None:  # runtime calls, annotations (which would double count)
            continue
        start, dur = int(e.start_ns()), max(0, int(e.duration_ns()))
        intervals.append((start, start + dur))
        total += dur
        out[kind] += 1
        if kind == "kernels":
            slot = out["by_name"].setdefault(e.name(), [0, 0])
            slot[0] += dur
            slot[1] += 1
    out["busy_ns"] = _union_ns(intervals)
    out["sum_ns"] = total
    return out


def cupti_status() -> tuple[bool, str]:
    """Whether kernel times can come from CUPTI here, and why not.

    Returns:
        ``(available, reason)``; ``reason`` says what is missing.
    """
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        from torch.profiler import ProfilerActivity, supported_activities
    except ImportError as exc:  # pragma: no cover - very old torch
        return False, f"torch.profiler unavailable ({exc})"
    if ProfilerActivity.CUDA not in supported_activities():
        return False, "this torch's profiler has no CUDA activity (built without Kineto/CUPTI)"
    return True, "torch.profiler CUDA activity (Kineto/CUPTI)"


def _wall(fn: Callable[[], Any], reps: int, sync: bool) -> list[float]:
    out = []
    for _ in range(reps):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _events(fn: Callable[[], Any], reps: int) -> list[float]:  # pragma: no cover - GPU
    out = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def _cupti(fn: Callable[[], Any], reps: int) -> dict[str, Any]:  # pragma: no cover - GPU
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return device_activity(prof.profiler.kineto_results.events(), torch.autograd.DeviceType.CUDA)


def time_kernels(
    fn: Callable[[], Any], *, device: str | torch.device = "cuda", reps: int = 3, warmup: int = 1
) -> KernelTiming:
    """Time the device work of ``fn`` (see the module docstring for the sources).

    Args:
        fn: The work; called ``warmup + 2 * reps`` times on CUDA (``reps`` under
            the profiler, ``reps`` for wall time), ``warmup + reps`` elsewhere.
        device: Where ``fn`` runs: a CUDA device uses CUPTI when it can.
        reps: Measured calls (>= 1).
        warmup: Unmeasured calls first (lazy initialisation, autotuning).

    Returns:
        A :class:`KernelTiming` whose ``source`` names where the time came from.

    Raises:
        ValueError: ``reps`` < 1.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        on_cuda = False
        note = "CUDA requested but not available: wall time"
    else:
        note = "" if on_cuda else "not a CUDA device: wall time"
    for _ in range(warmup):
        fn()
    wall = statistics.median(_wall(fn, reps, on_cuda))
    if not on_cuda:
        return KernelTiming(seconds=wall, source="wall", wall_seconds=wall, reps=reps, note=note)
    ok, why = cupti_status()  # pragma: no cover - GPU from here on
    if ok:
        try:
            act = _cupti(fn, reps)
        except Exception as exc:  # the profiler failed: fall back, say why
            act, why = None, f"torch.profiler failed ({type(exc).__name__}: {exc})"
        if act is not None and act["kernels"] + act["memcpy"] + act["memset"] > 0:
            top = sorted(act["by_name"].items(), key=lambda kv: -kv[1][0])[:5]
            return KernelTiming(
                seconds=act["busy_ns"] / 1e9 / reps,
                source="cupti",
                wall_seconds=wall,
                reps=reps,
                kernels=round(act["kernels"] / reps),
                memcpy=round(act["memcpy"] / reps),
                memset=round(act["memset"] / reps),
                kernel_sum_seconds=act["sum_ns"] / 1e9 / reps,
                top=[(name, ns / 1e9 / reps, round(n / reps)) for name, (ns, n) in top],
            )
        if act is not None:
            why = "CUPTI recorded no device activity (is libcupti loadable? nvidia-cuda-cupti)"
    t = statistics.median(_events(fn, reps))
    return KernelTiming(seconds=t, source="cuda-events", wall_seconds=wall, reps=reps, note=why)
