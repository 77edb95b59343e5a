"""tr.checkpoint inside torch.compile vs torch.utils.checkpoint (CPU, Inductor).

    python -m benchmarks.bench_compile_checkpoint [--reps 15] [--quick] [--out FILE.md]

For each model, the same module is built twice (same seed), once calling
``torch.utils.checkpoint`` per block and once ``torch_replay.checkpoint``, and
compiled with ``torch.compile(backend=<counting Inductor backend>)``:

* capture: graphs Dynamo handed to the backend, their operator count, graph breaks;
* gradients: max |difference| of the first step's input and parameter gradients
  (and whether they are bitwise equal);
* step time: one training step (forward + backward) of each, interleaved, medians
  of ``reps`` repetitions after a warm-up; ratio tr / torch.

Models: a 6-block pre-norm transformer (d=256, 4 heads, sequence 128, batch 4) and
a ResNet-style model (stem + 4 residual conv-BN blocks, 32 channels, 16x16, batch 8);
``--quick`` shrinks both and the repetitions (a smoke run). A third row checkpoints
the ResNet-style blocks with ``state=[block]`` (batch-norm buffers declared: their
forward value is saved and written back, Note [Checkpoint under torch.compile]).
Nothing is written unless ``--out`` is given.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.utils.checkpoint as tcp
from torch._dynamo.testing import CompileCounterWithBackend

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.models import PreNormBlock, ResBlock


class Model(torch.nn.Module):
    def __init__(self, stem, blocks, checkpoint, declare=False):
        super().__init__()
        self.stem, self.blocks = stem, torch.nn.ModuleList(blocks)
        self.checkpoint, self.declare = checkpoint, declare

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            if self.declare:
                x = self.checkpoint(b, x, use_reentrant=False, state=[b])
            else:
                x = self.checkpoint(b, x, use_reentrant=False)
        return x.square().mean()


def build(kind: str, checkpoint, quick: bool, declare=False):
    torch.manual_seed(0)
    if kind == "transformer":
        d, heads, seq, batch = (64, 4, 32, 2) if quick else (256, 4, 128, 4)
        model = Model(torch.nn.Identity(), [PreNormBlock(d, heads) for _ in range(6)], checkpoint)
        return model, torch.randn(batch, seq, d)
    c, hw, batch = (8, 8, 2) if quick else (32, 16, 8)
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.ReLU())
    model = Model(stem, [ResBlock(c) for _ in range(4)], checkpoint, declare)
    return model, torch.randn(batch, 3, hw, hw)


def _breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def compiled(kind, checkpoint, quick, declare=False):
    model, x = build(kind, checkpoint, quick, declare)
    counter = CompileCounterWithBackend("inductor")
    before = _breaks()
    fn = torch.compile(model, backend=counter)
    x = x.requires_grad_(True)
    fn(x).backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    def step():
        x.grad = None
        model.zero_grad(set_to_none=True)
        fn(x).backward()

    return {
        "graphs": counter.frame_count,
        "ops": counter.op_count,
        "breaks": _breaks() - before,
        "grads": grads,
        "step": step,
    }


def interleaved(steps: dict, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in steps}
    for rep in range(reps + 1):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            if rep:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--reps", type=int, default=15)
    add_out_quick(ap, out="write the markdown table here")
    args = ap.parse_args()
    reps = 3 if args.quick else args.reps
    torch.set_num_threads(1)
    rows = []
    for kind, declare in (("transformer", False), ("resnet", False), ("resnet", True)):
        ref = compiled(kind, tcp.checkpoint, args.quick)
        ours = compiled(kind, tr.checkpoint, args.quick, declare)
        diff = max(
            (a - b).abs().max().item() for a, b in zip(ref["grads"], ours["grads"], strict=True)
        )
        bitwise = all(torch.equal(a, b) for a, b in zip(ref["grads"], ours["grads"], strict=True))
        t = interleaved({"torch": ref["step"], "tr": ours["step"]}, reps)
        name = kind + (" state=[block]" if declare else "")
        rows.append((name, ref, ours, diff, bitwise, t))
        print(
            f"{name}: graphs {ref['graphs']}/{ours['graphs']} ops {ref['ops']}/{ours['ops']} "
            f"breaks {ref['breaks']}/{ours['breaks']} grad diff {diff:.3g} "
            f"bitwise {bitwise} step {t['torch']:.4f}/{t['tr']:.4f} s "
            f"ratio {t['tr'] / t['torch']:.3f}",
            flush=True,
        )
    lines = [
        "Command: `python -m benchmarks.bench_compile_checkpoint"
        + (" --quick" if args.quick else f" --reps {reps}")
        + f" --out {args.out}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread, backend inductor. "
        "Each cell: torch.utils.checkpoint / torch_replay.checkpoint; step times are medians "
        "of interleaved repetitions after compilation.",
        "",
        "| model | graphs | graph ops | graph breaks | max grad diff | bitwise | "
        "torch step s | tr step s | ratio tr/torch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ref, ours, diff, bitwise, t in rows:
        lines.append(
            f"| {name} | {ref['graphs']} / {ours['graphs']} | {ref['ops']} / {ours['ops']} | "
            f"{ref['breaks']} / {ours['breaks']} | {diff:.3g} | {bitwise} | {t['torch']:.4f} | "
            f"{t['tr']:.4f} | {t['tr'] / t['torch']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
