"""The Inductor pass on the programs people run (issue 46): every shape, frozen, data-dependent,
C++-wrapped and packaged programs, and recomputation in training.

One row per program and size (or setting), CPU FP32, one thread; each row compiles the
program twice, with plain Inductor (``backend="inductor"``) and with the ``torch_replay``
backend, side by side in one process, and measures:

- the real peak of one step (inference call, or forward + loss + backward) above what was
  live at its start, from the profiler's CPU memory events (``step_peak`` of
  ``benchmarks/bench_inductor.py``), Inductor's and ours interleaved over ``--reps``
  repetitions (the order alternating), the lowest of each kept;
- the pass's modelled peaks per graph (Inductor's program -> the one it runs), whether it
  deployed a program and why (its reports, ``inductor_pass.reports()``), and whether the
  program it runs is at the min-cut lower bound (certified);
- outputs (and in training every gradient) of the first and of a steady step bitwise equal
  (``torch.equal``) to plain Inductor's;
- compile time: each backend's first step at that size minus its fastest steady step
  (which backend calls first alternates over programs, after warm-up compiles; one
  process, caches off: ``torch.compiler.config.force_disable_caches``, the pass's decision
  cache off, a fresh ``TORCHINDUCTOR_CACHE_DIR``), so every compile is fresh; a size that
  reuses a symbolic graph compiles nothing under Inductor, while the pass orders each new
  size at its first call (Note [Per-size orders] in ``inductor_pass/runtime/per_size.py``).

Programs: tiny GPT-2 and Llama (``benchmarks/lib/hf_stacks.py``, 2 layers, hidden 32, no
dropout, batch 2) at lengths 32, 16, 24, 48 in inference and training, with ``dynamic=None``
(Dynamo's automatic dynamic: a static graph at the first length, a symbolic one from the
second) and ``dynamic=True``; frozen inference (``torch._inductor.config.freezing``) of the
branchy CNN of ``tests/inductor_support.py`` and of GPT-2; a top-1 mixture of experts whose
routing decides its sizes (``RoutedMoE``, ``benchmarks/lib/zoo_sequence.py``;
``capture_dynamic_output_shape_ops``); with ``cpp_wrapper=True`` the branchy CNN, the
two-branch model of ``tests/inductor_support.py`` (inference) and GPT-2 (training, length
32), each permuted through its Python twin (Note [C++ wrapper] in
``inductor_pass/runtime/cpp_wrapper.py``); the branchy CNN and the two-branch model as
AOTInductor packages (Inductor's ``torch._inductor.aoti_compile_and_package`` against
``inductor_pass.aoti_compile_and_package``, both loaded with ``aoti_load_package``); and the
models of ``benchmarks/bench_recompute_training.py`` trained with
``PassConfig(recompute=True)``.

Run:
    nice -n 10 .venv/bin/python -m benchmarks.bench_inductor_programs [--quick]
        [--programs gpt2-inference-dynamic,frozen-cnn] [--lengths 32,16] [--reps 2]
        [--no-warmup] [--out benchmarks/results [--merge]] [--outputs FILE]
prints the table; with --out, writes <out>/inductor_programs.md and its data,
<out>/inductor_programs.json (rewritten after every program); with --merge, only the
rows of --programs are replaced in that table, and it names the run each came from. ``--quick``: GPT-2 inference
with ``dynamic=True`` at lengths 32 and 16, the frozen CNN, the MoE, ``cpp_wrapper``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

import inductor_pass
from benchmarks.bench_inductor import bitwise_equal, compile_run, run_step, step_peak
from benchmarks.bench_recompute_training import models as recompute_models
from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.hf_models import HFLogits
from benchmarks.lib.hf_stacks import VOCAB, build_hf
from benchmarks.lib.inductor_table import kib
from benchmarks.lib.zoo_sequence import RoutedMoE
from inductor_pass import PassConfig, make_backend
from tests.inductor_support import FrozenBranchy, TwoBranch

LENGTHS = (32, 16, 24, 48)
"""The sequence lengths of the dynamic rows, in the order they are called."""
NAME = "inductor_programs"


@dataclass(kw_only=True)
class Program:
    """One program of the table: what is built, compiled and called at which sizes."""

    key: str
    """What ``--programs`` names."""
    name: str
    """The model, as the table says it."""
    setting: str
    """How it is compiled (``dynamic=True``, ``freezing=True``, ...)."""
    build: Callable[[], nn.Module]
    """The model, seeded (the same weights every call)."""
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    """The inputs at a size, seeded by it."""
    sizes: tuple[int, ...] = (0,)
    """The sizes called, in order (one row each); ``(0,)`` for one static size."""
    train: bool = False
    pick: Callable[[Any], Any] = lambda out: out
    """The tensor the step's loss is made of (``out.logits`` for a transformers model)."""
    compile_kw: dict[str, Any] = field(default_factory=dict)
    inductor: dict[str, Any] = field(default_factory=dict)
    """``torch._inductor.config`` while the program compiles and runs."""
    dynamo: dict[str, Any] = field(default_factory=dict)
    """``torch._dynamo.config`` while the program compiles and runs."""
    config: PassConfig = field(default_factory=lambda: PassConfig(decision_cache=False))
    """The pass's configuration (its decision cache off: every compile runs the pass)."""
    aoti: bool = False
    """Compiled as an AOTInductor package, not by ``torch.compile``."""
    lm: str = ""
    """The transformers family it builds (``"gpt2"``, ``"llama"``), for the warm-up."""


def _lm(name: str, train: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = build_hf(name, layers=2, dropout=0.0)
        model.config.use_cache = False
        return HFLogits(model, ("input_ids",)).train(train)

    return build


def _ids(n: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(n)),)


def _image(_: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def _features(_: int) -> tuple[torch.Tensor]:
    return (torch.randn(256, 64, generator=torch.Generator().manual_seed(0)),)


def _tokens(_: int) -> tuple[torch.Tensor]:
    return (torch.randn(256, 32, generator=torch.Generator().manual_seed(0)),)


def programs(lengths: tuple[int, ...] = LENGTHS, *, recompute_quick: bool = False) -> list[Program]:
    """Every program of the full table, in its order.

    Args:
        lengths: The dynamic rows' sequence lengths.
        recompute_quick: The recomputation rows of ``bench_recompute_training --quick``.
    """
    out = []
    for lm, label in (("gpt2", "GPT-2"), ("llama", "Llama")):
        for mode in ("inference", "training"):
            for dyn, setting in ((None, "dynamic=None (automatic)"), (True, "dynamic=True")):
                out.append(
                    Program(
                        key=f"{lm}-{mode}-{'auto' if dyn is None else 'dynamic'}",
                        name=f"{label} (2 layers, hidden 32), {mode}",
                        setting=setting,
                        build=_lm(lm, mode == "training"),
                        inputs=_ids,
                        sizes=lengths,
                        train=mode == "training",
                        compile_kw={"dynamic": dyn},
                        lm=lm,
                    )
                )
    out += [
        Program(
            key="frozen-cnn",
            name="branchy CNN (tests/inductor_support.py FrozenBranchy), inference",
            setting="freezing=True",
            build=FrozenBranchy,
            inputs=_image,
            inductor={"freezing": True},
        ),
        Program(
            key="frozen-gpt2",
            name="GPT-2 (2 layers, hidden 32), inference, length 32",
            setting="freezing=True",
            build=_lm("gpt2", False),
            inputs=lambda _: _ids(32),
            inductor={"freezing": True},
            lm="gpt2",
        ),
    ]
    for mode in ("inference", "training"):
        out.append(
            Program(
                key=f"moe-{mode}",
                name=f"top-1 MoE (4 experts, 256 tokens x 32), {mode}",
                setting="capture_dynamic_output_shape_ops=True (unbacked sizes)",
                build=RoutedMoE,
                inputs=_tokens,
                train=mode == "training",
                dynamo={"capture_dynamic_output_shape_ops": True},
            )
        )
    out += [
        Program(
            key="cpp-wrapper",
            name="branchy CNN (FrozenBranchy, unfrozen), inference",
            setting="cpp_wrapper=True",
            build=FrozenBranchy,
            inputs=_image,
            inductor={"cpp_wrapper": True},
        ),
        Program(
            key="cpp-wrapper-twobranch",
            name="two branches into one product (tests/inductor_support.py TwoBranch), inference",
            setting="cpp_wrapper=True",
            build=TwoBranch,
            inputs=_features,
            inductor={"cpp_wrapper": True},
        ),
        Program(
            key="cpp-wrapper-gpt2",
            name="GPT-2 (2 layers, hidden 32), training, length 32",
            setting="cpp_wrapper=True",
            build=_lm("gpt2", True),
            inputs=lambda _: _ids(32),
            train=True,
            inductor={"cpp_wrapper": True},
            lm="gpt2",
        ),
        Program(
            key="aoti",
            name="branchy CNN (FrozenBranchy, unfrozen), inference",
            setting="AOTInductor package (aoti_compile_and_package, aoti_load_package)",
            build=FrozenBranchy,
            inputs=_image,
            aoti=True,
        ),
        Program(
            key="aoti-twobranch",
            name="two branches into one product (tests/inductor_support.py TwoBranch), inference",
            setting="AOTInductor package (aoti_compile_and_package, aoti_load_package)",
            build=TwoBranch,
            inputs=_features,
            aoti=True,
        ),
    ]
    budget = 0.01  # bench_recompute_training's default --budget
    for i, (name, make, make_inputs, pick) in enumerate(recompute_models(recompute_quick)):
        out.append(
            Program(
                key=f"recompute-{i}",
                name=f"{name}, training",
                setting=f"PassConfig(recompute=True, recompute_budget={budget})",
                build=make,
                inputs=lambda _, make_inputs=make_inputs: make_inputs(),
                train=True,
                pick=pick,
                config=PassConfig(
                    recompute=True, recompute_budget=budget, decision_cache=False, variants=()
                ),
            )
        )
    return out


QUICK = ("gpt2-inference-dynamic", "frozen-cnn", "moe-inference", "cpp-wrapper")
QUICK_LENGTHS = (32, 16)

# --------------------------------------------------------------------------- measuring


def _frames() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _certified(r: inductor_pass.GraphReport) -> bool:
    """The program the pass runs is at the min-cut lower bound (modelled peaks are byte-exact)."""
    ours = r.modelled_permuted_peak if r.deployed else r.modelled_original_peak
    return ours is not None and r.lower_bound is not None and ours <= r.lower_bound


def _graph(r: inductor_pass.GraphReport) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "size": r.size,
        "deployed": r.deployed,
        "reason": r.reason,
        "modelled_inductor": r.modelled_original_peak,
        "modelled_ours": r.modelled_permuted_peak if r.deployed else r.modelled_original_peak,
        "lower_bound": r.lower_bound,
        "certified": _certified(r),
        "recomputed": len(r.recomputed),
    }


def measure(p: Program, reps: int, order: tuple[str, str]) -> list[dict[str, Any]]:
    """The rows of one ``torch.compile`` program, one per size; ``order``: which backend
    makes each size's first call first (alternated over programs)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = p.build().train(p.train)
    models = {"inductor": copy.deepcopy(model), "ours": copy.deepcopy(model)}
    backends = {"inductor": "inductor", "ours": make_backend(p.config)}
    fns = {}
    for b, m in models.items():
        compiled = torch.compile(m, backend=backends[b], **p.compile_kw)
        fns[b] = lambda *a, compiled=compiled: p.pick(compiled(*a))
    rows = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._inductor.config.patch(p.inductor))
        stack.enter_context(torch._dynamo.config.patch(p.dynamo))
        for n in p.sizes:
            inputs = p.inputs(n)
            first, seconds, frames, graphs = {}, {}, {}, []
            for b in order:
                before, seen = _frames(), len(inductor_pass.reports())
                first[b], seconds[b] = _timed(
                    lambda b=b, inputs=inputs: run_step(fns[b], models[b], inputs, p.train)
                )
                frames[b] = _frames() - before
                if b == "ours":
                    graphs = [_graph(r) for r in inductor_pass.reports()[seen:]]
            steady: dict[str, list[float]] = {"inductor": [], "ours": []}
            again = {}
            for _ in range(2):
                for b in order:
                    again[b], s = _timed(
                        lambda b=b, inputs=inputs: run_step(fns[b], models[b], inputs, p.train)
                    )
                    steady[b].append(s)
            peaks: dict[str, list[int]] = {"inductor": [], "ours": []}
            for i in range(reps):
                for b in ("inductor", "ours") if i % 2 == 0 else ("ours", "inductor"):
                    peaks[b].append(step_peak(fns[b], models[b], inputs, p.train))
            rows.append(
                _row(
                    p,
                    n,
                    peaks,
                    graphs,
                    bitwise_equal(first["inductor"], first["ours"])
                    and bitwise_equal(again["inductor"], again["ours"]),
                    {b: seconds[b] - min(steady[b]) for b in seconds},
                    frames,
                    again["ours"],
                )
            )
            print(f"  {p.key} size {n}: {_row_line(rows[-1])}", flush=True)
    return rows


def measure_aoti(p: Program, reps: int) -> list[dict[str, Any]]:
    """The AOTInductor package's row: Inductor's package
    (``torch._inductor.aoti_compile_and_package``) against ours
    (``inductor_pass.aoti_compile_and_package``), each compiled from the one export."""
    torch.manual_seed(0)
    model = p.build().eval()
    inputs = p.inputs(0)
    makers = {
        "inductor": torch._inductor.aoti_compile_and_package,
        "ours": functools.partial(inductor_pass.aoti_compile_and_package, config=p.config),
    }
    compile_s, runners = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_programs_aoti_") as d, torch.no_grad():
        exported = torch.export.export(model, inputs)
        seen = len(inductor_pass.reports())
        for b, make in makers.items():
            t0 = time.perf_counter()
            path = make(exported, package_path=os.path.join(d, f"{b}.pt2"))
            compile_s[b] = time.perf_counter() - t0
            runners[b] = torch._inductor.aoti_load_package(path)
        graphs = [_graph(r) for r in inductor_pass.reports()[seen:]]
        outs = {
            b: [run_step(r, model, inputs, False) for _ in range(2)] for b, r in runners.items()
        }
        peaks: dict[str, list[int]] = {"inductor": [], "ours": []}
        for i in range(reps):
            for b in ("inductor", "ours") if i % 2 == 0 else ("ours", "inductor"):
                peaks[b].append(step_peak(runners[b], model, inputs, False))
    bitwise = all(bitwise_equal(a, b) for a, b in zip(outs["inductor"], outs["ours"], strict=True))
    row = _row(p, 0, peaks, graphs, bitwise, compile_s, {}, outs["ours"][-1])
    print(f"  {p.key}: {_row_line(row)}", flush=True)
    return [row]


def _row(p, n, peaks, graphs, bitwise, compile_s, frames, outputs) -> dict[str, Any]:
    real = {b: min(v) for b, v in peaks.items()}
    if graphs:
        reason = "; ".join(f"{g['kind']}: {g['reason']}" for g in graphs)
    elif frames.get("ours", 1) == 0:
        reason = "no new graph at this size (an earlier size's program ran)"
    else:
        reason = "no report"
    return {
        "key": p.key,
        "program": p.name,
        "setting": p.setting,
        "size": n if n else None,
        "train": p.train,
        "peak_inductor": real["inductor"],
        "peak_ours": real["ours"],
        "peaks": peaks,
        "peaks_repeat_equal": all(len(set(v)) == 1 for v in peaks.values()),
        "ratio": real["ours"] / real["inductor"] if real["inductor"] else None,
        "graphs": graphs,
        "deployed": any(g["deployed"] for g in graphs),
        "certified": bool(graphs) and all(g["certified"] for g in graphs),
        "bitwise": bitwise,
        "compile_inductor_s": compile_s["inductor"],
        "compile_ours_s": compile_s["ours"],
        "graphs_compiled": frames,
        "reason": reason,
        "outputs": outputs,
    }


def _row_line(r: dict[str, Any]) -> str:
    return (
        f"peak {kib(r['peak_inductor'])} / {kib(r['peak_ours'])} KiB, ratio "
        f"{r['ratio']:.3f}, bitwise {r['bitwise']}, deployed {r['deployed']}, "
        f"certified {r['certified']}, compile {r['compile_inductor_s']:.1f} / "
        f"{r['compile_ours_s']:.1f} s"
    )


# --------------------------------------------------------------------------- the table


def _compile_ratio(r: dict[str, Any]) -> str:
    if r.get("compile_note"):
        return "1.000 (" + r["compile_note"] + ")"
    if r["graphs_compiled"].get("inductor") == 0:
        return "- (Inductor compiled nothing at this size)"
    return f"{r['compile_ours_s'] / r['compile_inductor_s']:.3f}"


def _modelled(r: dict[str, Any]) -> str:
    cells = [
        f"{g['kind']} {kib(g['modelled_inductor'])} -> {kib(g['modelled_ours'])}"
        for g in r["graphs"]
        if g["modelled_inductor"] is not None
    ]
    return "; ".join(cells) or "-"


def _deployed(r: dict[str, Any]) -> str:
    if not r["graphs"]:
        return "no (see below)"
    return "; ".join(
        f"{g['kind']}: {'yes' if g['deployed'] else 'no'}"
        + (f" (+{g['recomputed']} recomputed)" if g["recomputed"] else "")
        for g in r["graphs"]
    )


def _certified_cell(r: dict[str, Any]) -> str:
    if not r["graphs"]:
        return "-"
    return "; ".join(f"{g['kind']}: {'yes' if g['certified'] else 'no'}" for g in r["graphs"])


def _programs_summary(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for key in dict.fromkeys(r["key"] for r in rows):
        rs = [r for r in rows if r["key"] == key]
        plain = sum(r["compile_inductor_s"] for r in rs)
        ours = sum(r["compile_ours_s"] for r in rs)
        out.append(
            f"- {key} ({rs[0]['setting']}): compile time over its {len(rs)} row(s) "
            f"{plain:.1f} s Inductor, {ours:.1f} s ours, ratio {ours / plain:.3f}"
            if plain > 0
            else f"- {key}: compile time {plain:.1f} / {ours:.1f} s"
        )
    return out


def render(
    rows: list[dict[str, Any]], failures: list[str], head: dict[str, Any], done: bool
) -> list[str]:
    above = [r for r in rows if r["peak_ours"] > r["peak_inductor"]]
    lines = [
        "# The Inductor pass on the programs people run (CPU FP32, one thread)",
        "",
        f"Command: `{head['command']}`",
        "",
        f"torch {head['torch']}; commit {head['commit']}; {head['date']}; peaks in KiB; "
        f"{head['reps']} interleaved repetition(s) of each peak, the lowest kept."
        + ("" if done else " **Partial: the run is still going or was cut.**"),
        "",
    ]
    for rerun in head.get("reruns", []):
        lines += [
            f"Rows of {', '.join(rerun['keys'])} are from a later run (replacing any the run "
            "above made): "
            f"`{rerun['command']}` (torch {rerun['torch']}; commit {rerun['commit']}; "
            f"{rerun['date']}"
            + (f"; {rerun['wall_s'] / 60:.1f} min" if rerun.get("wall_s") else "")
            + ")."
            + (f" {rerun['note']}" if rerun.get("note") else ""),
            "",
        ]
    lines += [
        "Real peak: one step (inference call, or forward + loss + backward) above what was "
        "live at its start, from the profiler's CPU memory events, plain Inductor and ours "
        "compiled side by side in one process. Modelled: the pass's model of each graph's "
        "peak, Inductor's program -> the program it runs (byte-exact on CPU). Deployed: the "
        "pass runs a program of its own for that graph (why: below the table). Certified: "
        "the program it runs is at the min-cut lower bound. Bitwise: outputs (training: and "
        "every gradient) of the first and of a steady step equal (torch.equal) to plain "
        "Inductor's. Compile: first step at the size minus the fastest of two steady steps "
        "(which backend calls first alternates over programs, after a warm-up compile of a "
        "small model and of each language model); "
        "caches off (torch.compiler.config.force_disable_caches, the pass's decision cache "
        "off, a fresh TORCHINDUCTOR_CACHE_DIR), so every compile is fresh; a dynamic row "
        "whose size reuses a symbolic graph compiles nothing under Inductor, while the pass "
        "orders each new size at its first call.",
        "",
        "| program | setting | size | real peak Inductor / ours | ratio | modelled per graph "
        "| deployed | bitwise | certified | compile s Inductor / ours | compile ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['setting']} | {r['size'] or '-'} | "
            f"{kib(r['peak_inductor'])} / {kib(r['peak_ours'])} | {r['ratio']:.3f} | "
            f"{_modelled(r)} | {_deployed(r)} | {r['bitwise']} | {_certified_cell(r)} | "
            f"{r['compile_inductor_s']:.2f} / {r['compile_ours_s']:.2f} | {_compile_ratio(r)} |"
        )
    lines += [
        "",
        "## Summary",
        "",
        f"- {len(rows)} rows; bitwise equal to plain Inductor in "
        f"{sum(r['bitwise'] for r in rows)}/{len(rows)}; a graph deployed in "
        f"{sum(r['deployed'] for r in rows)}; every graph certified in "
        f"{sum(r['certified'] for r in rows)}.",
        f"- Real peak above plain Inductor's: {len(above)} row(s)"
        + (": " + ", ".join(f"{r['key']} size {r['size']}" for r in above) if above else "")
        + f"; below it: {sum(r['peak_ours'] < r['peak_inductor'] for r in rows)}.",
        "- Repeated peaks that differed between repetitions: "
        + (
            ", ".join(
                f"{r['key']} size {r['size']} {r['peaks']}"
                for r in rows
                if not r["peaks_repeat_equal"]
            )
            or "none"
        )
        + ".",
        *_programs_summary(rows),
        f"- Wall time of the benchmark: {head['wall_s'] / 60:.1f} min.",
        "",
        "## Why, per row",
        "",
    ]
    for r in rows:
        lines.append(f"- {r['key']} size {r['size'] or '-'}: {r['reason']}")
    lines += [f"- FAILED: {f}" for f in failures]
    return lines


def _commit() -> str:
    import subprocess

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        # The table's own files (rewritten by --merge runs) are not the code measured.
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!benchmarks/results",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = make_parser(__doc__, whole_doc=True)
    ap.add_argument(
        "--programs",
        default="",
        help="comma-separated program keys (default: all): "
        + ",".join(p.key for p in programs(recompute_quick=False)),
    )
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="dynamic rows' lengths")
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions of each peak")
    ap.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up compiles (the first program's compile times then carry the "
        "process's one-time costs; for runs that read peaks and outputs only)",
    )
    ap.add_argument(
        "--outputs",
        default=None,
        help="also save each row's outputs of ours (steady step; training: and gradients) "
        "with torch.save to this file (for tests/test_bench_inductor_programs.py)",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="with --out and --programs: keep the other programs' rows of the table in --out "
        "and replace these programs' rows (the table names the run each row comes from)",
    )
    add_out_quick(
        ap,
        out="folder to write inductor_programs.md and .json into (e.g. benchmarks/results)",
        quick="small run: " + ",".join(QUICK) + " at lengths " + ",".join(map(str, QUICK_LENGTHS)),
    )
    args = ap.parse_args()
    lengths = QUICK_LENGTHS if args.quick else tuple(int(x) for x in args.lengths.split(",") if x)
    todo = programs(lengths, recompute_quick=args.quick)
    keys = list(QUICK) if args.quick else [k.strip() for k in args.programs.split(",") if k.strip()]
    unknown = set(keys) - {p.key for p in todo}
    if unknown:
        raise SystemExit(
            f"unknown program(s) {sorted(unknown)}; choose from {[p.key for p in todo]}"
        )
    if keys:
        todo = [p for p in todo if p.key in keys]
    kept: list[dict[str, Any]] = []
    if args.merge:
        if not (args.out and keys):
            raise SystemExit("--merge needs --out (the table to merge into) and --programs")
        with open(os.path.join(args.out, NAME + ".json")) as f:
            base = json.load(f)
        if not base.get("done"):
            raise SystemExit(f"{args.out}/{NAME}.json is a partial run: nothing to merge into")
        kept = [r for r in base["rows"] if r["key"] not in keys]
        order = [p.key for p in programs(lengths, recompute_quick=args.quick)]
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1
    torch.compiler.config.force_disable_caches = True
    cache = tempfile.mkdtemp(prefix="bench_programs_cache_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    started = time.perf_counter()
    head = {
        "command": "nice -n 10 python -m benchmarks.bench_inductor_programs "
        + shlex.join(sys.argv[1:]),
        "torch": torch.__version__,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
        "reps": args.reps,
    }
    if args.merge:
        rerun = {k: head[k] for k in ("command", "torch", "commit", "date")}
        rerun["keys"] = [p.key for p in todo]
        reruns = [
            {**r, "keys": [k for k in r["keys"] if k not in keys]}
            for r in base.get("reruns", [])
            if set(r["keys"]) - set(keys)
        ]
        head = {k: base[k] for k in ("command", "torch", "commit", "date", "reps")}
        head["reruns"] = reruns + [rerun]
    # Warm-up: one-time costs of the first compile in a process (imports, toolchain probes)
    # would otherwise land on the first program's Inductor column.
    for backend in (
        () if args.no_warmup else ("inductor", make_backend(PassConfig(decision_cache=False)))
    ):
        compile_run(nn.Linear(4, 4), lambda: (torch.randn(2, 4),), True, backend, cache)
    # Dynamo's first trace of a transformers model pays once per process for its modules
    # (source inspection, lazy imports); a plain compile of each language model first.
    for lm in () if args.no_warmup else dict.fromkeys(p.lm for p in todo if p.lm):
        compile_run(_lm(lm, False)(), lambda: _ids(8), False, "inductor", cache)
    inductor_pass.clear_reports()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []

    def write(done: bool) -> list[str]:
        if args.merge:  # the table's wall time stays its first run's; each rerun has its own
            head["reruns"][-1]["wall_s"] = time.perf_counter() - started
            head["wall_s"] = base.get("wall_s", head["reruns"][-1]["wall_s"])
        else:
            head["wall_s"] = time.perf_counter() - started
        table = rows
        if args.merge:  # the programs' order; a key's rows keep their size order
            table = sorted(
                kept + rows,
                key=lambda r: order.index(r["key"]) if r["key"] in order else len(order),
            )
        lines = render(table, failures, head, done)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, NAME + ".md"), "w") as f:
                f.write("\n".join(lines) + "\n")
            data = {**head, "done": done, "failures": failures}
            data["rows"] = [{k: v for k, v in r.items() if k != "outputs"} for r in table]
            with open(os.path.join(args.out, NAME + ".json"), "w") as f:
                json.dump(data, f, indent=1)
        return lines

    for i, p in enumerate(todo):
        print(f"{p.key}: {p.name}, {p.setting}", flush=True)
        t0 = time.perf_counter()
        order = ("inductor", "ours") if i % 2 == 0 else ("ours", "inductor")
        try:
            rows += measure_aoti(p, args.reps) if p.aoti else measure(p, args.reps, order)
        except Exception as exc:  # a failure is a line of the table; the run goes on
            failures.append(f"{p.key}: {type(exc).__name__}: {str(exc)[:300]}")
            print("  FAILED:", failures[-1], flush=True)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
        write(False)
    if args.outputs:
        torch.save({(r["key"], r["size"]): r["outputs"] for r in rows}, args.outputs)
    print("\n".join(write(True)))


if __name__ == "__main__":
    main()
