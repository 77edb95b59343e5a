"""torch_replay's step time against torch.utils.checkpoint's, repeated in separate
processes: the rows that say whether being right costs anything (CPU, one thread).

    python -m benchmarks.bench_replay_speed                 # 5 processes, 2-3 minutes each
    python -m benchmarks.bench_replay_speed --quick         # 1 process, few rounds (smoke)
    python -m benchmarks.bench_replay_speed --out benchmarks/results/replay_speed.md
    python -m benchmarks.bench_replay_speed --heap system   # glibc left as it is
    python -m benchmarks.bench_replay_speed --groups llama --processes 10   # one group

Rows (each a ratio to torch's checkpoint of the same model, measured in the same rounds):

gpt:        the 6-block GPT-style model of benchmarks/bench_observer.py (d=256, dropout),
            every block checkpointed: no state, ``state=[block]`` under each engine,
            ``detect="preserve"`` with nothing declared, and ``verify="bytes"`` (the
            hashing level, Note [Verification levels]).
llama:      a Llama-style Hugging Face model (4 layers, hidden 256, sequence 256, batch 2,
            dropout 0.1), one model for every variant: transformers' own checkpointing against
            ``torch_replay.integrations.transformers.enable(model)`` (each layer declared)
            under each engine, and ``enable(model, replay_state=None)`` under
            ``detect="preserve"``.
small-op:   64 segments of a 6-operator block on 32x32, ``use_reentrant`` False and True.
segment:    64 one-operator segments (the fixed cost of a segment).
fit:        64 segments of k = 1, 4 and 16 operators (``torch.sin`` on 4 floats, which
            saves its input, so that the backward re-runs every segment),
            ``use_reentrant`` False and True, for torch's checkpoint, torch_replay at the
            default level and under ``detect="reads"``, and torch's under the observer's
            and the watch's do-nothing callbacks (the floors): a line through each step
            time against k splits it into a fixed cost per segment (the intercept) and a
            cost per operator of the segment (the slope: its forward, re-run and
            backward). Not in the default groups.
floors:     the small-op and segment chains (``use_reentrant=False``) under the other ways
            to see operators, beside the observer's floor: a RecordFunction callback given
            no arguments, one given inputs only, and a boxed dispatcher fallback on a mode
            key (Note [Other observation floors] in benchmarks/observer_floors.cpp, built
            on first use into build/bench_floors). Not in the default groups.

Every group also runs torch's own variant twice per round: the second one's ratio (the
A/A row) is what a ratio reads when nothing differs, the group's noise floor.

Each process runs interleaved rounds (every variant once per round, odd rounds in reverse
order) and reports, per row, the median over rounds of the variant's time over torch's time
in the same round. Two clocks: the process's CPU time (``time.process_time``; what a
quiet machine's wall time would be, since one thread computes) and wall time. The table
gives each process's median and their median. Memory beside the times: the bytes the
engines keep from forward to backward (``tr.engine_bytes()``) for ``state=[block]``, for
MoCo's queue enqueued between forward and backward, and under ``preserve`` on MoCo and on
the Llama model. Beside the ratios, per variant and step: kernel time, minor page faults
and garbage-collection time, which an instruction count does not see.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, child_env, emit, make_parser, run_module
from benchmarks.lib.counters import GCClock, process_counters
from benchmarks.lib.replay_steps import (
    FIT_OPS,
    FIT_ROWS,
    fit_steps,
    gpt_steps,
    kept_bytes,
    llama_steps,
    other_floors,
    segment_steps,
    small_op_steps,
)

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def measure_rounds(steps: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Per clock and variant: the median over rounds of its time over the first
    variant's time in the same round (the first round warms up); under ``"per_step"``,
    each variant's median per step of the counters of :func:`benchmarks.lib.counters.process_counters` (what instruction
    counts do not see: kernel time, page faults, garbage collection)."""
    times = {c: {k: [] for k in steps} for c in CLOCKS}
    gc_clock = GCClock()
    counted: dict[str, dict[str, list[float]]] = {k: {} for k in steps}
    try:
        for r in range(rounds + 1):
            order = list(steps.items())
            for name, step in order if r % 2 == 0 else order[::-1]:
                n0 = process_counters(gc_clock)
                t0 = {c: f() for c, f in CLOCKS.items()}
                step()
                t1 = {c: f() for c, f in CLOCKS.items()}
                n1 = process_counters(gc_clock)
                if r:
                    for c in CLOCKS:
                        times[c][name].append(t1[c] - t0[c])
                    for key in n0:
                        counted[name].setdefault(key, []).append(n1[key] - n0[key])
    finally:
        gc_clock.close()
    base = next(iter(steps))
    out = {}
    for c in CLOCKS:
        b = times[c][base]
        out[c] = {
            k: statistics.median(x / y for x, y in zip(v, b, strict=True))
            for k, v in times[c].items()
        }
        out[c]["base_s"] = statistics.median(b)
    out["per_step"] = {
        k: {key: statistics.median(v) for key, v in c.items()} for k, c in counted.items()
    }
    return out


def fit_lines(res: dict, segments: int = 64) -> dict:
    """Per variant of a fit group's ``measure_rounds`` result: the least-squares line of its
    CPU step time (its median ratio times torch's k=1 median) over k, as microseconds
    per segment (intercept) and per operator of a segment (slope)."""
    cpu = res["cpu"]
    out = {}
    for variant in FIT_ROWS:
        ys = [1e6 * cpu[f"{variant}, k={k}"] * cpu["base_s"] / segments for k in FIT_OPS]
        slope, intercept = statistics.linear_regression(FIT_OPS, ys)
        out[variant] = {"per_segment_us": intercept, "per_op_us": slope}
    return out


# ------------------------------------------------------------------ driver


GROUPS = ("gpt", "llama", "small-op", "segment")
ALL_GROUPS = (*GROUPS, "floors", "fit")  # ("floors" and "fit" only when named)


def child(rounds: int, seq: int, groups: tuple[str, ...] = GROUPS) -> dict:
    torch.set_num_threads(1)
    res = {}
    if "gpt" in groups:
        res["gpt"] = measure_rounds(gpt_steps(), rounds)
    if "llama" in groups:
        res["llama"] = measure_rounds(llama_steps(seq), rounds)
    for reentrant in (False, True):
        if "small-op" in groups:
            res[f"small-op, use_reentrant={reentrant}"] = measure_rounds(
                small_op_steps(reentrant), rounds
            )
        if "segment" in groups:
            res[f"segment, use_reentrant={reentrant}"] = measure_rounds(
                segment_steps(reentrant), rounds
            )
    if "floors" in groups:
        extra = other_floors()
        res["floors: small-op, use_reentrant=False"] = measure_rounds(
            small_op_steps(False, extra), rounds
        )
        res["floors: segment, use_reentrant=False"] = measure_rounds(
            segment_steps(False, extra), rounds
        )
    if "fit" in groups:
        for reentrant in (False, True):
            fit = measure_rounds(fit_steps(reentrant), rounds)
            fit["fit"] = fit_lines(fit)
            res[f"fit, use_reentrant={reentrant}"] = fit
    res["kept"] = kept_bytes(seq)
    res["heap"] = tr.heap_setting()
    return res


def markdown(runs: list[dict], command: str, rounds: int) -> str:
    n = len(runs)
    lines = [
        f"Command: `{command}`",
        "",
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, one thread; "
        f"{n} separate processes, {rounds} interleaved rounds each. Ratio: the median over "
        "rounds of the variant's step time over torch's checkpoint's in the same round; "
        "per process, then the median of the processes. CPU: the process's CPU time; "
        "wall: wall time (load from other jobs shows in wall time first).",
        "",
        f"glibc's heap (`tr.config.heap`, Note [Steady heap]): {runs[0]['heap'] or 'left as it is'}.",
        "",
    ]
    for group in (k for k in runs[0] if k not in ("kept", "heap")):
        base = runs[0][group]["cpu"]
        lines += [
            f"## {group}",
            "",
            "torch's step, CPU s (per process): "
            + " / ".join(f"{r[group]['cpu']['base_s']:.4f}" for r in runs),
            "",
            "| variant | ratio, CPU | per process, CPU | ratio, wall | per process, wall |",
            "| --- | --- | --- | --- | --- |",
        ]
        for v in (k for k in base if k not in ("torch", "base_s")):
            cells = []
            for c in ("cpu", "wall"):
                per = [r[group][c][v] for r in runs]
                cells += [f"{statistics.median(per):.3f}", " / ".join(f"{p:.3f}" for p in per)]
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Per step, medians (process 1): seconds in the kernel, minor page faults, seconds",
            "of garbage collection, full collections.",
            "",
            "| variant | kernel s | minor faults | GC s | full GCs |",
            "| --- | --- | --- | --- | --- |",
        ]
        for v, c in runs[0][group].get("per_step", {}).items():
            lines.append(
                f"| {v} | {c['sys_s']:.4f} | {c['minor_faults']:.0f} | {c['gc_s']:.4f} "
                f"| {c['gc_full']:.0f} |"
            )
        lines.append("")
        if "fit" in runs[0][group]:
            lines += _fit_table([r[group]["fit"] for r in runs])
    lines += ["## Bytes the engines keep from forward to backward", "", "| case | bytes |"]
    lines.append("| --- | --- |")
    for case, b in runs[0]["kept"].items():
        lines.append(f"| {case} | {b:,} |")
    return "\n".join(lines) + "\n"


def _fit_table(fits: list[dict]) -> list[str]:
    """The fit group's lines: per variant, the median over processes of its fixed cost
    per segment and cost per operator, and their ratios to torch's in each process."""
    lines = [
        "Lines through the step time against k (ratios above are to torch's k=1 step): "
        "the fixed cost of a segment and the cost of each of its operators, in CPU "
        "microseconds, the median over processes; beside each, the median over "
        "processes of its ratio to torch's in the same process.",
        "",
        "| variant | per segment, us | ratio to torch | per operator, us | ratio to torch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in fits[0]:
        cells = []
        for key in ("per_segment_us", "per_op_us"):
            cells.append(f"{statistics.median(f[v][key] for f in fits):.2f}")
            cells.append(f"{statistics.median(f[v][key] / f['torch'][key] for f in fits):.3f}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--processes", type=int, default=None, help="separate processes (5)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per process (15)")
    p.add_argument(
        "--heap",
        choices=("steady", "system"),
        default="steady",
        help="tr.config.heap in the measuring processes (default: steady, the default)",
    )
    p.add_argument(
        "--groups",
        nargs="+",
        choices=ALL_GROUPS,
        default=list(GROUPS),
        help="the groups of rows to run (default: all but floors; e.g. --groups llama for "
        "more processes of one group in the same time)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_out_quick(p, quick="1 process, 3 rounds, sequence 64")
    args = p.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)
    seq = 64 if args.quick else 256
    if args.child:
        print(json.dumps(child(rounds, seq, tuple(args.groups))))
        return 0
    runs = []
    for _ in range(args.processes or (1 if args.quick else 5)):
        child_args = ["--child", "--rounds", str(rounds), "--groups", *args.groups] + (
            ["--quick"] if args.quick else []
        )
        proc = run_module(
            "benchmarks.bench_replay_speed",
            child_args,
            env=child_env(TORCH_REPLAY_HEAP=args.heap),
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    command = "python -m benchmarks.bench_replay_speed " + " ".join(argv or sys.argv[1:])
    return emit(markdown(runs, command.strip(), rounds), args.out)


if __name__ == "__main__":
    sys.exit(main())
