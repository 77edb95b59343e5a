"""The command line: ``python -m torch_replay.calibrate``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..planner import OPTION_NAMES
from .config import _MIB, CalibrationConfig, ConfigError, load_config, reduce_config
from .measure import _measure_shape, measurement_count
from .own_model import _as_workload, calibrate_model
from .run import calibrate, plot
from .workloads import resolve_factory

# ----------------------------------------------------------------------- CLI


def summary(doc: Mapping[str, Any]) -> str:
    """A markdown table of the grid: per shape, region vs snapshot and eager.

    Args:
        doc: a costs document.

    Returns:
        Markdown text.
    """
    grid = doc.get("grid") or []
    # CUDA runs also carry the step's device time from CUPTI (torch_replay._planning.kernel_timing).
    kernel = any(o and "kernel_s" in o for g in grid for o in g["options"].values())
    # CPU runs also carry the step's process CPU time, which a shared machine's other
    # work does not inflate (with one thread); time / snapshot then compares CPU times.
    cpu = bool(grid) and all(
        "step_cpu_s" in o for g in grid for o in g["options"].values() if o and "step_s" in o
    )
    time_key = "step_cpu_s" if cpu else "step_s"
    lines = [
        "| buffer MiB | write ratio | live versions | option | step s "
        + ("| step CPU s " if cpu else "")
        + ("| kernel s (source) " if kernel else "")
        + "| tracked peak MiB | physical peak delta MiB | model peak MiB | peak / snapshot "
        + ("| CPU time / snapshot |" if cpu else "| time / snapshot |"),
        "|---|---|---|---|---|"
        + ("---|" if cpu else "")
        + ("---|" if kernel else "")
        + "---|---|---|---|---|",
    ]
    for g in grid:
        snap = g["options"].get("snapshot") or {}
        for name in OPTION_NAMES:
            o = g["options"].get(name)
            if not o or not o.get("valid") or "step_s" not in o:
                continue
            pr = f"{o['tracked_peak'] / snap['tracked_peak']:.4f}" if snap.get("valid") else "-"
            tr_ = f"{o[time_key] / snap[time_key]:.3f}" if snap.get("valid") else "-"
            lines.append(
                f"| {g['buffer_bytes'] / _MIB:g} | {g['write_ratio']:g} | {g['live_versions']} "
                f"| {name} | {o['step_s']:.4f} "
                + (f"| {o['step_cpu_s']:.4f} " if cpu else "")
                + (
                    f"| {o['kernel_s']:.4f} ({o['kernel_source']}) "
                    if "kernel_s" in o
                    else ("| - " if kernel else "")
                )
                + f"| {o['tracked_peak'] / _MIB:.1f} "
                f"| {o['physical_peak_delta'] / _MIB:.1f} | {o['model_peak'] / _MIB:.1f} "
                f"| {pr} | {tr_} |"
            )
    return "\n".join(lines) + "\n"


def dry_run(cfg: CalibrationConfig) -> str:
    """The plan of measurements, as text (nothing is run or allocated).

    Args:
        cfg: a validated config.

    Returns:
        Text.
    """
    lines = [
        f"config {cfg.name!r}: device={cfg.device}, options={cfg.options}, reps={cfg.reps}, "
        f"warmup={cfg.warmup}, threads={cfg.threads}, isolate={cfg.isolate}",
    ]
    shapes = cfg.shapes()
    if cfg.grid is not None:
        g = cfg.grid
        lines.append(
            f"grid: {len(shapes)} shapes ({len(g.buffer_mib)} sizes x {len(g.live_versions)} "
            f"live-version counts x {len(g.write_ratios)} write ratios), activations "
            f"{g.batch} x {g.width} x {g.expand}"
        )
        for k, s in enumerate(shapes):
            steps = (cfg.warmup + cfg.reps + 1) * len([o for o in cfg.options if o != "guard"])
            lines.append(
                f"  [{k:2d}] {s.label():<28} ~{s.estimate_bytes(g) / 2**30:6.2f} GiB, {steps} steps"
            )
    if cfg.model is not None:
        resolve_factory(cfg.model.factory)
        lines.append(f"model: {cfg.model.factory}({cfg.model.kwargs})")
    lines.append(f"limit per measurement: {cfg.memory_limit_gib} GiB")
    return "\n".join(lines)


_DESCRIPTION = """\
Measure, for each segment of a model, what each option costs (bytes held from
forward to backward, bytes held only during its backward, time), and write the
costs JSON that tr.PlannedSequential(costs=...) plans from.

Your own model (the usual case):
  python -m torch_replay.calibrate --model mymodel:make --out costs.json
  python -m torch_replay.calibrate --model mymodel:make --quick --out costs.json

  mymodel.py (found from the current directory) defines make(), returning
  (segments, example_input) or (segments, example_input, state): segments an
  nn.Sequential or a list of modules, example_input the first segment's input,
  state what PlannedSequential(state=...) will declare. It may also return a
  dict with keys segments, example_input, state, loss_fn. The costs carry the
  model's fingerprint (segment classes, parameter/buffer shapes and dtypes,
  input shapes, torch version, machine); PlannedSequential refuses costs of
  another model (CostsMismatchError).

  Each option runs (warmup + reps + 1) training steps of the whole model;
  guard runs them once per segment. --quick runs one timed step per option.

A config (the shape grid and a built-in workload, as the benchmarks use):
  python -m torch_replay.calibrate --config configs/cpu.yaml --dry-run
  python -m torch_replay.calibrate --config configs/cpu.yaml --reduced --out costs_cpu.json

  configs/cpu.yaml's full grid (24 shapes, one process each) takes tens of
  minutes on a small CPU; --reduced keeps 4 corner shapes and 2 timed steps.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (``python -m torch_replay.calibrate -h``).

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        Exit status.
    """
    p = argparse.ArgumentParser(
        prog="python -m torch_replay.calibrate",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="your model: a factory returning (segments, example_input[, state])",
    )
    src.add_argument(
        "--config",
        help="a YAML (or JSON) config, e.g. configs/cpu.yaml (the shipped configs cpu, "
        "cpu_dry_run, h100 and rtx2080ti are found from any directory)",
    )
    p.add_argument("--kwargs", default="{}", help="JSON keyword arguments of --model's factory")
    p.add_argument(
        "--options",
        default=",".join(OPTION_NAMES),
        help="with --model: comma-separated options to measure (default: all five)",
    )
    p.add_argument("--reps", type=int, default=3, help="with --model: timed steps per option")
    p.add_argument("--warmup", type=int, default=1, help="with --model: untimed steps first")
    p.add_argument(
        "--device", default=None, help="with --model: cpu or cuda (default: the model's)"
    )
    p.add_argument("--out", help="where to write the costs JSON (required unless --dry-run)")
    p.add_argument("--plot", help="with --config: PNG of time and memory per option")
    p.add_argument("--summary", help="with --config: markdown table of the grid")
    p.add_argument(
        "--dry-run", action="store_true", help="validate and print the plan; run nothing"
    )
    p.add_argument(
        "--reduced",
        "--quick",
        action="store_true",
        help="the small run: with --model one timed step per option and no warm-up; with "
        "--config the smallest buffer, extreme write ratios and live versions, 2 steps",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--_shape", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.model is not None:
        return _main_model(p, a)
    try:
        cfg = load_config(a.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.reduced:
        cfg = reduce_config(cfg)
    if a._shape is not None:  # child process: one shape, JSON on stdout
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        print(json.dumps(_measure_shape(cfg, a._shape)))
        return 0
    if a.dry_run:
        try:
            print(dry_run(cfg))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if not a.out:
        p.error("--out is required (unless --dry-run)")
    try:
        doc = calibrate(cfg if a.reduced else a.config, progress=not a.no_progress)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    if a.summary:
        Path(a.summary).write_text(summary(doc))
    if a.plot:
        if plot(doc, a.plot):
            print(f"wrote {a.plot}")
        else:
            print("matplotlib is not importable: plot skipped (pip install matplotlib)")
    if doc["grid"]:
        print(summary(doc))
    return 0


def _main_model(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    if ":" not in a.model:
        p.error(f"--model must be 'pkg.module:factory', got {a.model!r}")
    try:
        kwargs = json.loads(a.kwargs)
    except json.JSONDecodeError as e:
        p.error(f"--kwargs is not JSON: {e}")
    options = [o.strip() for o in a.options.split(",") if o.strip()]
    try:
        fn = resolve_factory(a.model)
        w = _as_workload(fn(**kwargs), f"--model {a.model}")
        if a.dry_run:
            reps, warmup = (1, 0) if a.reduced else (a.reps, a.warmup)
            count = measurement_count(options, len(w.segments))
            print(f"model {a.model}: {w.description}")
            print(
                f"{count} measurements ({', '.join(options)}), each {warmup + reps + 1} "
                "training steps of the whole model"
            )
            return 0
        if not a.out:
            p.error("--out is required (unless --dry-run)")
        doc = calibrate_model(
            w,
            options=options,
            reps=a.reps,
            warmup=a.warmup,
            quick=a.reduced,
            device=a.device,
            progress=not a.no_progress,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc["model"]["factory"] = a.model
    doc["model"]["kwargs"] = kwargs
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}: {doc['model']['description']}")
    print(costs_table(doc))
    return 0


def costs_table(doc: Mapping[str, Any]) -> str:
    """The model section of a costs document as a short text table.

    Args:
        doc: a costs document with a ``model`` section.

    Returns:
        One row per segment and valid option: retained and transient MiB, time.
    """
    entry = doc.get("model") or {}
    fp = entry.get("fingerprint") or {}
    names = [s.get("name", str(i)) for i, s in enumerate(fp.get("segments", []))]
    rows = [
        f"{'segment':<12} {'option':<9} {'retained MiB':>13} {'transient MiB':>14} {'time s':>9}"
    ]
    for i, seg in enumerate(entry.get("segments") or []):
        label = names[i] if i < len(names) else str(i)
        for o in seg:
            rows.append(
                f"{label:<12} {o['name']:<9} {o['retained'] / _MIB:>13.2f} "
                f"{o['transient'] / _MIB:>14.2f} {o['time']:>9.4f}"
            )
            label = ""
    rows.append(
        f"persistent (parameters, buffers, state, gradients): {entry.get('persistent', 0) / _MIB:.2f} MiB"
    )
    return "\n".join(rows)
