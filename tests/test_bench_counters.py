"""The benchmarks' counters of what instruction counts miss (benchmarks/lib/counters.py) and
the reading of a callgrind file (benchmarks/lib/recording.py), against facts made here."""

from __future__ import annotations

import gc

import pytest

from benchmarks.lib.counters import GCClock, process_counters
from benchmarks.lib.recording import instructions, simulated, totals


def test_gc_clock_sees_a_full_collection_and_stops_when_closed():
    clock = GCClock()
    try:
        before = process_counters(clock)
        gc.collect()  # a generation-2 collection, made here
        after = process_counters(clock)
    finally:
        clock.close()
    assert after["gc_full"] - before["gc_full"] == 1
    assert after["gc_s"] > before["gc_s"]
    gc.collect()
    assert clock.collections[2] == after["gc_full"]  # closed: the next one is not seen


def test_minor_faults_count_pages_touched_here():
    clock = GCClock()
    try:
        before = process_counters(clock)
        # Above glibc's largest mmap threshold (32 MiB): fresh pages from the kernel, each
        # faulted in as it is first written (by 4 KiB page or by huge page).
        block = bytearray(64 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        after = process_counters(clock)
    finally:
        clock.close()
    assert after["minor_faults"] > before["minor_faults"]


def test_instructions_reads_the_last_total_not_the_header(tmp_path):
    data = tmp_path / "out.callgrind"
    data.write_text("version: 1\nevents: Ir\nsummary: 0\nfn=main\n1 5\ntotals: 1234\n")
    assert instructions(str(data)) == 1234
    data.write_text("version: 1\nevents: Ir\nsummary: 0\ntotals: 0\n")
    with pytest.raises(RuntimeError, match="no instruction"):
        instructions(str(data))


def test_totals_names_every_simulated_event_and_fills_trailing_zeros(tmp_path):
    data = tmp_path / "out.callgrind"
    data.write_text(
        "version: 1\nevents: Ir I1mr D1mr Bcm Bim\nsummary: 0\nfn=main\n1 5 1\ntotals: 900 12 7 3\n"
    )
    assert totals(str(data)) == {"Ir": 900, "I1mr": 12, "D1mr": 7, "Bcm": 3, "Bim": 0}


def test_simulated_events_of_a_recording_without_the_simulation_are_refused(tmp_path):
    data = tmp_path / "out.callgrind"
    data.write_text("version: 1\nevents: Ir\nsummary: 0\nfn=main\n1 5\ntotals: 1234\n")
    with pytest.raises(RuntimeError, match="no I1mr, D1mr, D1mw, DLmr, DLmw, Bcm, Bim"):
        simulated(str(data))


def test_symbol_table_lists_the_largest_differences_from_the_first_variant():
    from benchmarks.profilers.perf_symbols import GROUPS, markdown

    def row(symbols):
        r = {g: 0 for g, _ in GROUPS}
        r.update({"other": 0, "full collections": 0, "symbols": symbols})
        return r

    rows = {
        "torch": row({"libtorch a": 100, "libtorch b": 50}),
        "guard": row({"libtorch a": 100, "libtorch b": 20, "_C on_start": 70}),
    }
    table = markdown(rows, "cmd", tool="perf", model="small-ops", top=2)
    listed = table.split("guard minus torch")[1].splitlines()
    # on_start +70 and b -30, in that order; a (no difference) left out at top=2.
    assert [line for line in listed if line.startswith("| `")] == [
        "| `_C on_start` | +70.0 |",
        "| `libtorch b` | -30.0 |",
    ]
