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

import os
import shutil
import statistics
import sys
import tempfile

from benchmarks.lib.cli import add_out_quick, emit, make_parser, markdown_table
from benchmarks.lib.compile_models import model_names, run_child
from benchmarks.lib.recording import instructions

BACKENDS = ("inductor", "torch_replay")


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
        run_child(name, backend, cache, **env)
    out: dict[str, list[int]] = {b: [] for b in BACKENDS}
    for r in range(runs):
        for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
            data = os.path.join(tmp, f"{name.replace(':', '_')}.{backend}.{r}.callgrind")
            wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
            wrapper += (f"--callgrind-out-file={data}",)
            run_child(name, backend, cache, wrapper, **env, BENCH_COMPILE_CALLGRIND="1")
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
    p = make_parser(__doc__)
    p.add_argument("--models", required=True, help="comma-separated, as bench_compile's; hf: all")
    p.add_argument("--runs", type=int, default=1, help="counted warm processes per backend")
    add_out_quick(p, quick=None)
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.stderr.write("count_compile needs valgrind (apt-get install valgrind)\n")
        return 2
    names = model_names(args.models)
    rows = []
    command = "python -m benchmarks.count_compile " + " ".join(argv or sys.argv[1:])
    for name in names:
        with tempfile.TemporaryDirectory(prefix="count_compile_") as tmp:
            rows.append((name, count(name, args.runs, tmp)))
        emit(markdown(rows, command.strip()), args.out)  # the table so far, after every model
    return 0


if __name__ == "__main__":
    sys.exit(main())
