"""Per-call cost of many tiny checkpointed segments, torch_replay vs torch (CPU).

    python -m benchmarks.bench_small_calls [--calls 2000] [--reps 7] [--out FILE.md]

The workload of PyTorch's own ``test_checkpointing`` / ``test_checkpointing_without_reentrant``
tests: ``calls`` segments of Linear(10, 1000) - ReLU - Linear(1000, 10) on one row each,
then one backward through the mean of all outputs. One repetition = forward of every call
+ backward; the methods run interleaved, the median over ``reps`` is reported, with the
per-call time and the ratio to torch.utils.checkpoint measured in the same run. Rows:
use_reentrant False / True, and torch_replay's observer on (default) and off
(``tr.config.observe = False``). Nothing is written unless ``--out`` is given.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, emit, make_parser, results_markdown


def one_rep(module, data, ckpt, reentrant: bool) -> float:
    module.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    outs = [ckpt(module, d, use_reentrant=reentrant) for d in data]
    torch.stack(outs).mean().backward()
    return time.perf_counter() - t0


def run(calls: int, reps: int) -> list[dict]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(10, 1000), nn.ReLU(), nn.Linear(1000, 10))
    data = [torch.rand(1, 10, requires_grad=True) for _ in range(calls)]
    rows = []
    for reentrant in (False, True):
        for observe in (True, False):
            methods = {"torch": tcp.checkpoint, "torch_replay": tr.checkpoint}
            times: dict[str, list[float]] = {k: [] for k in methods}
            for rep in range(reps + 1):  # the first is a warm-up
                for name, ckpt in methods.items():
                    with tr.config.patch(observe=observe):
                        t = one_rep(module, data, ckpt, reentrant)
                    if rep:
                        times[name].append(t)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append(
                {
                    "use_reentrant": reentrant,
                    "observe": observe,
                    "torch_us_per_call": 1e6 * med["torch"] / calls,
                    "ours_us_per_call": 1e6 * med["torch_replay"] / calls,
                    "ratio": med["torch_replay"] / med["torch"],
                }
            )
    return rows


def markdown(rows: list[dict], calls: int, reps: int) -> str:
    return results_markdown(
        f"python -m benchmarks.bench_small_calls --calls {calls} --reps {reps}",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; "
        f"{calls} calls of Linear(10,1000)-ReLU-Linear(1000,10) on one row, forward + backward, "
        f"median of {reps} interleaved repetitions.",
        ["use_reentrant", "observer", "torch µs/call", "torch_replay µs/call", "ratio"],
        (
            [r["use_reentrant"], "on" if r["observe"] else "off"]
            + [f"{r['torch_us_per_call']:.1f}", f"{r['ours_us_per_call']:.1f}", f"{r['ratio']:.2f}"]
            for r in rows
        ),
    )


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__, whole_doc=True)
    p.add_argument("--calls", type=int, default=2000, help="segments per repetition")
    p.add_argument("--reps", type=int, default=7, help="measured repetitions (plus a warm-up)")
    add_out_quick(p, quick=None)
    a = p.parse_args(argv)
    md = markdown(run(a.calls, a.reps), a.calls, a.reps)
    return emit(md, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
