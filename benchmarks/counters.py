"""What a step costs besides its instructions, counted inside the process: time in the
cyclic garbage collector, time in the kernel, minor page faults.

Instruction counts (``perf_symbols --tool callgrind``) see neither the kernel's work
(page faults, memory returned to the system and faulted back in) nor, over a window of a
few steps, a full collection that falls outside it; these counters name both when two
variants' times differ by more than their instructions do.
"""

from __future__ import annotations

import gc
import resource
import time

__all__ = ["GCClock", "process_counters"]


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
