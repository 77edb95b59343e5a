"""Each training stack of docs/integrations.md, in its own loop: is torch_replay right, and
what does it cost next to the stack's own checkpointing? The rows and their models are
benchmarks/lib/stack_rows.py's (HF Trainer, TRL, PEFT, Lightning DDP and
ModelParallelStrategy, accelerate DDP and FSDP2 plugin, torchtitan dense and MoE, FSDP2
called from the root, torch.compile, save_on_cpu, timm); the distributed ones on two gloo
processes.

Correctness: two optimizer steps from the same initial model, no checkpointing (eager),
the stack's own checkpointing and torch_replay; the largest difference of the losses,
parameters and buffers from eager's, and whether torch_replay's equal the stack's bitwise
(where the stack's is right, drop-in means bitwise). Every gradient is compared in the
tests (tests/test_hf.py, test_recipes.py, test_distributed.py, test_torchtitan.py,
test_timm.py).

Time: CPU seconds a step (forward, backward, optimizer step, in the stack's loop; CPU time,
not wall time, so other jobs on the machine count less), one thread a process; in each
process, rounds that run a few steps of the stack's checkpointing and of torch_replay in
alternating order (the first step of each run left out); the ratio of the
medians per process, then the median (and range) over separate processes, the rows
interleaved across them.

    python -m benchmarks.bench_stacks                     # 3 processes a row, 5 rounds
    python -m benchmarks.bench_stacks --quick             # 1 process, 2 rounds
    python -m benchmarks.bench_stacks --rows fsdp2,accelerate-ddp   # some rows only
    python -m benchmarks.bench_stacks --out benchmarks/results/stacks.md

A row whose library cannot be imported is listed with the reason. timm needs a
torchvision built for the installed torch, which exists on this machine only for torch
2.14.1: scripts/timm_tests.sh makes that environment (ENV, default
~/.cache/torch_replay/timm/venv) and a copy of the tree with the extension built for it
(SRC, beside ENV), and

    python -m benchmarks.bench_stacks --python timm=ENV/bin/python --source timm=SRC

runs the timm row's processes there (refresh SRC with scripts/timm_tests.sh after
changing the tree); its row says under which torch it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import traceback

import torch

from benchmarks.lib.cli import add_out_quick, emit, make_parser, results_markdown, run_module
from benchmarks.lib.stack_rows import MODES, ROWS

STEPS_PER_RUN = 4  # the first of each run is left out of the times


def _max_diff(a, b) -> float:
    return max(((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True)
                if x.numel()), default=0.0)  # fmt: skip


def _bitwise(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _measure(name: str, rounds: int, tmp: str, rank: int = 0) -> dict:
    """This process's part of row ``name``: correctness after two steps, then the rounds."""
    row = ROWS[name]
    kwargs = {"rank": rank} if row.ranks > 1 else {}
    states = {}
    for mode in MODES:
        runner = row.make(mode, os.path.join(tmp, mode), **kwargs)
        runner.steps(2)
        states[mode] = runner.state()
    eager, stack, ours = states["eager"], states["stack"], states["tr"]
    loss = lambda s: [torch.tensor(x, dtype=torch.float64) for x in s[0]]  # noqa: E731
    out = {
        "stack_vs_eager": max(_max_diff(loss(stack), loss(eager)),
                              _max_diff(stack[1], eager[1]), _max_diff(stack[2], eager[2])),
        "tr_vs_eager": max(_max_diff(loss(ours), loss(eager)),
                           _max_diff(ours[1], eager[1]), _max_diff(ours[2], eager[2])),
        "tr_is_stack": _bitwise(ours[1], stack[1]) and _bitwise(ours[2], stack[2])
        and loss(ours) == loss(stack),
    }  # fmt: skip
    runners = {m: row.make(m, os.path.join(tmp, "t" + m), **kwargs) for m in ("stack", "tr")}
    for r in runners.values():
        r.steps(2)  # warm-up (compile, first allocations)
    times = {"stack": [], "tr": []}
    for i in range(rounds):
        for mode in ("stack", "tr") if i % 2 == 0 else ("tr", "stack"):
            times[mode] += runners[mode].steps(STEPS_PER_RUN)[1:]
    out["stack_s"] = statistics.median(times["stack"])
    out["tr_s"] = statistics.median(times["tr"])
    out["torch"] = torch.__version__
    return out


def _rank_worker(rank: int, name: str, rounds: int, tmp: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", init_method="file://" + os.path.join(tmp, "rendezvous"), rank=rank,
            world_size=ROWS[name].ranks,
        )  # fmt: skip
        result = _measure(name, rounds, tmp, rank)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(tmp, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # no interpreter finalization with gloo's threads alive


def _child(name: str, rounds: int) -> dict:
    """Row ``name`` in this process (its ranks spawned from here); rank 0's figures."""
    row = ROWS[name]
    why = row.missing()
    if why:
        return {"skipped": why}
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if row.ranks == 1:
            return _measure(name, rounds, tmp)
        import torch.multiprocessing as mp

        mp.start_processes(
            _rank_worker, args=(name, rounds, tmp), nprocs=row.ranks, start_method="spawn"
        )
        results = []
        for rank in range(row.ranks):
            with open(os.path.join(tmp, f"{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    for res in results:
        if "error" in res:
            return res
    return results[0]


def _row_options(parser: argparse.ArgumentParser, given: list[str], what: str) -> dict[str, str]:
    """``ROW=VALUE`` options, by row."""
    out = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or name not in ROWS or not value:
            parser.error(f"{what} takes ROW=VALUE with ROW one of {', '.join(ROWS)}: {item!r}")
        out[name] = value
    return out


def _cells(name: str, runs: list[dict], python: str | None = None) -> list[str]:
    row = ROWS[name]
    bad = [r for r in runs if "error" in r or "skipped" in r]
    if bad:
        why = bad[0].get("skipped") or bad[0]["error"].strip().splitlines()[-1]
        return [row.stack, row.line, "-", "-", "-", f"not run: {why}"]
    ratios = sorted(r["tr_s"] / r["stack_s"] for r in runs)
    first = runs[0]
    spread = f" ({ratios[0]:.3f}-{ratios[-1]:.3f})" if len(ratios) > 1 else ""
    where = ""
    if first["torch"] != torch.__version__:
        where = f"; under torch {first['torch']} (`{python}`)"
    return [
        row.stack, row.line, f"{first['stack_vs_eager']:.2e}", f"{first['tr_vs_eager']:.2e}",
        "yes" if first["tr_is_stack"] else "no",
        f"{statistics.median(ratios):.3f}{spread}; {1e3 * statistics.median(r['stack_s'] for r in runs):.1f} ms{where}",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, whole_doc=True)
    add_out_quick(parser)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    parser.add_argument("--processes", type=int, default=3, help="separate processes a row")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a process")
    parser.add_argument(
        "--python", action="append", default=[], metavar="ROW=PATH",
        help="run row ROW's processes with this interpreter (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--source", action="append", default=[], metavar="ROW=DIR",
        help="... from this copy of the tree, its extension built for that interpreter's torch",
    )  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one row in this process
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.rounds)))
        return 0
    names = args.rows.split(",")
    for n in names:
        if n not in ROWS:
            parser.error(f"unknown row {n!r}; the rows: {', '.join(ROWS)}")
    pythons = _row_options(parser, args.python, "--python")
    sources = _row_options(parser, args.source, "--source")
    processes, rounds = (1, 2) if args.quick else (args.processes, args.rounds)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for p in range(processes):  # rows interleaved across processes
        for n in names:
            done = run_module(
                "benchmarks.bench_stacks", ["--child", n, "--rounds", str(rounds)],
                python=pythons.get(n), root=sources.get(n),
            )  # fmt: skip
            try:
                runs[n].append(json.loads(done.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                runs[n].append({"error": (done.stderr or "no output").strip()[-400:]})
            print(f"process {p + 1}/{processes}, {n}: done", file=sys.stderr, flush=True)
    header = ["stack", "one line", "stack's own vs eager (max abs diff)",
              "torch_replay vs eager", "torch_replay == stack's own, bitwise",
              "step time torch_replay / stack's own (range); stack's step"]  # fmt: skip
    about = (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, one "
        f"thread a process; {processes} processes a row, {rounds} rounds of "
        f"{STEPS_PER_RUN - 1} timed steps each a process; two optimizer steps for the "
        "correctness columns (losses, parameters, buffers)."
    )
    given = list(argv if argv is not None else sys.argv[1:])
    given = [a for i, a in enumerate(given)
             if not a.startswith("--out") and (i == 0 or given[i - 1] != "--out")]  # fmt: skip
    command = " ".join(["python -m benchmarks.bench_stacks", *given])
    rows = (_cells(n, runs[n], pythons.get(n)) for n in names)
    return emit(results_markdown(command, about, header, rows), args.out)


if __name__ == "__main__":
    sys.exit(main())
