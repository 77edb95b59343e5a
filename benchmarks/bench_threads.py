"""Why a calibration grid's step times swing on a shared machine: torch threads vs load.

    python -m benchmarks.bench_threads [--rounds 6] [--steps 8] [--threads 1,2] [--quick]
                                       [--out FILE.md]

Two neighbouring shapes of ``configs/cpu.yaml``'s grid (16 MiB buffer, 4 live versions,
write ratios 0.01 and 0.1, every segment eager) run in fresh processes, one per (shape,
thread count) and round, interleaved in a rotated order. Each process builds the
workload, runs one warm-up step and ``--steps`` timed training steps
(``SegmentRunner.profile_step``, as the grid measures them) and records per step the
wall time (``time.perf_counter``), the process CPU time (``time.process_time``), the
minor page faults and the involuntary context switches (``getrusage``).

What it shows: with as many OpenMP threads as cores and other work on the machine, a
thread of a parallel region is preempted and the others wait for it at the region's
barrier (spinning: CPU time grows with wall), so one step can take tens of times
another of the same shape; with one thread the step's CPU time is stable and its wall
time grows only by the time it waits for a core. The load average is printed; the
effect needs a loaded machine (the 2-core machine shared with other builds).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time

from benchmarks.lib.cli import add_out_quick, emit, make_parser, markdown_table, run_module

SHAPES = ((16.0, 0.01, 4), (16.0, 0.1, 4))
"""(buffer MiB, write ratio, live versions): the grid's batch 64, width 512, expand 4."""


def child(mib: float, ratio: float, versions: int, threads: int, steps: int) -> dict:
    """One process: per-step wall, CPU, faults and involuntary switches."""
    import torch

    from torch_replay import calibrate as cal
    from torch_replay._planning.runner import SegmentRunner

    torch.set_num_threads(threads)
    w = cal.buffer_workload(
        segments=versions, buffer_mib=mib, write_ratio=ratio, batch=64, width=512, expand=4
    )
    model = SegmentRunner(w.segments, state=w.state, choices=["eager"] * versions)
    rows = []
    for i in range(steps + 1):  # the first step is the warm-up
        for p in model.parameters():
            p.grad = None
        x = w.make_input()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0, c0 = time.perf_counter(), time.process_time()
        model.profile_step(x, w.loss_fn, track_memory=False)
        t1, c1 = time.perf_counter(), time.process_time()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if i:
            rows.append(
                {
                    "wall": t1 - t0,
                    "cpu": c1 - c0,
                    "faults": r1.ru_minflt - r0.ru_minflt,
                    "switches": r1.ru_nivcsw - r0.ru_nivcsw,
                }
            )
    return {"steps": rows}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(s[key] for r in runs for s in r["steps"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        mib, ratio, versions, threads, steps = argv[1:6]
        res = child(float(mib), float(ratio), int(versions), int(threads), int(steps))
        print(json.dumps(res))
        return 0
    p = make_parser(__doc__)
    add_out_quick(p, quick="2 rounds of 3 steps")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", default="1,2")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.steps = 2, 3
    threads = [int(t) for t in a.threads.split(",")]
    configs = [(s, t) for s in SHAPES for t in threads]
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    load = os.getloadavg()
    for r in range(a.rounds):
        for shape, t in configs[r % len(configs) :] + configs[: r % len(configs)]:
            args = ["_child", *map(str, shape), str(t), str(a.steps)]
            out = run_module("benchmarks.bench_threads", args)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            runs[(shape, t)].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
    after = os.getloadavg()
    rows = []
    for (shape, t), rs in runs.items():
        walls = [s["wall"] for r in rs for s in r["steps"]]
        base = runs[(shape, threads[0])]
        rows.append(
            [
                f"{shape[0]:g}",
                f"{shape[1]:g}",
                shape[2],
                t,
                f"{_median(rs, 'wall') * 1e3:.1f}",
                f"{min(walls) * 1e3:.1f} / {max(walls) * 1e3:.1f}",
                f"{_median(rs, 'cpu') * 1e3:.1f}",
                f"{_median(rs, 'wall') / _median(base, 'wall'):.2f}",
                f"{_median(rs, 'faults'):g}",
                f"{_median(rs, 'switches'):g}",
            ]
        )
    header = [
        "buffer MiB",
        "write ratio",
        "live versions",
        "torch threads",
        "median step wall ms",
        "min / max step wall ms",
        "median step CPU ms",
        f"wall / {threads[0]} thread(s)",
        "median minor faults",
        "median involuntary switches",
    ]
    command = "python -m benchmarks.bench_threads " + " ".join(argv)
    text = "\n".join(
        [
            f"Command: `{command.strip()}`",
            "",
            f"{os.cpu_count()} CPUs (shared); {a.rounds} fresh processes per row, "
            f"{a.steps} timed steps each (after one warm-up), every segment eager; "
            f"1-minute load average {load[0]:.1f} before, {after[0]:.1f} after.",
            "",
            *markdown_table(header, rows),
        ]
    )
    return emit(text + "\n", a.out)


if __name__ == "__main__":
    raise SystemExit(main())
