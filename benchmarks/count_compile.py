"""Instructions of a warm compile, torch_replay against plain Inductor, counted by callgrind.

    python -m benchmarks.count_compile --models hf:inference:llama,hf:gpt2
    python -m benchmarks.count_compile --models hf --out benchmarks/results/compile_hf_instructions.md

The process-against-process times of ``bench_compile`` move by tens of percent between
neighbouring processes of one backend on a shared machine, so they cannot tell a 5%
difference. Instructions do not depend on the load. Per model, in one cache directory:
one fill per backend (a normal process, as ``bench_compile --warm-only``), then, per
backend and run, a warm process under ``valgrind --tool=callgrind --instr-atstart=no``
whose instrumentation is on for its first step only (``bench_compile``'s child with
``BENCH_COMPILE_CALLGRIND=1``): the compile, the cache lookups, loading the compiled
program and the pass's first-call work, not the imports before it. ``PYTHONHASHSEED=0`` and
``ATEN_CPU_CAPABILITY=avx2``, ``TORCHINDUCTOR_CPP_MARCH=haswell`` (valgrind runs no
AVX-512) in every process. Reported: instructions of that step per backend (the median of the runs)
and their ratio. Under valgrind a process takes minutes; a model's fill plus two counted
processes about 10-15 minutes of one core.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile

from benchmarks import bench_compile
from benchmarks.cli import add_out_quick, emit, markdown_table

BACKENDS = ("inductor", "torch_replay")


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


def count(name: str, runs: int, tmp: str) -> dict[str, list[int]]:
    """Per backend: the instructions of the first step of ``runs`` warm processes."""
    cache = os.path.join(tmp, "cache")
    # Valgrind decodes no AVX-512 (nor the EVEX form of AVX2 that -march=native allows on
    # a machine with it): the kernels are built for Haswell's AVX2 in the fill and looked
    # up so under valgrind (the ISA and flags are in Inductor's cache key), both backends.
    env = {
        "PYTHONHASHSEED": "0",
        "ATEN_CPU_CAPABILITY": "avx2",
        "TORCHINDUCTOR_CPP_MARCH": "haswell",
    }
    for backend in BACKENDS:
        bench_compile._run(name, backend, cache, **env)
    out: dict[str, list[int]] = {b: [] for b in BACKENDS}
    for r in range(runs):
        for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
            data = os.path.join(tmp, f"{name.replace(':', '_')}.{backend}.{r}.callgrind")
            wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
            wrapper += (f"--callgrind-out-file={data}",)
            bench_compile._run(name, backend, cache, wrapper, **env, BENCH_COMPILE_CALLGRIND="1")
            out[backend].append(instructions(data))
            print(f"{name} {backend} run {r}: {out[backend][-1]:,}", file=sys.stderr, flush=True)
    return out


def markdown(rows: list[tuple[str, dict[str, list[int]]]], command: str) -> str:
    cells = []
    for name, c in rows:
        i, t = (statistics.median(c[b]) for b in BACKENDS)
        cells.append(
            (name, len(c["inductor"]), f"{i / 1e6:,.1f}", f"{t / 1e6:,.1f}", f"{t / i:.4f}")
        )
    lines = [
        f"Command: `{command}`",
        "",
        "Instructions (callgrind) of a warm process's first step: compile on a warm cache and "
        "one step (millions; median of the runs per backend).",
        "",
        *markdown_table(("model", "runs", "inductor", "torch_replay", "ratio"), cells),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="comma-separated, as bench_compile's; hf: all")
    p.add_argument("--runs", type=int, default=1, help="counted warm processes per backend")
    add_out_quick(p, quick=None)
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.stderr.write("count_compile needs valgrind (apt-get install valgrind)\n")
        return 2
    names = bench_compile.model_names(args.models)
    rows = []
    command = "python -m benchmarks.count_compile " + " ".join(argv or sys.argv[1:])
    for name in names:
        with tempfile.TemporaryDirectory(prefix="count_compile_") as tmp:
            rows.append((name, count(name, args.runs, tmp)))
        emit(markdown(rows, command.strip()), args.out)  # the table so far, after every model
    return 0


if __name__ == "__main__":
    sys.exit(main())
