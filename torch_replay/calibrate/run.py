"""Calibrating a config (the shape grid and a model), loading costs, plotting."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..planner import OPTION_NAMES, Option, rerun_floor
from .config import _MIB, SCHEMA, CalibrationConfig, ConfigError, load_config
from .fingerprint import Kept, machine_info
from .measure import (
    _call_factory,
    _check_device,
    _measure_shape,
    _Progress,
    measure_segments,
    measurement_count,
)
from .own_model import _as_workload
from .workloads import resolve_factory

# ----------------------------------------------------------------- calibrate


def _machine(cfg: CalibrationConfig) -> dict[str, Any]:
    return machine_info(cfg.device)


def _child_shape(config_path: str, index: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch_replay.calibrate", "--config", config_path]
    cmd += ["--_shape", str(index)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"calibration of shape {index} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def calibrate(
    config: CalibrationConfig | str | os.PathLike,
    *,
    progress: bool = True,
    isolate: bool | None = None,
) -> dict[str, Any]:
    """Run a calibration and return the costs document (see :data:`SCHEMA`).

    Args:
        config: a :class:`CalibrationConfig` or a config path.
        progress: draw the progress bar on stderr.
        isolate: measure each shape in a fresh process (default: the config's
            ``isolate``; needs a config path).

    Returns:
        ``{"schema", "config", "machine", "time_unit", "grid": [...],
        "model": {...} | None}``, byte counts as ints.

    Raises:
        ConfigError: a bad config, or a CUDA config without a CUDA device.
    """
    path = None
    if not isinstance(config, CalibrationConfig):
        path = os.fspath(config)
        config = load_config(path)
    cfg = config
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config {cfg.name!r} needs a CUDA device and none is available")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    isolate = cfg.isolate if isolate is None else isolate
    if isolate and path is None:
        isolate = False
    shapes = cfg.shapes()
    w = None
    if cfg.model is not None:
        fn = resolve_factory(cfg.model.factory)
        torch.manual_seed(cfg.seed)
        made = _call_factory(fn, cfg.model.kwargs, cfg.device)
        w = _check_device(_as_workload(made, f"model.factory {cfg.model.factory!r}"), cfg.device)
    model_steps = measurement_count(cfg.options, len(w.segments)) if w is not None else 0
    bar = _Progress(len(shapes) + model_steps, progress)
    grid = []
    for k, s in enumerate(shapes):
        grid.append(_child_shape(path, k) if isolate else _measure_shape(cfg, k))
        bar.update(s.label())
    model = None
    if cfg.model is not None and w is not None:
        with Kept(w.segments, w.state):
            res = measure_segments(
                w,
                cfg.options,
                reps=cfg.reps,
                warmup=cfg.warmup,
                device=cfg.device,
                progress=lambda label: bar.update("model " + label),
            )
        model = {
            "factory": cfg.model.factory,
            "kwargs": cfg.model.kwargs,
            "description": w.description,
            **res,
        }
    return {
        "schema": SCHEMA,
        "config": dataclasses.asdict(cfg),
        "machine": _machine(cfg),
        "time_unit": "s",
        "grid": grid,
        "model": model,
    }


def load_costs(
    source: str | os.PathLike | Mapping[str, Any],
    *,
    segments: int | None = None,
    section: str = "model",
    shape: int | None = None,
) -> list[list[Option]]:
    """The planner's options from a costs document.

    Args:
        source: the JSON path written by the calibration, or its loaded dict.
        segments: expected number of segments (checked when given).
        section: ``"model"`` or ``"grid"``.
        shape: index of the grid shape (``section="grid"``).

    Returns:
        One list of :class:`Option` per segment (valid options only), with the
        re-run floor where the document has ``eager_forward`` (Note [Re-run floor] in
        ``torch_replay/planner.py``).

    Raises:
        ValueError: wrong schema, missing section, or another number of segments.
    """
    doc = source
    if not isinstance(doc, Mapping):
        doc = json.loads(Path(source).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema={doc.get('schema')!r})")
    if section == "model":
        entry = doc.get("model")
        if not entry:
            raise ValueError("the costs document has no model section; calibrate with a model")
    elif section == "grid":
        if shape is None or not 0 <= shape < len(doc.get("grid", [])):
            raise ValueError(f"shape must index the grid (0..{len(doc.get('grid', [])) - 1})")
        entry = doc["grid"][shape]
    else:
        raise ValueError(f"section must be 'model' or 'grid', got {section!r}")
    out = [[Option(**o) for o in seg] for seg in entry["segments"]]
    forward = entry.get("eager_forward")
    if forward is not None:  # Note [Re-run floor] in torch_replay/planner.py
        out = [rerun_floor(seg, f) for seg, f in zip(out, forward, strict=True)]
    if segments is not None and len(out) != segments:
        raise ValueError(f"the costs describe {len(out)} segments, expected {segments}")
    return out


# ---------------------------------------------------------------------- plot


def plot(doc: Mapping[str, Any], path: str | os.PathLike) -> bool:
    """Plot step time and tracked peak per option against write ratio (PNG).

    Args:
        doc: a costs document with a grid.
        path: the PNG to write.

    Returns:
        False (and writes nothing) when matplotlib is not importable.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    grid = doc.get("grid") or []
    combos = sorted({(g["buffer_bytes"], g["live_versions"]) for g in grid})
    fig, axes = plt.subplots(2, max(1, len(combos)), figsize=(3.2 * max(1, len(combos)), 6))
    axes = [[axes[0]], [axes[1]]] if len(combos) == 1 else axes
    for col, (b, v) in enumerate(combos):
        rows = sorted(
            (g for g in grid if (g["buffer_bytes"], g["live_versions"]) == (b, v)),
            key=lambda g: g["write_ratio"],
        )
        for name in OPTION_NAMES:
            pts = [(g["write_ratio"], g["options"].get(name)) for g in rows]
            pts = [(w, o) for w, o in pts if o and o.get("valid") and "step_s" in o]
            if not pts:
                continue
            ws = [w for w, _ in pts]
            axes[0][col].plot(ws, [o["step_s"] for _, o in pts], marker="o", label=name)
            axes[1][col].plot(ws, [o["tracked_peak"] / _MIB for _, o in pts], marker="o")
        axes[0][col].set_title(f"{b / _MIB:g} MiB, V={v}", fontsize=8)
        for r in (0, 1):
            axes[r][col].set_xscale("log")
            axes[r][col].set_xlabel("write ratio", fontsize=7)
        axes[0][col].set_yscale("log")
        axes[1][col].set_yscale("log")
    axes[0][0].set_ylabel("step time (s)")
    axes[1][0].set_ylabel("tracked peak (MiB)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
