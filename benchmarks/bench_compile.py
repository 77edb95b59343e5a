"""Compile cost of the ``torch_replay`` backend against plain Inductor, cold and warm.

For each model and backend, fresh processes run one compiled step (forward and,
for training, backward): *cold* with an empty ``TORCHINDUCTOR_CACHE_DIR``,
*warm* with the directory the cold run filled (Inductor's FX graph and
AOTAutograd caches and the pass's decision cache). Each of ``--reps`` cold fills
per backend is followed by ``--warm-runs`` warm processes, the two backends'
processes interleaved. Reported per cell (medians): the first step's wall time
minus the steady step time ("compile"), the same in the process's CPU time (less
sensitive to other work on a shared machine), and the process's peak RSS. Ratios
are torch_replay / inductor. CPU, FP32, one thread; the machine is shared, so
times are indicative.

Run:
    nice -n 10 .venv/bin/python -m benchmarks.bench_compile [--reps 3]
        [--models mlp,convnet,segment] [--out benchmarks/results/compile.md]
prints the table; writes it only with ``--out``. ``--reps 1 --models mlp`` is a
small run. ``--models tv:resnet50,tv:inference:vit_b_16`` uses torchvision models
(``weights=None``; training unless ``inference:``; input 2x3xSxS with S from
``--tv-size``, default 64) where torchvision imports (the torch 2.14.1 environment).
``--models hf:llama,hf:inference:t5`` uses the tiny transformers models of
``benchmarks/lib/hf_models.py``; ``--models hf`` is all ten families, training and
inference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.compile_models import MODELS, build_step, model_names, run_child
from benchmarks.lib.counters import GCClock, process_counters


class _FirstCallClock:
    """CPU time of the pass's first-call work (its ``"first-call pass"`` spans, Note [Compile
    observers]): measured inside the process, so other work on the machine moves it less
    than the difference of two processes' compile times."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self._t0 = 0.0

    @contextlib.contextmanager
    def watching(self, backend: str):
        if backend != "torch_replay":
            yield
            return
        from inductor_pass.observe import CompileObserver, observing

        clock = self

        class Observer(CompileObserver):
            def span_start(self, name: str) -> None:
                if name == "first-call pass":
                    clock._t0 = time.process_time()

            def span_end(self, name: str, seconds: float) -> None:
                if name == "first-call pass":
                    clock.cpu_s += time.process_time() - clock._t0

        with observing(Observer()):
            yield


def child(name: str, backend: str) -> None:
    """One process: compile and run ``name`` with ``backend``; print JSON."""
    import resource

    t_import = time.perf_counter()
    import torch
    import torch._inductor.compile_fx  # noqa: F401  (both backends need it)

    if backend == "torch_replay":
        import inductor_pass  # noqa: F401  (registers the backend)
    t_import = time.perf_counter() - t_import
    torch.set_num_threads(1)
    model, step = build_step(name)
    f = torch.compile(model, backend=backend)
    clock = _FirstCallClock()
    counting = os.environ.get("BENCH_COMPILE_CALLGRIND") == "1"  # benchmarks.count_compile
    if counting:
        from benchmarks.lib.recording import start_recording, stop_recording

        start_recording("callgrind", None)
    gc_clock = GCClock()
    n0 = process_counters(gc_clock)
    t0, c0 = time.perf_counter(), time.process_time()
    with clock.watching(backend):
        step(f)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    n1 = process_counters(gc_clock)
    gc_clock.close()
    if counting:
        stop_recording("callgrind", None)
    steady, steady_cpu = [], []
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        step(f)
        steady.append(time.perf_counter() - t0)
        steady_cpu.append(time.process_time() - c0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The largest reaped child: torch_replay's forked variant generator (Note [Forked
    # variant codegen]); its RSS counts the pages it shares with this process.
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "first_s": first,
                "steady_s": min(steady),
                "compile_s": first - min(steady),
                "compile_cpu_s": first_cpu - min(steady_cpu),
                "first_call_cpu_s": clock.cpu_s,
                "maxrss_mib": rss,
                "child_maxrss_mib": child_rss,
                "import_s": t_import,
                # The first step's garbage collection, kernel time and page faults (the
                # compile's noise between processes: a full collection of a heap holding
                # torch, transformers and Inductor costs tenths of a second).
                "first_gc_s": n1["gc_s"] - n0["gc_s"],
                "first_gc_full": n1["gc_full"] - n0["gc_full"],
                "first_sys_s": n1["sys_s"] - n0["sys_s"],
                "first_minor_faults": n1["minor_faults"] - n0["minor_faults"],
            }
        )
    )


def _measure(
    name: str, reps: int, warm_runs: int, shared: list[str] | None
) -> dict[tuple[str, str], list[dict]]:
    """``reps`` cold fills per backend, each followed by ``warm_runs`` warm runs on its
    directory; the two backends' processes interleaved (the warm rounds in alternating
    order), so that both see the same load. ``shared``: rep ``i`` fills and runs both
    backends in directory ``shared[i]`` (kept across models: a fill reuses the kernels
    already there, so its cells are "fill", not "cold"). Keyed by (backend, mode)."""
    backends = ("inductor", "torch_replay")
    cells: dict[tuple[str, str], list[dict]] = {}

    def one(backend: str, mode: str, cache: str, rep: int) -> None:
        r = run_child(name, backend, cache)
        cells.setdefault((backend, mode), []).append(r)
        print(f"{name} {backend} {mode} rep {rep}: {r}", file=sys.stderr)

    for rep in range(reps):
        with contextlib.ExitStack() as stack:
            if shared:
                caches = dict.fromkeys(backends, shared[rep])
            else:
                caches = {
                    b: stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_compile_"))
                    for b in backends
                }
            for b in backends:
                one(b, "fill" if shared else "cold", caches[b], rep)
            for k in range(warm_runs):
                for b in backends if (rep + k) % 2 == 0 else backends[::-1]:
                    one(b, "warm", caches[b], rep)
    return cells


def _torch_version() -> str:
    import torch

    return torch.__version__


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--reps", type=int, default=3, help="cold+warm process pairs per cell")
    ap.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated models (small run: one)"
    )
    ap.add_argument(
        "--warm-runs", type=int, default=1, help="warm processes per backend after each cold fill"
    )
    ap.add_argument(
        "--warm-only",
        action="store_true",
        help="one cache directory per rep for all models and both backends; warm rows only",
    )
    add_out_quick(ap, out="write the markdown table here", quick=None)
    ap.add_argument("--tv-size", type=int, default=64, help="input side of tv: models")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["BENCH_COMPILE_TV_SIZE"] = str(args.tv_size)
    if args.child:
        child(*args.child)
        return
    rows = []
    names = model_names(args.models)
    with contextlib.ExitStack() as stack:
        shared = None
        if args.warm_only:
            shared = [
                stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_compile_"))
                for _ in range(args.reps)
            ]
        for name in names:
            cells = _measure(name, args.reps, args.warm_runs, shared)

            def med(backend: str, mode: str, key: str, cells=cells) -> float:
                return statistics.median(r[key] for r in cells[(backend, mode)])

            for mode in ("warm",) if args.warm_only else ("cold", "warm"):
                ci, cr = med("inductor", mode, "compile_s"), med("torch_replay", mode, "compile_s")
                pi = med("inductor", mode, "compile_cpu_s")
                pr = med("torch_replay", mode, "compile_cpu_s")
                mi, mr = (
                    med("inductor", mode, "maxrss_mib"),
                    med("torch_replay", mode, "maxrss_mib"),
                )
                ii, ir = med("inductor", mode, "import_s"), med("torch_replay", mode, "import_s")
                kr = med("torch_replay", mode, "child_maxrss_mib")
                n = len(cells[("inductor", mode)])
                rows.append(
                    f"| {name} | {mode} | {n} | {ci:.2f} | {cr:.2f} | {cr / ci:.3f} | "
                    f"{pi:.2f} | {pr:.2f} | {pr / pi:.3f} | "
                    f"{mi:.0f} | {mr:.0f} | {mr / mi:.3f} | {kr:.0f} | {ir - ii:+.2f} |"
                )
            _emit(args, rows)  # after every model: a long run's table so far


def _emit(args: argparse.Namespace, rows: list[str]) -> None:
    """Print the table of ``rows``; write it to ``args.out`` when given."""
    cmd = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    table = "\n".join(
        [
            f"`{cmd}`",
            "",
            f"Medians over the n fresh processes per backend and cell ({args.reps} cold fills, "
            f"each followed by {args.warm_runs} warm runs; cold: empty TORCHINDUCTOR_CACHE_DIR; "
            "warm: the directory its backend's cold run filled; the two backends' processes "
            "interleaved). "
            + (
                "--warm-only: one cache directory per rep for the whole run, shared by both "
                "backends and all models (a fill reuses kernels already built there; Inductor's "
                "cache entries are keyed by the pass's salt, so each warm run finds its own "
                "backend's); no cold rows. "
                if args.warm_only
                else ""
            )
            + "compile = first step - steady step, wall (s) and this process's CPU "
            "time (s), with torch._inductor.compile_fx imported beforehand in both; "
            "RSS = process peak (MiB); child RSS = peak RSS of torch_replay's largest reaped "
            "child, the forked variant generator (MiB, pages shared with the parent included); "
            "import = extra one-time import of inductor_pass and the extension (s). One thread, "
            "CPU FP32. "
            f"torch {_torch_version()}; tv: models at {args.tv_size}x{args.tv_size}.",
            "",
            "| model | cache | n | inductor compile s | torch_replay compile s | ratio | "
            "inductor CPU s | torch_replay CPU s | ratio | "
            "inductor RSS | torch_replay RSS | ratio | torch_replay child RSS | import |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
