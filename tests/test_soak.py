"""Memory stays flat over a thousand training steps at every ``detect`` level
(benchmarks/bench_soak.py, each run in a fresh process).

Before the journal registry let go of storages no journal entry, watch or mark needs,
every segment under ``detect="preserve"`` left one entry per fresh input storage: about
180 bytes of heap per segment and step (715 B a step for these four segments), with
``tr.engine_bytes()`` at 0 throughout."""

from __future__ import annotations

import json

import pytest

from benchmarks.lib.cli import run_module
from benchmarks.lib.counters import GLIBC

STEPS = 1000
# A leak of one small heap block per segment and step is >= 4 * 32 bytes a step here;
# Python's own noise over a thousand steps is well under a byte a step.
MAX_HEAP_PER_STEP = 16.0


@pytest.mark.skipif(not GLIBC, reason="reads glibc's mallinfo2 heap statistics")
@pytest.mark.parametrize(
    ("model", "level"),
    [("plain", "reads"), ("plain", "preserve"), ("plain", "saved"), ("moco", "preserve")],
)
def test_heap_and_engine_bytes_flat(model, level):
    done = run_module(
        "benchmarks.bench_soak",
        ["--json", "--steps", str(STEPS), "--warmup", "100", "--model", model, "--level", level],
    )
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["heap_per_step"] < MAX_HEAP_PER_STEP, r
    assert r["engine_bytes_end"] <= r["engine_bytes_start"], r
