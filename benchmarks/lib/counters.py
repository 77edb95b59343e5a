"""What a step costs besides its instructions, counted inside the process: time in the
cyclic garbage collector, time in the kernel, minor page faults, and the heap glibc has
handed out.

Instruction counts (``perf_symbols --tool callgrind``) see neither the kernel's work
(page faults, memory returned to the system and faulted back in) nor, over a window of a
few steps, a full collection that falls outside it; these counters name both when two
variants' times differ by more than their instructions do.
"""

from __future__ import annotations

import ctypes
import gc
import platform
import resource
import time

__all__ = ["GCClock", "GLIBC", "heap_in_use", "process_counters"]

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
"""Whether the C library is glibc (``heap_in_use`` reads its ``mallinfo2``)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_in_use() -> int:
    """Bytes glibc has handed out and not had back (heap and mapped blocks); 0 where the
    C library is not glibc."""
    if not GLIBC:
        return 0
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class GCClock:
    """Seconds and collections of the cyclic garbage collector (``gc.callbacks``) from
    construction on; ``close()`` unregisters it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]  # per generation
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def process_counters(gc_clock: GCClock) -> dict[str, float]:
    """The process's totals so far: seconds in the kernel, minor page faults, seconds of
    garbage collection and full (generation 2) collections."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "sys_s": ru.ru_stime,
        "minor_faults": ru.ru_minflt,
        "gc_s": gc_clock.seconds,
        "gc_full": gc_clock.collections[2],
    }
