"""Where torch_replay's step time goes beside torch.utils.checkpoint's, symbol by symbol
(Linux ``perf``, CPU, one thread): the GPT-style model of bench_replay_speed.py, one
process per variant under ``perf record``, samples grouped by what they are.

    python -m benchmarks.perf_symbols                     # torch, auto, preserve; 20 steps
    python -m benchmarks.perf_symbols --variants torch guard --steps 40
    python -m benchmarks.perf_symbols --out benchmarks/results/perf_symbols.md
    python -m benchmarks.perf_symbols --tool callgrind --steps 2   # instruction counts
    python -m benchmarks.perf_symbols --model llama --seq 64 --tool callgrind --steps 2 \
        --variants torch nostate guard auto    # the Llama model of bench_replay_speed
    python -m benchmarks.perf_symbols --model llama --seq 64 --tool callgrind --cache-sim \
        --steps 2 --variants floor guard --top 20   # above the observation floor
    python -m benchmarks.perf_symbols --model gpt-small --tool callgrind --steps 3 \
        --variants torch nostate guard preserve   # per-operator costs, a few minutes
    python -m benchmarks.perf_symbols --model small-ops --tool callgrind --steps 5 \
        --variants torch nostate torch-reentrant nostate-reentrant   # bench_observer's rows

Samples are normalised by each run's samples in MKL's sgemm kernels (the same matrix work
in every variant), so a group's figure reads "samples per unit of model work": the
difference to torch's row is what the variant adds, whatever the load on the machine.

``--tool callgrind`` counts instructions instead (valgrind's callgrind, instrumentation on
for the measured steps only): exact and the same on a loaded machine as on a quiet one,
though an instruction of a cache-missing map lookup costs more time than one of sgemm.

Python's cyclic collector runs a full (generation 2) collection every so many surviving
allocations, wherever in the program they land: one that falls inside the sampled steps of
one variant and in the warm-up of another is a difference of where, not of what. So each
process collects fully before it samples, and the table counts the full collections that
still ran inside the sampled steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch

import torch_replay as tr
from benchmarks.lib.cli import ROOT, add_out_quick, child_env, emit, make_parser
from benchmarks.lib.counters import GCClock
from benchmarks.lib.recording import SIMULATED, simulated, start_recording, stop_recording

GROUPS = (  # (group, regular expression on "dso symbol"), first match wins
    ("model work (sgemm)", r"sgemm"),
    ("torch_replay extension", r"^_C\.cpython"),
    (
        "RecordFunction and boxing",
        r"RecordFunction|boxArgs|IValue|CaptureKernelCall|getStepCallbacks",
    ),
    ("Python GC", r"gc_collect|visit_decref|visit_reachable"),
    ("Python interpreter", r"^libpython"),
    ("allocator (malloc/free)", r"malloc|_int_free|cfree|free@|unlink_chunk|memalign"),
    ("other torch kernels and dispatch", r"^libtorch|^libc10"),
    ("kernel (page faults, scheduling)", r"\[kernel"),
)


def _gpt_step(variant: str, small: bool = False) -> Callable[[], None]:
    """bench_replay_speed's GPT-style rows (``small``: d=64, sequence 16, batch 2, where
    the per-operator costs are most of the step and callgrind takes minutes)."""
    from benchmarks.lib.replay_steps import gpt_steps

    key = {"torch": "torch", "nostate": "no state", "preserve": 'detect="preserve"'}
    steps = gpt_steps(64, 16, 2) if small else gpt_steps()
    return steps[key.get(variant, f"state=[block], {variant}")]


def _llama_step(variant: str, seq: int) -> Callable[[], None]:
    """bench_replay_speed's Llama rows: transformers' model, every layer checkpointed;
    ``floor``: transformers' own checkpointing under the do-nothing callbacks of the
    observer and the write watch (Note [Observation floor])."""
    from benchmarks.lib.replay_steps import llama_step

    if variant == "torch":
        return llama_step(seq, "torch")
    if variant == "floor":
        return llama_step(seq, "floor")
    if variant in ("nostate", "preserve"):
        return llama_step(seq, "tr", replay_state=None)
    return llama_step(seq, "tr", replay_engine=variant)


def _chain_step(variant: str, model: str) -> Callable[[], None]:
    """bench_observer's chains of 64 segments: six operators on a 32 x 32 tensor
    ("small-ops") or one on 4 floats ("segments", the fixed cost of a segment);
    ``torch`` / ``nostate``, each ``-reentrant`` too."""
    import torch.utils.checkpoint as tcp

    from benchmarks.lib.replay_steps import chain_step as chain

    base, _, reentrant = variant.partition("-")
    if base not in ("torch", "nostate") or reentrant not in ("", "reentrant"):
        raise SystemExit(f"{model}: variants are torch, nostate and their -reentrant forms")
    ckpt = tcp.checkpoint if base == "torch" else tr.checkpoint
    if model == "small-ops":
        x = torch.randn(32, 32, requires_grad=True)

        def block(a):
            return torch.tanh(a * 0.9 + 0.1).sigmoid() * a - 0.01

    else:
        x = torch.randn(4, requires_grad=True)

        def block(a):
            return a * 2.0

    return chain(ckpt, block, x, 64, bool(reentrant))


def _step(
    variant: str, steps: int, data: str, tool: str = "perf", model: str = "gpt", seq: int = 256
) -> None:
    torch.set_num_threads(1)
    if variant == "preserve":
        tr.config.detect = "preserve"
    if model == "llama":
        step = _llama_step(variant, seq)
    elif model in CHAINS:
        step = _chain_step(variant, model)
    else:
        step = _gpt_step(variant, small=model == "gpt-small")
    for i in range(steps + 2):
        if i == 2:  # two warm-up steps first; then this process samples itself
            gc.collect()  # (the warm-up's garbage is not the sampled steps')
            collections = GCClock()  # generation-2 collections inside the sampled steps
            perf = start_recording(tool, data)
        step()
    stop_recording(tool, perf)
    collections.close()
    with open(data + ".gc", "w") as f:
        json.dump({"full collections": collections.collections[2]}, f)


def _output(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _symbols(tool: str, data: str):
    """(count, dso, symbol) of every symbol the recording holds."""
    if tool == "callgrind":
        report = _output(["callgrind_annotate", "--threshold=100", "--show=Ir", data])
        for line in report.splitlines():
            m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*?)\s+\[(.*)\]$", line)
            if m:
                sym = m.group(2).split(":", 1)[-1]
                yield int(m.group(1).replace(",", "")), os.path.basename(m.group(3)), sym
        return
    report = _output(["perf", "report", "-i", data, "-n", "--sort", "dso,sym", "--stdio"])
    for line in report.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[.\]\s+(.*)", line)
        if m:
            yield int(m.group(1)), m.group(2), m.group(3)


def _record(
    variant: str,
    steps: int,
    tmp: str,
    tool: str = "perf",
    model: str = "gpt",
    seq: int = 256,
    cache_sim: bool = False,
) -> dict[str, int]:
    data = os.path.join(tmp, f"{variant}.data")
    child = ["-m", "benchmarks.perf_symbols", "--child", variant, str(steps), data]
    child += ["--tool", tool, "--model", model, "--seq", str(seq)]
    cmd = [sys.executable, *child]
    if tool == "callgrind":
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={data}",
            *(["--cache-sim=yes", "--branch-sim=yes"] if cache_sim else []),
            *cmd,
        ]
    subprocess.run(cmd, cwd=ROOT, env=child_env(), check=True, capture_output=True)
    counts = {g: 0 for g, _ in GROUPS}
    counts["other"] = 0
    counts["symbols"] = {}
    with open(data + ".gc") as f:
        counts["full collections"] = json.load(f)["full collections"]
    for n, dso, sym in _symbols(tool, data):
        text = f"{dso} {sym}"
        counts["symbols"][text] = counts["symbols"].get(text, 0) + n
        for g, rx in GROUPS:
            if re.search(rx, text) or re.search(rx, dso):
                counts[g] += n
                break
        else:
            counts["other"] += n
    if cache_sim:
        counts["simulated"] = simulated(data)
    return counts


MODELS = {
    "gpt": "GPT-style model, 6 blocks, d=256, every block checkpointed",
    "gpt-small": "GPT-style model, 6 blocks, d=64, sequence 16, batch 2, every block checkpointed",
    "llama": "transformers' Llama, 4 layers, hidden 256, batch 2, every layer checkpointed "
    "through torch_replay.integrations.transformers.enable (torch: HF's own)",
    "small-ops": "64 checkpointed segments of six operators on a 32 x 32 tensor "
    "(bench_observer's small-operator rows)",
    "segments": "64 checkpointed one-operator segments on 4 floats (bench_observer's fixed "
    "cost per segment)",
}
# Models without matrix work: their table counts thousands of instructions per step.
CHAINS = ("small-ops", "segments")


def markdown(
    rows: dict[str, dict[str, int]],
    command: str,
    tool: str = "perf",
    model: str = "gpt",
    steps: int = 1,
    top: int = 0,
) -> str:
    names = list(rows)
    unit = "instructions (callgrind)" if tool == "callgrind" else "perf samples"
    if model in CHAINS and tool == "callgrind":  # (no matrix work to count by)
        per = f"{unit}, thousands per step ({steps} steps recorded)"
    elif model in CHAINS:
        per = f"{unit} over the {steps} recorded steps"
    else:
        per = f"{unit} per 1,000 of sgemm (the model's matrix work, equal in every variant)"
    lines = [
        f"Command: `{command}`",
        "",
        f"{per}; {MODELS[model]}, one thread.",
        "",
        "| group | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    groups = [g for g, _ in GROUPS] + ["other"]
    totals = {v: sum(c[g] for g in groups) for v, c in rows.items()}

    def scaled(v: str, n: int) -> float:
        if model in CHAINS:
            return n / 1000 / steps if tool == "callgrind" else n
        return 1000 * n / max(rows[v][GROUPS[0][0]], 1)

    for g in groups + ["total"]:
        cells = []
        for v in names:
            n = totals[v] if g == "total" else rows[v][g]
            cells.append(f"{scaled(v, n):.0f}")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    if model in CHAINS and names:

        def base(v: str) -> str:  # torch's variant of the same use_reentrant, if recorded
            same = "torch-reentrant" if v.endswith("-reentrant") else "torch"
            return same if same in totals else names[0]

        ratio = " | ".join(f"{totals[v] / max(totals[base(v)], 1):.3f}" for v in names)
        lines.append(f"| total / torch's (same use_reentrant) | {ratio} |")
    full = " | ".join(str(rows[v]["full collections"]) for v in names)
    lines.append(f"| full GC collections in the sampled steps (count) | {full} |")
    if names and "simulated" in rows[names[0]]:
        lines += _simulated_table(rows, names, steps)
    if top > 0:
        lines += _symbol_table(rows, names, top, scaled)
    return "\n".join(lines) + "\n"


def _symbol_table(rows: dict, names: list[str], top: int, scaled) -> list[str]:
    """Per variant after the first: the ``top`` symbols whose count differs most from
    the first variant's, in the group table's unit (symbol by symbol)."""
    first = rows[names[0]]["symbols"]
    lines = []
    for v in names[1:]:
        mine = rows[v]["symbols"]
        diff = {k: mine.get(k, 0) - first.get(k, 0) for k in set(first) | set(mine)}
        biggest = sorted(diff, key=lambda k: -abs(diff[k]))[:top]
        lines += [
            "",
            f"The {top} symbols whose count differs most, {v} minus {names[0]} (same unit):",
            "",
            "| symbol | difference |",
            "| --- | --- |",
        ]
        for k in biggest:
            name = k.replace("|", "\\|")
            lines.append(f"| `{name[:160]}` | {scaled(v, diff[k]):+.1f} |")
    return lines


def _simulated_table(rows: dict, names: list[str], steps: int) -> list[str]:
    """SIMULATED's events, thousands per recorded step, each with its ratio to torch's
    (of the same use_reentrant, if recorded)."""

    def base(v: str) -> str:
        same = "torch-reentrant" if v.endswith("-reentrant") else "torch"
        return same if same in rows else names[0]

    lines = [
        "",
        "Simulated by callgrind (`--cache-sim=yes --branch-sim=yes`: valgrind's model of a "
        "32 KiB L1 instruction and data cache, the last-level cache and the branch "
        "predictors, not this CPU's), thousands per recorded step, and the ratio to torch's "
        "of the same use_reentrant.",
        "",
        "| event | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for e, what in SIMULATED:
        cells = []
        for v in names:
            n, b = rows[v]["simulated"][e], rows[base(v)]["simulated"][e]
            cells.append(f"{n / 1000 / steps:,.0f} ({n / max(b, 1):.3f})")
        lines.append(f"| {what} ({e}) | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--variants", nargs="+", default=["torch", "auto", "preserve"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--tool", choices=("perf", "callgrind"), default="perf")
    p.add_argument("--model", choices=tuple(MODELS), default="gpt")
    p.add_argument("--seq", type=int, default=256, help="Llama's sequence length (256)")
    p.add_argument(
        "--cache-sim",
        action="store_true",
        help="with --tool callgrind: also simulate the caches and branch predictors",
    )
    p.add_argument(
        "--top",
        type=int,
        default=0,
        help="also list the N symbols whose count differs most from the first variant's",
    )
    add_out_quick(p, quick="5 steps (1 with callgrind)")
    args = p.parse_args(argv)
    if args.child:
        _step(args.child[0], int(args.child[1]), args.child[2], args.tool, args.model, args.seq)
        return 0
    if args.cache_sim and args.tool != "callgrind":
        p.error("--cache-sim simulates under valgrind: give --tool callgrind with it")
    needs = ("valgrind", "callgrind_annotate") if args.tool == "callgrind" else ("perf",)
    missing = [t for t in needs if shutil.which(t) is None]
    if missing:
        print(f"{', '.join(missing)} not installed: nothing to record")
        return 1
    steps = (1 if args.tool == "callgrind" else 5) if args.quick else args.steps
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            v: _record(v, steps, tmp, args.tool, args.model, args.seq, args.cache_sim)
            for v in args.variants
        }
    command = "python -m benchmarks.perf_symbols " + " ".join(argv or sys.argv[1:])
    table = markdown(rows, command.strip(), args.tool, args.model, steps, args.top)
    return emit(table, args.out)


if __name__ == "__main__":
    sys.exit(main())
