"""MoCo with a negative queue, seven methods, byte-identical training.

    python -m benchmarks.moco [--seeds 2701] [--steps 40] [--queue-mib 4] [--batch 64]
                              [--width 16] [--methods ...] [--out benchmarks/results/moco.md]

Calibrates the query encoder's segments once (on a separate model), trains
every method from each seed side by side in this process, probes each encoder
with a linear classifier, writes one test score file per method and seed, and
prints a table: choices, measured peak (tracked, with engine memory), step-time
ratio to eager, probe accuracy, and whether the score files are byte-identical
(SHA-256) to eager's. Nothing is written under ``benchmarks/results`` unless
``--out`` is given (then ``<out>.md``, ``.json`` and ``.png`` beside it); score
files go to a temporary directory unless ``--scores-dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

import torch

from benchmarks.lib.cli import add_out_quick, make_parser

from .config import CORRECT, METHODS, MIB, MocoConfig
from .data import make_dataset
from .plans import calibrate_plans
from .report import DIFFERENCES, SOURCE, plot, seed_table, source_table, summarize, table
from .train import run_seed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = MocoConfig()
    p = make_parser(__doc__, prog="python -m benchmarks.moco")
    p.add_argument("--seeds", default="2701", help="comma list or range a-b (source: 2701-2706)")
    p.add_argument("--steps", type=int, default=d.steps, help="encoder steps per method")
    p.add_argument(
        "--queue-mib", type=float, default=d.queue_mib, help="FP32 queue MiB (source 64)"
    )
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--width", type=int, default=d.width, help="ResNet18 first-stage width (64)")
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--train-images", type=int, default=d.train_images)
    p.add_argument("--test-images", type=int, default=d.test_images)
    p.add_argument("--classes", type=int, default=d.classes)
    p.add_argument("--probe-epochs", type=int, default=d.probe_epochs)
    p.add_argument("--budget-frac", type=float, default=d.budget_frac)
    p.add_argument("--budget-mib", type=float, default=None)
    p.add_argument("--calibration-reps", type=int, default=d.calibration_reps)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--scores-dir", default=None, help="keep the score files here")
    add_out_quick(p, out="write <out>.md/.json/.png (e.g. benchmarks/results/moco.md)", quick=None)
    return p.parse_args(argv)


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # Every option named like a MocoConfig field sets it; the others keep their defaults.
    given = vars(args)
    cfg = MocoConfig(**{f.name: given[f.name] for f in fields(MocoConfig) if f.name in given})
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"unknown method {m!r}; methods are {', '.join(METHODS)}")
    seeds = _seeds(args.seeds)
    t_start = time.perf_counter()
    data = make_dataset(
        train=cfg.train_images, test=cfg.test_images, classes=cfg.classes, seed=cfg.data_seed
    )
    print(
        f"data: {cfg.train_images}+{cfg.test_images} synthetic 32x32 images, {cfg.classes} classes "
        f"(data seed {cfg.data_seed}); queue {cfg.queue_keys} keys x {cfg.dim} "
        f"= {cfg.queue_keys * cfg.dim * 4 / MIB:g} MiB; batch {cfg.batch}; width {cfg.width}"
    )
    # Calibrated once (on a separate model of the first seed): the plans need the
    # costs, and the fixed methods use them for their predicted peak.
    plans = calibrate_plans(cfg, data, seeds[0])
    print(
        f"calibrated in {plans.seconds:.1f} s: persistent {plans.persistent / MIB:.2f} MiB, "
        f"all-eager {plans.all_eager_peak / MIB:.2f} MiB, joint minimum "
        f"{plans.joint_min_budget / MIB:.2f} MiB, budget {plans.budget / MIB:.2f} MiB"
    )
    for name, why in plans.refused.items():
        print(f"  calibration refused {name}: {why}")
    scores_dir = args.scores_dir or tempfile.mkdtemp(prefix="moco_scores_")
    os.makedirs(scores_dir, exist_ok=True)
    results: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        t0 = time.perf_counter()
        results[seed] = run_seed(cfg, data, seed, plans, scores_dir, methods, log=print)
        print(f"seed {seed} done in {time.perf_counter() - t0:.1f} s")
    summary = summarize(results, methods)
    main_table = table(summary, methods)
    per_seed = seed_table(results, methods)
    src = source_table(summary)
    print()
    print(main_table)
    print()
    print(per_seed)
    print()
    print(src)
    correct = [m for m in methods if m in CORRECT]
    ok = all(summary["_identity"][s].get(m) in (True, None) for s in results for m in correct)
    torch_differs = all(
        summary["_identity"][s].get("torch_checkpoint") is False
        for s in results
        if "torch_checkpoint" in results[s]
    )
    print(
        f"\nbyte-identity: every correct method that ran = eager: {ok}; "
        f"torch_checkpoint differs in every seed: {torch_differs}; "
        f"score files in {scores_dir}; total {time.perf_counter() - t_start:.0f} s"
    )
    if args.out:
        _write(args, argv, cfg, plans, results, summary, main_table, per_seed, src, methods)
    return 0 if ok else 1


def _write(args, argv, cfg, plans, results, summary, main_table, per_seed, src, methods) -> None:
    base = args.out[:-3] if args.out.endswith(".md") else args.out
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    cmd = "python -m benchmarks.moco " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    doc = {
        "command": cmd,
        "config": asdict(cfg),
        "queue_keys": cfg.queue_keys,
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads()},
        "plans": None
        if plans is None
        else {
            "persistent": plans.persistent,
            "budget": plans.budget,
            "all_eager_peak": plans.all_eager_peak,
            "joint_min_budget": plans.joint_min_budget,
            "refused": plans.refused,
            "costs": [[asdict(o) for o in seg] for seg in plans.costs],
        },
        "results": {str(s): r for s, r in results.items()},
        "summary": {k: v for k, v in summary.items() if k != "_identity"},
        "identity": {str(s): v for s, v in summary["_identity"].items()},
        "source": SOURCE,
    }
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    png = plot(summary, methods, base + ".png")
    with open(base + ".md", "w") as f:
        f.write(f"`{cmd}`\n\n")
        f.write("## Methods\n\n" + main_table + "\n\n")
        f.write("## Score files per seed\n\n" + per_seed + "\n\n")
        f.write("## Beside the source\n\n" + src + "\n\n")
        f.write("## What differs from the source, and why\n\n" + DIFFERENCES)
        if png:
            f.write(f"\n![MoCo methods]({os.path.basename(base)}.png)\n")
    print(f"wrote {base}.md, {base}.json" + (f", {base}.png" if png else ""))


if __name__ == "__main__":
    raise SystemExit(main())
