"""Where the ``torch_replay`` backend spends a cold compile: time and peak RSS per stage.

One process, one model, an empty ``TORCHINDUCTOR_CACHE_DIR`` unless one is set:
prints, for each step of the backend as it ends (the inner compile with the
program variants, each graph's first-call pass and its profile / search /
decide stages, the variant choice), its wall time and the process's peak RSS
(``VmHWM``) and RSS before and after, then each graph's report line. The steps
come from the backend's compile observers (Note [Compile observers] in
``inductor_pass/observe.py``); nothing is patched. For the end-to-end ratios
against plain Inductor use ``benchmarks/bench_compile.py``.

Run:
    nice -n 10 python -m benchmarks.profile_pass_stages --model tv:mobilenet_v2
        [--backend torch_replay|inductor] [--tv-size 64]
(``tv:inference:vit_b_16`` for inference; ``tv:`` models need torchvision, the
torch 2.14.1 environment; ``mlp`` / ``convnet`` / ``segment`` run anywhere.)
Prints only.
"""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks.lib.cli import make_parser
from inductor_pass.observe import CompileObserver, observing

_INDENT = {"inner compile": "", "first-call pass": ""}


def _mem() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) // 1024
    return out


class StagePrinter(CompileObserver):
    """Prints each backend step's wall time and RSS as it ends."""

    def __init__(self) -> None:
        self.started: list[dict[str, int]] = []

    def span_start(self, name: str) -> None:
        self.started.append(_mem())

    def span_end(self, name: str, seconds: float) -> None:
        before, after = self.started.pop(), _mem()
        label = _INDENT.get(name, "  ") + name
        print(
            f"{label:30s} {seconds:7.1f} s  peak RSS {before['VmHWM']} -> {after['VmHWM']} "
            f"MiB  RSS {before['VmRSS']} -> {after['VmRSS']} MiB",
            flush=True,
        )


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--model", default="mlp", help="as in bench_compile.py")
    ap.add_argument("--backend", default="torch_replay", choices=("torch_replay", "inductor"))
    ap.add_argument("--tv-size", type=int, default=64)
    args = ap.parse_args()
    os.environ["BENCH_COMPILE_TV_SIZE"] = str(args.tv_size)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pass_stages_"))
    import torch

    import inductor_pass
    from benchmarks.lib.compile_models import build_step

    torch.set_num_threads(1)
    model, step = build_step(args.model)
    print(f"start: {_mem()}", flush=True)
    f = torch.compile(model, backend=args.backend)
    t0 = time.perf_counter()
    with observing(StagePrinter()):
        step(f)
    print(f"first step {time.perf_counter() - t0:.1f} s, {_mem()}")
    for r in inductor_pass.reports():
        print(
            f"{r.kind}: {r.num_statements} statements, pass {r.pass_seconds or 0:.1f} s: {r.reason}"
        )


if __name__ == "__main__":
    main()
