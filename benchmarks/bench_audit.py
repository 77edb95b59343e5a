"""Cost of ``tr.audit``: one observed step (the C++ audit recorder, Note [Audit recorder])
and the analysis, against the plain training step it observes (CPU).

    python -m benchmarks.bench_audit [--reps 7] [--threads 1] [--out FILE.md]

Models: a narrow ResNet-18 layout in train mode (batch norm statistics written in
forward) and a 4-block MLP with a buffer written between forward and backward. Rows:
the plain forward + backward, ``audit(..., probe_engines=False)`` (observation and
verdicts), and ``audit(...)`` (also one ``torch_replay.checkpoint`` probe per segment);
medians of ``reps`` interleaved repetitions after a warm-up, and the ratio to the plain
step. Nothing is written unless ``--out`` is given.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.models import BasicBlock
from torch_replay.audit import audit


def _resnet(width: int = 8) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = width
    for i, c in enumerate([width, 2 * width, 4 * width, 8 * width]):
        layers.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers).train()


class _Queued(nn.Module):
    """MLP blocks reading a queue that the step updates after the forward."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.register_buffer("queue", torch.randn(64, d))
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)) for _ in range(4)
        )

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        y = x @ self.queue.clone().t()  # as MoCo: autograd saves the clone
        with torch.no_grad():
            self.queue[:8] = x[:8].detach()
        return y


def _median(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    add_out_quick(ap, quick=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = [
        ("resnet18-narrow, 2x3x32x32", _resnet(), torch.randn(2, 3, 32, 32)),
        ("4 MLP blocks + queue, 32x256", _Queued(), torch.randn(32, 256, requires_grad=True)),
    ]
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), median of {args.reps}",
        "",
        "| model | plain step | audit, no probes | ratio | audit with probes | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name, model, x in cases:
        plain = _median(lambda m=model, x=x: m(x).sum().backward(), args.reps)
        bare = _median(lambda m=model, x=x: audit(m, x, probe_engines=False), args.reps)
        full = _median(lambda m=model, x=x: audit(m, x), max(1, args.reps // 2))
        lines.append(
            f"| {name} | {plain * 1e3:.1f} ms | {bare * 1e3:.1f} ms | {bare / plain:.2f}x "
            f"| {full * 1e3:.1f} ms | {full / plain:.2f}x |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
