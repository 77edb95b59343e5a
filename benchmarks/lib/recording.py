"""Recording a process for the profilers: perf attached to it, or valgrind's callgrind
instrumentation switched on and off around the measured steps, and reading callgrind's
totals back.

Shared by ``bench_compile`` (its child records its first step under ``count_compile``) and
the profilers of ``benchmarks/profilers``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

__all__ = ["SIMULATED", "instructions", "simulated", "start_recording", "stop_recording", "totals"]


def start_recording(tool: str, data: str | None):
    """Starts recording this process: perf attached to it, or callgrind's instrumentation
    (the process runs under valgrind)."""
    if tool == "callgrind":
        subprocess.run(
            ["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True
        )
        return None
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-F", "999", "-p", str(os.getpid()), "-o", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # (perf attaches)
    return perf


def stop_recording(tool: str, perf) -> None:
    """Stops what :func:`start_recording` started (``perf``: what it returned)."""
    if tool == "callgrind":
        subprocess.run(
            ["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True
        )
        return
    perf.send_signal(signal.SIGINT)
    perf.wait()


def totals(data: str) -> dict[str, int]:
    """Every event callgrind counted (``Ir``, and ``I1mr``, ``Bcm``... under
    ``--cache-sim``/``--branch-sim``), from its last ``totals:`` line, named by its
    ``events:`` line (the ``summary:`` line of the header is written before the
    instrumentation is turned on, as 0)."""
    with open(data) as f:
        text = f.read()
    events = re.findall(r"^events:\s+(.*)$", text, re.M)
    found = re.findall(r"^totals:\s+(.*)$", text, re.M)
    if not events or not found:
        return {}
    counts = [int(n) for n in found[-1].split()]
    names = events[-1].split()
    return dict(zip(names, counts + [0] * (len(names) - len(counts)), strict=True))


def instructions(data: str) -> int:
    """The instructions callgrind counted (``totals``' ``Ir``)."""
    n = totals(data).get("Ir", 0)
    if n == 0:
        raise RuntimeError(f"callgrind counted no instruction in {data}")
    return n


# callgrind's simulated events (--cache-sim=yes --branch-sim=yes): valgrind's model of a
# 32 KiB L1 instruction / data cache, the last-level cache and the branch predictors,
# not this CPU's; what an instruction count cannot tell apart (the same instructions run
# at different speeds when they miss the caches or mispredict more).
SIMULATED = (
    ("Ir", "instructions"),
    ("I1mr", "L1 instruction-cache misses"),
    ("D1mr", "L1 data-cache read misses"),
    ("D1mw", "L1 data-cache write misses"),
    ("DLmr", "last-level data-cache read misses"),
    ("DLmw", "last-level data-cache write misses"),
    ("Bcm", "mispredicted conditional branches"),
    ("Bim", "mispredicted indirect branches"),
)


def simulated(data: str) -> dict[str, int]:
    """The recording's totals of SIMULATED's events."""
    counted = totals(data)
    missing = [e for e, _ in SIMULATED if e not in counted]
    if missing:
        raise RuntimeError(f"callgrind recorded no {', '.join(missing)} in {data}")
    return {e: counted[e] for e, _ in SIMULATED}
