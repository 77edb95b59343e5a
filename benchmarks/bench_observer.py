"""Cost of observing a segment's operators: the C++ observer vs the Python one (CPU).

    python -m benchmarks.bench_observer [--reps 9] [--quick] [--out FILE.md]

Three measurements, each a ratio measured side by side in one run (methods interleaved,
medians of ``reps`` repetitions after a warm-up):

per-op:   one segment of ``2 * ops`` tiny operators (``x * c + d`` on 16 floats), forward +
          backward. The per-operator cost of observation is
          (time(torch_replay) - time(torch.utils.checkpoint)) / operators observed, where the
          operators observed are the forward's and the re-run's. Rows: the C++ observer
          (``tr.config.observer = "c++"``, default) and the reference TorchDispatchMode
          (``"python"``).
small-op: 64 segments of a 6-operator elementwise block on a 32x32 tensor (the case where
          the observer's per-operator cost shows), ``use_reentrant`` False and True.
per-segment: the fixed cost of a segment (64 one-operator segments), torch vs torch_replay
          vs torch_replay with ``tr.config.observe = False``.
gpt:      a 6-layer GPT-style model (d=256, 4 heads, sequence 128, batch 4), every block
          checkpointed, one training step: without state, without observation, with
          ``state=[block]`` under each engine (auto and journal turn the process-wide write
          watch on), and with ``tr.config.detect = "preserve"`` (undeclared reads
          journaled, watch on). Its ratios are medians of per-round ratios.
kept:     the README's usage ``tr.checkpoint(block, x, state=[block])`` on 4 blocks of 16 MiB
          of parameters: engine bytes held between forward and backward
          (``tr.engine_bytes()``) per engine, and under ``detect="preserve"``.

Time ratios are torch_replay / torch.utils.checkpoint. ``--quick`` runs fewer operators
and repetitions (a smoke run). Nothing is written unless ``--out`` is given.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, emit, make_parser
from benchmarks.lib.replay_steps import chain_step, gpt_step_maker


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(steps: dict, reps: int) -> dict[str, float]:
    return _paired(steps, reps, base=next(iter(steps)))[0]


def _paired(steps: dict, reps: int, base: str = "torch") -> tuple[dict, dict]:
    """Medians of interleaved repetitions, and the median over repetitions of each
    method's time over the base method's time in the same round (robust to load that
    drifts between rounds, which a ratio of medians is not). Odd rounds run the methods
    in reverse order, so that none always runs after the same neighbour."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for rep in range(reps + 1):
        order = list(steps.items())
        for name, step in order if rep % 2 == 0 else order[::-1]:
            t = _time(step)
            if rep:  # the first round warms up
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {
        k: statistics.median(a / b for a, b in zip(v, times[base], strict=True))
        for k, v in times.items()
    }
    return med, ratio


def _with_config(fn, **settings):
    def run():
        with tr.config.patch(**settings):
            fn()

    return run


def _with_observer(observer: str, fn):
    def run():
        with tr.config.patch(observer=observer):
            fn()

    return run


# ------------------------------------------------------------------- per-op


def bench_per_op(ops: int, reps: int) -> list[dict]:
    x = torch.randn(16, requires_grad=True)

    def seg(a):
        for _ in range(ops):
            a = a * 1.0001 + 0.0001
        return a

    def step(ckpt):
        def run():
            ckpt(seg, x, use_reentrant=False).sum().backward()

        return run

    med = _interleaved(
        {
            "torch": step(tcp.checkpoint),
            "c++": _with_observer("c++", step(tr.checkpoint)),
            "python": _with_observer("python", step(tr.checkpoint)),
        },
        reps,
    )
    observed = 2 * (2 * ops)  # two operators per iteration, forward and re-run
    return [
        {
            "observer": name,
            "step_s": med[name],
            "torch_step_s": med["torch"],
            "us_per_op": 1e6 * (med[name] - med["torch"]) / observed,
            "ratio": med[name] / med["torch"],
        }
        for name in ("c++", "python")
    ]


# ----------------------------------------------------------------- small-op


def bench_small_ops(segments: int, reps: int) -> list[dict]:
    x0 = torch.randn(32, 32, requires_grad=True)

    def block(a):
        return torch.tanh(a * 0.9 + 0.1).sigmoid() * a - 0.01

    rows = []
    for reentrant in (False, True):

        def step(ckpt, reentrant=reentrant):
            return chain_step(ckpt, block, x0, segments, reentrant)

        med = _interleaved(
            {"torch": step(tcp.checkpoint), "torch_replay": step(tr.checkpoint)}, reps
        )
        rows.append(
            {
                "use_reentrant": reentrant,
                "torch_s": med["torch"],
                "ours_s": med["torch_replay"],
                "ratio": med["torch_replay"] / med["torch"],
            }
        )
    return rows


# ---------------------------------------------------------------------- gpt


GPT_ENGINES = ("auto", "journal", "readset", "guard", "snapshot")


def bench_gpt(reps: int, layers: int = 6, d: int = 256, seq: int = 128, batch: int = 4) -> dict:
    step = gpt_step_maker(d, seq, batch, layers)
    plain = functools.partial(tr.checkpoint, use_reentrant=False)

    def with_state(engine):
        def ckpt(blk, h):
            return plain(blk, h, state=[blk], engine=engine)

        return ckpt

    variants = {
        "torch": step(functools.partial(tcp.checkpoint, use_reentrant=False)),
        "no state": step(plain),
        "observe=False": _with_config(step(plain), observe=False),
        **{f"state=[block], {e}": step(with_state(e)) for e in GPT_ENGINES},
        'detect="preserve"': _with_config(step(plain), detect="preserve"),
    }
    med, ratio = _paired(variants, reps)
    return {
        "torch_s": med["torch"],
        "rows": [{"variant": k, "s": med[k], "ratio": ratio[k]} for k in variants if k != "torch"],
    }


# ------------------------------------------------------------- per segment


def bench_per_segment(segments: int, reps: int) -> list[dict]:
    """Fixed cost per segment: ``segments`` one-operator segments (``h * 2`` on 4 floats)."""
    x = torch.randn(4, requires_grad=True)

    def blk(h):
        return h * 2.0

    def step(ckpt):
        return chain_step(ckpt, blk, x, segments, False)

    med, ratio = _paired(
        {
            "torch": step(tcp.checkpoint),
            "torch_replay": step(tr.checkpoint),
            "observe=False": _with_config(step(tr.checkpoint), observe=False),
        },
        reps,
    )
    return [
        {"variant": k, "us_per_segment": 1e6 * med[k] / segments, "ratio": ratio[k]} for k in med
    ]


def bench_kept(blocks: int = 4, width: int = 2048) -> list[dict]:
    """Engine bytes held from forward to backward by ``state=[block]`` (README usage)."""
    torch.manual_seed(0)
    model = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(blocks))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(8, width, requires_grad=True)
    rows = []
    for engine in ("snapshot", "readset", "auto", "preserve"):
        with tr.config.patch(detect="preserve" if engine == "preserve" else tr.config.detect):
            base = tr.engine_bytes()
            h = x
            for blk in model:
                if engine == "preserve":
                    h = tr.checkpoint(blk, h, use_reentrant=False)
                else:
                    h = tr.checkpoint(blk, h, use_reentrant=False, state=[blk], engine=engine)
            kept = tr.engine_bytes() - base
            h.sum().backward()
        rows.append({"engine": engine, "kept_bytes": kept, "parameter_bytes": params})
    return rows


def markdown(per_op, small, per_segment, gpt, kept, argv) -> str:
    lines = [
        f"Command: `python -m benchmarks.bench_observer {' '.join(argv)}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads. "
        "Ratios are torch_replay / torch.utils.checkpoint, medians of interleaved repetitions.",
        "",
        "## Per-operator cost of observation",
        "",
        "| observer | step s | torch step s | µs per observed operator | time ratio |",
        "|---|---|---|---|---|",
    ]
    for r in per_op:
        lines.append(
            f"| {r['observer']} | {r['step_s']:.4f} | {r['torch_step_s']:.4f} | "
            f"{r['us_per_op']:.2f} | {r['ratio']:.2f} |"
        )
    lines += [
        "",
        "## Small-operator segments (64 segments of a 6-operator block, 32x32)",
        "",
        "| use_reentrant | torch s | torch_replay s | ratio |",
        "|---|---|---|---|",
    ]
    for r in small:
        lines.append(
            f"| {r['use_reentrant']} | {r['torch_s']:.4f} | {r['ours_s']:.4f} | {r['ratio']:.3f} |"
        )
    lines += [
        "",
        "## Fixed cost per segment (one-operator segments, 4 floats)",
        "",
        "| variant | µs per segment | ratio to torch |",
        "|---|---|---|",
    ]
    for r in per_segment:
        lines.append(f"| {r['variant']} | {r['us_per_segment']:.1f} | {r['ratio']:.3f} |")
    lines += [
        "",
        "## GPT-style model (6 blocks, d=256, 4 heads, sequence 128, batch 4, dropout)",
        "",
        "Ratio: the median over repetitions of the variant's step time over torch's step in",
        'the same round. `state=[block]` with the journal or `auto` (and `detect="preserve"`)',
        "turns the process-wide write watch on.",
        "",
        f"torch.utils.checkpoint step: {gpt['torch_s']:.4f} s",
        "",
        "| variant | torch_replay s | ratio |",
        "|---|---|---|",
    ]
    for r in gpt["rows"]:
        lines.append(f"| {r['variant']} | {r['s']:.4f} | {r['ratio']:.3f} |")
    lines += [
        "",
        "## Bytes kept from forward to backward: `tr.checkpoint(block, x, state=[block])`",
        "",
        "4 blocks `Linear(2048, 2048) + Tanh` (256 wide with --quick), "
        f"{kept[0]['parameter_bytes'] / 2**20:.1f} MiB of parameters in all "
        "(`tr.engine_bytes()` after the forward).",
        "",
        "| engine | kept MiB |",
        "|---|---|",
    ]
    for r in kept:
        name = '`detect="preserve"`, no state' if r["engine"] == "preserve" else r["engine"]
        lines.append(f"| {name} | {r['kept_bytes'] / 2**20:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__, whole_doc=True)
    p.add_argument("--reps", type=int, default=9, help="measured repetitions per method")
    p.add_argument(
        "--gpt-reps",
        type=int,
        default=31,
        help="repetitions of the GPT model (its ratios are"
        " within about 1%%, so it needs more rounds than the others)",
    )
    add_out_quick(p, quick="a smoke run: fewer ops and reps")
    a = p.parse_args(argv)
    reps = 2 if a.quick else a.reps
    per_op = bench_per_op(50 if a.quick else 500, reps)
    small = bench_small_ops(8 if a.quick else 64, reps)
    per_segment = bench_per_segment(8 if a.quick else 64, reps)
    gpt = bench_gpt(reps if a.quick else a.gpt_reps, layers=2 if a.quick else 6)
    kept = bench_kept(width=256 if a.quick else 2048)
    md = markdown(per_op, small, per_segment, gpt, kept, sys.argv[1:] if argv is None else argv)
    return emit(md, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
