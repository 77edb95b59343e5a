"""Benchmark of selective recomputation in the Inductor pass (issue 14, docs/design.md §3.4).

CPU FP32 inference, one thread. For each model: the real peak of Inductor's
program and of the pass's program with recomputation (both measured by the
pass's counting allocator as the runtime calls them, to the byte), the modelled
peak (must equal the measured one), the recomputed chains, their extra MACs
(and extra cost: MACs plus one per element written by generated kernels) as a
percentage of the graph's, whether the outputs are bitwise identical to plain
``torch.compile`` (Inductor), and the wall time per call of both programs
(median of repeated calls after warm-up).

Models (``benchmarks/lib/recompute_models.py``): ``ReDimNetStyle`` at seven sizes
(``r0``..``r6``) and ``SpecUNet`` at three sizes. torchvision models are used
when torchvision imports (it does not in this environment; the table says so).

Run:
    nice -n 10 .venv/bin/python -m benchmarks.bench_recompute [--budget 0.01] [--quick]
        [--out benchmarks/results]
prints the table; with --out, writes <out>/recompute.md.
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import time

import torch

import inductor_pass  # noqa: F401  (registers the backend)
from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.recompute_models import REDIM_SIZES, ReDimNetStyle, SpecUNet, init_bn
from inductor_pass import PassConfig, make_backend
from inductor_pass.report import clear_reports, reports

try:
    import torchvision  # noqa: F401

    TV = "torchvision importable (not benchmarked here yet)"
except Exception as exc:
    TV = f"torchvision not importable ({type(exc).__name__}): torchvision models skipped"


def models(quick: bool):
    for name, (c, blocks, f, t) in REDIM_SIZES.items():
        if quick and name not in ("r0", "r2"):
            continue
        yield (
            f"ReDimNet-style {name} (C={c}, blocks={blocks}, {f}x{t})",
            (
                lambda c=c, blocks=blocks: ReDimNetStyle(c, blocks),
                (1, 1, f, t),
            ),
        )
    for c, levels, f, t in ((16, 3, 64, 128), (24, 3, 64, 160), (32, 4, 96, 160)):
        if quick and c != 16:
            continue
        yield (
            f"U-Net (spectrogram, C={c}, {levels} levels, {f}x{t})",
            (
                lambda c=c, levels=levels: SpecUNet(c, levels),
                (1, 1, f, t),
            ),
        )


def _time_call(fn, x, reps: int) -> float:
    with torch.no_grad():
        for _ in range(2):
            fn(x)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_one(make, shape, budget: float, reps: int) -> dict:
    torch.manual_seed(0)
    model = init_bn(make())
    x = torch.randn(*shape)
    with torch.no_grad():
        torch._dynamo.reset()
        plain = torch.compile(model, backend="inductor")
        ref = plain(x)
        torch._dynamo.reset()
        clear_reports()
        cfg = PassConfig(recompute=True, recompute_budget=budget, decision_cache=False, variants=())
        t0 = time.perf_counter()
        ours = torch.compile(model, backend=make_backend(cfg))
        y1 = ours(x)
        first_call = time.perf_counter() - t0
        y2 = ours(x)
    rep = reports()[-1]
    t_ind = _time_call(plain, x, reps)
    t_ours = _time_call(ours, x, reps)
    chains = rep.recomputed
    total_macs = chains[0]["total_macs"] if chains else 0
    total_cost = chains[0]["total_cost"] if chains else 0
    extra_macs = sum(int(c["extra_macs"]) for c in chains)
    extra_cost = sum(int(c["extra_cost"]) for c in chains)
    return {
        "graphs": len(reports()),
        "deployed": rep.deployed,
        "orig": rep.measured_original_peak,
        "ours": rep.measured_permuted_peak if rep.deployed else rep.measured_original_peak,
        "modelled": (rep.modelled_original_peak, rep.modelled_permuted_peak),
        "byte_exact": rep.byte_exact,
        "bitwise": bool(torch.equal(y1, ref) and torch.equal(y2, ref)),
        "chains": chains,
        "extra_macs_pct": 100.0 * extra_macs / total_macs if total_macs else 0.0,
        "extra_cost_pct": 100.0 * extra_cost / total_cost if total_cost else 0.0,
        "t_ind": t_ind,
        "t_ours": t_ours,
        "first_call": first_call,
        "note": rep.recompute_note,
        "reason": rep.reason,
        "certified": rep.certified,
    }


def mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:.3f}"


def table(rows, args, started) -> str:
    out = [
        "# Selective recomputation in the Inductor pass (CPU FP32 inference, 1 thread)",
        "",
        f"Command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`",
        f"torch {torch.__version__}; budget {args.budget:.2%} of each graph's cost; {TV}.",
        "Peaks: bytes above what the caller holds, measured by the pass's counting",
        "allocator as the runtime calls the program (byte-exact), Inductor's program vs the",
        "deployed one; modelled = the pass's byte-exact model of the deployed program.",
        "Extra MACs: convolution/matmul multiply-accumulates of the re-emitted kernels",
        "(torch's FLOP counter) over the graph's; extra cost adds one op per element",
        "written by generated kernels. Bitwise: outputs of two calls equal to plain",
        "`torch.compile` (Inductor). Time: median wall time per call (ms), on the machine",
        "that ran it under its load then (a shared 2-core machine here: repeated runs moved",
        "the ratio by +-30%; the extra MACs are the reliable cost figure).",
        "",
        "| model | Inductor peak MiB | ours MiB | change | modelled == measured | extra MACs | "
        "extra cost | bitwise | time Inductor / ours ms | order certified | recomputed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        if "error" in r:
            out.append(f"| {name} | error: {r['error']} |||||||||")
            continue
        change = (r["ours"] - r["orig"]) / r["orig"] * 100 if r["orig"] else 0.0
        what = "; ".join(
            f"{'/'.join(c['names'][:2])} ({c['bytes'] / 2**20:.3f} MiB): "
            f"{' + '.join(k.split('.')[-1][:24] for k in c['kernels'])}"
            for c in r["chains"]
        ) or (r["note"] or r["reason"])
        out.append(
            f"| {name} | {mib(r['orig'])} | {mib(r['ours'])} | {change:+.1f}% | "
            f"{r['byte_exact']} | {r['extra_macs_pct']:.3f}% | {r['extra_cost_pct']:.3f}% | "
            f"{r['bitwise']} | {r['t_ind'] * 1e3:.2f} / {r['t_ours'] * 1e3:.2f} | "
            f"{r['certified']} | {what} |"
        )
    out += ["", f"Wall time of the benchmark: {(time.perf_counter() - started) / 60:.1f} min.", ""]
    return "\n".join(out)


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=10)
    add_out_quick(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = []
    for name, (make, shape) in models(args.quick):
        print(name, flush=True)
        try:
            rows.append((name, run_one(make, shape, args.budget, args.reps)))
        except Exception as exc:  # a row says why; the benchmark goes on
            rows.append((name, {"error": f"{type(exc).__name__}: {str(exc)[:80]}"}))
        text = table(rows, args, started)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "recompute.md"), "w") as f:
                f.write(text)
    print(text)


if __name__ == "__main__":
    main()
