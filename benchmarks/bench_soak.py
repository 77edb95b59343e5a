"""Memory over thousands of training steps, at every ``detect`` level: does anything grow?

Two models, each a stack of checkpointed blocks trained with SGD for ``--steps`` steps:

* ``plain``: residual MLP blocks (a fresh input storage every step);
* ``moco``: the same blocks reading a queue buffer that the training loop enqueues into
  in place between forward and backward (MoCo's pattern), declared where the level needs
  it.

Each (model, level) runs in a fresh process. After ``--warmup`` steps the heap in use
(glibc's ``mallinfo2``: blocks handed out and not returned), the resident set size and
``tr.engine_bytes()`` are read; again after the last step. The table gives each figure's
growth per step over the measured steps: flat memory is a growth near 0 (a few bytes a
step of Python and allocator noise), a leak is a steady figure per segment and step.

    python -m benchmarks.bench_soak                 # 3,000 steps (after 200 of warm-up)
    python -m benchmarks.bench_soak --quick         # 600 steps
    python -m benchmarks.bench_soak --json --steps 1000 --model plain --level preserve
"""

from __future__ import annotations

import gc
import json
import resource
import sys

from benchmarks.lib.cli import add_out_quick, emit, make_parser, results_markdown, run_module
from benchmarks.lib.counters import heap_in_use

LEVELS = ("reads", "preserve", "saved")
MODELS = ("plain", "moco")
BLOCKS = 4
WIDTH = 32
QUEUE = 64


def rss_bytes() -> int:
    """The resident set size now (from /proc), or the peak where /proc is absent."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _train(model: str, level: str, steps: int, warmup: int) -> dict[str, float]:
    import torch
    from torch import nn

    import torch_replay as tr

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(WIDTH, WIDTH)
            if model == "moco":
                self.register_buffer("queue", torch.randn(QUEUE, WIDTH))

        def forward(self, x):
            h = torch.tanh(self.lin(x))
            if model == "moco":
                h = h + (h @ self.queue.t()).softmax(-1) @ self.queue
            return x + h

    blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)
    # "reads" and "saved" refuse an undeclared queue changed before backward: the moco
    # model declares its blocks there; "preserve" runs with nothing declared.
    declare = model == "moco" and level != "preserve"
    reads = {}

    def step():
        x = torch.randn(8, WIDTH)
        h = x
        for b in blocks:
            kw = {"state": [b]} if declare else {}
            h = tr.checkpoint(b, h, use_reentrant=False, **kw)
        loss = h.pow(2).mean()
        if model == "moco":
            with torch.no_grad():
                for b in blocks:  # the enqueue between forward and backward
                    b.queue[:8].copy_(h.detach())
                    b.queue.copy_(b.queue.roll(8, 0))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with tr.config.patch(detect=level):
        for i in range(warmup + steps):
            step()
            if i + 1 == warmup:
                gc.collect()
                reads["heap0"], reads["rss0"] = heap_in_use(), rss_bytes()
                reads["engine0"] = tr.engine_bytes()
    gc.collect()
    return {
        "heap_per_step": (heap_in_use() - reads["heap0"]) / steps,
        "rss_per_step": (rss_bytes() - reads["rss0"]) / steps,
        "engine_bytes_start": reads["engine0"],
        "engine_bytes_end": tr.engine_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    add_out_quick(parser, quick="600 steps instead of 3,000")
    parser.add_argument("--steps", type=int, default=None, help="measured steps")
    parser.add_argument("--warmup", type=int, default=200, help="steps before measuring")
    parser.add_argument("--model", choices=MODELS, default=None, help="one model only")
    parser.add_argument("--level", choices=LEVELS, default=None, help="one level only")
    parser.add_argument(
        "--json", action="store_true", help="run here and print one JSON line per run"
    )
    args = parser.parse_args(argv)
    steps = args.steps or (600 if args.quick else 3000)
    models = [args.model] if args.model else list(MODELS)
    levels = [args.level] if args.level else list(LEVELS)
    if args.json:
        for model in models:
            for level in levels:
                out = _train(model, level, steps, args.warmup)
                print(json.dumps({"model": model, "level": level, "steps": steps, **out}))
        return 0
    rows = []
    for model in models:
        for level in levels:
            child = ["--json", "--steps", str(steps), "--warmup", str(args.warmup)]
            child += ["--model", model, "--level", level]
            done = run_module("benchmarks.bench_soak", child, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(
                (
                    model,
                    level,
                    steps,
                    f"{r['heap_per_step']:.1f}",
                    f"{r['rss_per_step']:.1f}",
                    f"{r['engine_bytes_start']} -> {r['engine_bytes_end']}",
                )
            )
    command = "python -m benchmarks.bench_soak " + " ".join(sys.argv[1:] if argv is None else argv)
    about = (
        f"{BLOCKS} checkpointed blocks of width {WIDTH} (moco: a {QUEUE}-row queue "
        f"each, enqueued in place between forward and backward), SGD, {args.warmup} "
        "warm-up steps, then the measured steps; one fresh process per row. Heap: glibc "
        "mallinfo2 (uordblks + hblkhd); RSS: /proc/self/statm; engine bytes: "
        "tr.engine_bytes() after the warm-up and after the last step."
    )
    header = ("model", "detect", "steps", "heap B/step", "RSS B/step", "engine bytes")
    return emit(results_markdown(command.strip(), about, header, rows), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
