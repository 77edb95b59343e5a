"""Which ``tr.config.detect`` level is the default: step time of each level over torch's
checkpoint (transformers' own for Llama), GPT-style and Llama, two sizes each.

    python -m benchmarks.bench_default_level --processes 3 --out benchmarks/results/default_level.md
    python -m benchmarks.bench_default_level --quick      # 1 process, 2 rounds, the small sizes

Rows, each with nothing changed between forward and backward (what every level gets
right): ``reads`` (nothing declared: the segment's reads are version-checked, a change
is refused), ``declared`` (``state=[block]`` / ``tr_hf.enable(model)``, engine auto),
``preserve`` (nothing declared, every read preserved copy-on-write). A ratio is the
median over interleaved rounds of the variant's CPU time per step over the reference's in
the same round (``benchmarks.bench_replay_speed.measure_rounds``), one thread; the table
gives the median over separate processes and each process's figure. The A/A row (the
reference again) is what a ratio reads when nothing differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.bench_replay_speed import measure_rounds
from benchmarks.lib.cli import add_out_quick, emit, make_parser, markdown_table, run_module
from benchmarks.lib.replay_steps import gpt_step_maker, llama_variant_maker, under_settings

# (model, size label): the model's dimensions.
SIZES = {
    ("GPT", "small"): {"width": 256, "seq": 128, "batch": 4},
    ("GPT", "large"): {"width": 512, "seq": 256, "batch": 2},
    ("Llama", "small"): {"hidden": 256, "seq": 256},
    ("Llama", "large"): {"hidden": 512, "seq": 512},
}
ROWS = ("A/A", "reads", "declared", "preserve")


def gpt_variants(width: int, seq: int, batch: int) -> dict:
    step = gpt_step_maker(width, seq, batch)

    def torch_ckpt(blk, h):
        return tcp.checkpoint(blk, h, use_reentrant=False)

    def ours(blk, h):
        return tr.checkpoint(blk, h, use_reentrant=False)

    def declared(blk, h):
        return tr.checkpoint(blk, h, use_reentrant=False, state=[blk])

    return {
        "torch": step(torch_ckpt),
        "A/A": step(torch_ckpt),
        "reads": under_settings(detect="reads")(step(ours)),
        "declared": under_settings(detect="reads")(step(declared)),
        "preserve": under_settings(detect="preserve")(step(ours)),
    }


def llama_variants(hidden: int, seq: int) -> dict:
    variant = llama_variant_maker(seq, hidden)

    return {
        "torch": variant("torch"),
        "A/A": variant("torch"),
        "reads": under_settings(detect="reads")(variant("tr", replay_state=None)),
        "declared": under_settings(detect="reads")(variant("tr")),
        "preserve": under_settings(detect="preserve")(variant("tr", replay_state=None)),
    }


def child(rounds: int, quick: bool) -> dict:
    torch.set_num_threads(1)
    out = {}
    for (model, size), dims in SIZES.items():
        if quick and size != "small":
            continue
        steps = gpt_variants(**dims) if model == "GPT" else llama_variants(**dims)
        res = measure_rounds(steps, rounds)["cpu"]
        out[f"{model}, {size}"] = {k: res[k] for k in ROWS} | {"torch_s": res["base_s"]}
    return out


def markdown(runs: list[dict], command: str) -> str:
    header = ["model, size", "dimensions", "torch s/step", *ROWS]
    rows = []
    for key in runs[0]:
        model, size = key.split(", ")
        dims = ", ".join(f"{k} {v}" for k, v in SIZES[(model, size)].items())
        cells = [key, dims, f"{statistics.median(r[key]['torch_s'] for r in runs):.3f}"]
        for row in ROWS:
            per = [r[key][row] for r in runs]
            cells.append(f"{statistics.median(per):.3f} ({' / '.join(f'{v:.3f}' for v in per)})")
        rows.append(cells)
    lines = [
        "# Which detect level is the default: step time by level",
        "",
        f"Command: `{command}` (torch {torch.__version__}, one thread). Each cell: the",
        "median over processes of the ratio to the reference, then each process's figure.",
        "",
        *markdown_table(header, rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    p.add_argument("--processes", type=int, default=3, help="separate processes (3)")
    p.add_argument("--rounds", type=int, default=9, help="rounds per process (9)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_out_quick(p, quick="1 process, 2 rounds, the small sizes")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    if args.child:
        print(json.dumps(child(rounds, args.quick)))
        return 0
    runs = []
    for _ in range(1 if args.quick else args.processes):
        extra = ["--quick"] if args.quick else []
        r = run_module(
            "benchmarks.bench_default_level", ["--child", "--rounds", str(rounds), *extra]
        )
        if r.returncode:
            sys.stderr.write(r.stderr)
            return r.returncode
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    command = "python -m benchmarks.bench_default_level " + " ".join(argv or sys.argv[1:])
    return emit(markdown(runs, command.strip()), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
