"""torch_replay turned on in Hugging Face transformers, against transformers' own
checkpointing (CPU, this machine). A Llama-style model (4 layers, hidden 256, sequence
256, batch 2, dropout 0.1, built from its config): one training step (forward, backward)
for

    none      no checkpointing
    torch     model.activation_checkpointing_enable() (torch.utils.checkpoint, non-reentrant)
    tr        torch_replay.integrations.transformers.enable(model) (each layer declared)
    preserve  enable(model, replay_state=None) with tr.config.detect = "preserve"

Step time: the median over interleaved rounds (each round runs every variant once, in a
rotating order). Peak: the largest live bytes of the tensors the step creates (a
dispatch-mode tracker, torch_replay._peak.LiveBytesTracker) plus the bytes the
preservation engines hold in C++ (tr.engine_bytes), sampled after every operator, in a
separate untimed step. Ratios are against ``torch`` and measured in the same run.

    python -m benchmarks.bench_integrations            # 9 rounds, one thread, a few minutes
    python -m benchmarks.bench_integrations --quick    # 3 rounds, sequence 64
    python -m benchmarks.bench_integrations --out benchmarks/results/integrations.md

Nothing is written unless --out is given.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

import torch

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, make_parser, results_markdown
from benchmarks.lib.hf_stacks import VOCAB, build_hf, hf_turn_on
from torch_replay._planning.peak import LiveBytesTracker

VARIANTS = ("none", "torch", "tr", "preserve")


def _model(variant: str):
    model = build_hf("llama", layers=4, hidden=256)
    model.train()
    if variant == "preserve":
        hf_turn_on(model, "tr", replay_state=None)
    elif variant != "none":
        hf_turn_on(model, variant)
    return model


def _step(model, variant: str, ids: torch.Tensor) -> None:
    with tr.config.patch(detect="preserve" if variant == "preserve" else tr.config.detect):
        model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def run(rounds: int, seq: int, batch: int = 2) -> dict:
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    models = {v: _model(v) for v in VARIANTS}
    for v in VARIANTS:  # warm-up
        _step(models[v], v, ids)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for v in order:
            t0 = time.perf_counter()
            _step(models[v], v, ids)
            times[v].append(time.perf_counter() - t0)
    peaks = {}
    for v in VARIANTS:
        with LiveBytesTracker(extra=tr.engine_bytes) as tracker:
            _step(models[v], v, ids)
        peaks[v] = tracker.peak
    return {"time": {v: statistics.median(t) for v, t in times.items()}, "peak": peaks}


def table(res: dict, command: str, rounds: int, seq: int) -> str:
    t, p = res["time"], res["peak"]
    return results_markdown(
        command,
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; Llama 4 layers, hidden 256, sequence {seq}, "
        f"batch 2; {rounds} interleaved rounds, medians.",
        ["variant", "step (s)", "time / torch's checkpointing", "peak MiB", "peak / torch's"],
        (
            [v, f"{t[v]:.4f}", f"{t[v] / t['torch']:.3f}", f"{p[v] / 2**20:.1f}"]
            + [f"{p[v] / p['torch']:.3f}"]
            for v in VARIANTS
        ),
    )


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    add_out_quick(ap, out="write the markdown table here", quick="3 rounds, sequence 64")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # one thread: less noise on a shared machine
    rounds = args.rounds or (3 if args.quick else 9)
    seq = 64 if args.quick else 256
    res = run(rounds, seq)
    command = "python -m benchmarks.bench_integrations " + " ".join(sys.argv[1:])
    text = table(res, command.strip(), rounds, seq)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# torch_replay in transformers: step time and peak\n\n" + text)


if __name__ == "__main__":
    main()
