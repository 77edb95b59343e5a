"""The differential operator sweep over torch's OpInfo database (tests/op_sweep).

    python -m benchmarks.bench_op_sweep [--quick] [--ops a,b] [--kinds read,inplace,out]
                                        [--out FILE.md] [--json FILE.json] [--repeat N]

For every operator of ``torch.testing._internal.common_methods_invocations.op_db`` (and
the sweep's own conversions, tests/op_sweep/extra.py) with CPU samples (two float64
samples, one float32 and one bfloat16 where the op has them), a segment reads a
pre-existing tensor through the operator (or writes it: in-place and ``out=``
variants) and the tensor is changed in place before backward. Each case runs in eager
PyTorch (the reference) and under ``torch_replay.checkpoint`` in 8 modes (observer
``c++`` / ``python`` x ``use_reentrant`` x undeclared, at ``tr.config.detect =
"preserve"`` / ``state=[state]``, at the default level); the table
counts right, refused (a ``tr.ReplayError``), wrong (silently: a different gradient or
tensor) and errors (another exception), and the cases whose two observers touched
different storages. torch.utils.checkpoint runs the same cases as the baseline (its
wrong count shows the cases can tell a wrong gradient from eager's).

``--quick`` runs the default test command's subset (tests/op_sweep/quick.py). The
counts line (``counts: ...``) is what repeated runs must reproduce: ``--repeat N`` runs
the sweep N times, each in a new process, and compares every case's outcome in every
mode (exit status 1 if any differs; ``--out`` is written by the first run). Nothing is written unless ``--out`` (the markdown
table) or ``--json`` (every case's outcomes) is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.lib.cli import add_out_quick, make_parser
from tests.op_sweep.quick import QUICK_OPS
from tests.op_sweep.report import RESULTS, counts, markdown, sweep
from tests.op_sweep.run import BASELINE, MODES


def _counts_line(results) -> str:
    table = counts(results)
    parts = []
    for mode in MODES + BASELINE:
        c = table[mode.label, "all"]
        cells = "/".join(str(c[r]) for r in RESULTS)
        if mode.observer == "c++":
            cells += f"/storages {c['storages']}"
        parts.append(f"[{mode.label}] {cells}")
    return "counts (right/refused/wrong/error): " + "; ".join(parts)


def _repeat(n: int, argv: list[str]) -> int:
    """Runs the sweep ``n`` times in new processes; compares every case's outcomes."""
    runs = []
    later = list(argv)  # --out (the table) is written by the first run only
    if "--out" in later:
        i = later.index("--out")
        del later[i : i + 2]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            path = os.path.join(tmp, f"run{i}.json")
            env = dict(os.environ)
            env["OP_SWEEP_COMMAND"] = "python -m benchmarks.bench_op_sweep " + " ".join(
                [*argv, "--repeat", str(n)]
            )
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_op_sweep", *(later if i else argv)]
                + ["--json", path],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
            line = next(t for t in out.splitlines() if t.startswith("counts"))
            print(f"run {i + 1}: {line}", flush=True)
            with open(path) as f:
                runs.append({r["case"]: r for r in json.load(f)})
    differ = 0
    for case in sorted(set().union(*runs)):
        seen = [r.get(case) for r in runs]
        outcomes = [
            None if r is None else ({m: v[0] for m, v in r["runs"].items()}, r["storages_differ"])
            for r in seen
        ]
        if any(o != outcomes[0] for o in outcomes[1:]):
            differ += 1
            print(f"differs: {case}: {outcomes}")
    print(f"{n} runs, {len(runs[0])} cases each: {differ} cases differ between runs")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--ops", default="", help="comma-separated op ids (default: all)")
    p.add_argument("--kinds", default="read,inplace,out")
    add_out_quick(
        p,
        out="write the markdown table here",
        quick="the default test command's subset",
        default="",
    )
    p.add_argument("--json", default="", help="write every case's outcomes here")
    p.add_argument("--repeat", type=int, default=0, help="run N times, compare the outcomes")
    args = p.parse_args(argv)
    if args.repeat:
        rest = list(argv if argv is not None else sys.argv[1:])
        i = rest.index("--repeat")
        return _repeat(args.repeat, rest[:i] + rest[i + 2 :])
    only = set(QUICK_OPS) if args.quick else None
    if args.ops:
        only = set(args.ops.split(","))
    t0 = time.perf_counter()
    done = [0]

    def progress(_):
        done[0] += 1
        if done[0] % 200 == 0:
            print(f"  {done[0]} cases, {time.perf_counter() - t0:.0f} s", flush=True)

    s = sweep(only=only, kinds=tuple(args.kinds.split(",")), progress=progress)
    elapsed = time.perf_counter() - t0
    text = markdown(s)
    print(text)
    print(_counts_line(s.ran()))
    print(f"elapsed: {elapsed:.0f} s")
    if args.out:
        shown = list(argv if argv is not None else sys.argv[1:])
        if "--json" in shown:  # (a --repeat run's own file)
            i = shown.index("--json")
            del shown[i : i + 2]
        command = os.environ.get(
            "OP_SWEEP_COMMAND", "python -m benchmarks.bench_op_sweep " + " ".join(shown)
        )
        with open(args.out, "w") as f:
            f.write(f"# Operator sweep\n\nCommand: `{command.strip()}`\n\n{text}")
    if args.json:
        rows = [
            {
                "case": r.case.label,
                "sensitive": r.sensitive,
                "runs": {run.mode.label: [run.result, run.detail] for run in r.runs},
                "storages_differ": [
                    [re, d, sorted(a), sorted(b)] for re, d, a, b in r.storage_mismatches()
                ],
            }
            for r in s.ran()
        ]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
