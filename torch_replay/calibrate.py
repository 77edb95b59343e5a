"""Measure the planner's costs: ``python -m torch_replay.calibrate --config C --out costs.json``.

For each option (``eager``, ``snapshot``, ``journal``, ``readset``, ``guard``
where valid) and each segment it measures retained bytes, transient bytes and
time (seconds), on

* the **shape grid** (24 shapes in ``configs/cpu.yaml``): a declared buffer of
  ``buffer_mib`` MiB, ``live_versions`` segments that each rewrite a share
  ``write_ratio`` of it (all alive until backward), for every combination; and
* the **segments of a model** named by a factory ``pkg.module:function``
  returning a :class:`Workload`.

How a segment's costs are measured (``PlannedSequential.profile_step``): the
whole sequence runs with one option on every segment; per segment,

* ``time`` = its forward wall time + its backward window (from the gradient of
  its output to the gradient of its input, replay included), median of ``reps``
  untracked steps;
* ``retained`` = tensor bytes its forward left alive (live-bytes tracker) +
  ``preserved``; ``preserved`` = its transaction's ``retained_bytes`` just
  before backward (0 for eager). For the journal that is the shared log since
  the segment began, i.e. its own writes and every later segment's: the
  planner charges the journaled segments' logs once, as the largest
  (``torch_replay.planner.plan_peak``);
* ``transient`` = the larger of its forward temporaries and the peak during its
  backward window above the live bytes at the window's start (recomputed
  activations, the live-state save around a replay, gradients).

Each grid shape runs in a fresh process (``isolate``), and its physical peak is
reported too: peak RSS (``/proc/self/status`` VmHWM, reset through
``/proc/self/clear_refs``) minus RSS before the timed steps, or the CUDA
allocator's peak on GPU. Configs are YAML read with PyYAML when it is
installed; otherwise the JSON subset of YAML (the shipped configs are written
that way) is read with ``json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ReplayError
from .kernel_timing import time_kernels
from .planner import OPTION_NAMES, Option, plan_peak

__all__ = [
    "SCHEMA",
    "CalibrationConfig",
    "ConfigError",
    "GridConfig",
    "ModelConfig",
    "Shape",
    "Workload",
    "BufferSegment",
    "buffer_workload",
    "calibrate",
    "calibrate_model",
    "check_costs",
    "machine_info",
    "measurement_count",
    "model_fingerprint",
    "workload_from",
    "dense_workload",
    "load_config",
    "load_costs",
    "main",
    "measure_segments",
    "queue_workload",
    "reduce_config",
    "shape_workload",
]

SCHEMA = "torch_replay.costs/1"
"""Version tag written into every costs file."""

_MIB = 2**20


class ConfigError(ValueError):
    """A calibration config that cannot be used; the message says what to fix."""


# -------------------------------------------------------------------- config


@dataclass(kw_only=True, slots=True)
class GridConfig:
    """The shape grid: every combination of the three axes is one shape."""

    buffer_mib: list[float]
    """Declared buffer sizes in MiB."""
    write_ratios: list[float]
    """Share of the buffer each segment rewrites, in (0, 1]."""
    live_versions: list[int]
    """Segments per shape: versions of the buffer alive until backward."""
    batch: int = 64
    """Rows of the activation flowing through the segments."""
    width: int = 512
    """Features of the activation, and floats per buffer row."""
    expand: int = 4
    """Activation size of a segment, in multiples of its input."""


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """A model whose segments are calibrated."""

    factory: str
    """``pkg.module:function`` returning a :class:`Workload`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the factory."""


@dataclass(kw_only=True, slots=True)
class CalibrationConfig:
    """What ``python -m torch_replay.calibrate`` measures, and where."""

    name: str
    """Name of the configuration (written into the output)."""
    device: str = "cpu"
    """``"cpu"`` or ``"cuda"``."""
    options: list[str] = field(default_factory=lambda: list(OPTION_NAMES))
    """Options to measure (``guard`` is measured only where it is valid)."""
    reps: int = 3
    """Timed steps per measurement (the median is kept)."""
    warmup: int = 1
    """Untimed steps before them."""
    threads: int | None = None
    """``torch.set_num_threads`` (None: leave torch's default)."""
    memory_limit_gib: float = 8.0
    """Largest estimated footprint of one measurement (host RAM on CPU, device
    memory on GPU); larger shapes are refused at validation."""
    isolate: bool = True
    """Measure each grid shape in a fresh process (clean peak RSS)."""
    seed: int = 0
    """Seed of parameters and inputs."""
    grid: GridConfig | None = None
    """The shape grid (None: skip)."""
    model: ModelConfig | None = None
    """A model to calibrate (None: skip)."""

    def shapes(self) -> list[Shape]:
        """The grid's shapes, buffer size outermost, then live versions, then write ratio."""
        if self.grid is None:
            return []
        g = self.grid
        return [
            Shape(
                buffer_bytes=_buffer_bytes(mib, g.width),
                write_ratio=w,
                live_versions=v,
            )
            for mib in g.buffer_mib
            for v in g.live_versions
            for w in g.write_ratios
        ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """One calibration shape."""

    buffer_bytes: int
    """Bytes of the declared buffer."""
    write_ratio: float
    """Share of the buffer each segment rewrites."""
    live_versions: int
    """Number of segments (versions alive until backward)."""

    def estimate_bytes(self, grid: GridConfig) -> int:
        """Rough upper estimate of one measurement's footprint: buffer, one
        snapshot per segment, one live save, activations."""
        act = grid.batch * grid.width * 4 * (grid.expand + 2) * self.live_versions
        return self.buffer_bytes * (self.live_versions + 2) + act

    def label(self) -> str:
        """A short human-readable name."""
        return f"{self.buffer_bytes / _MIB:g}MiB w={self.write_ratio:g} V={self.live_versions}"


def _buffer_bytes(mib: float, width: int) -> int:
    row = width * 4
    return max(1, int(mib * _MIB) // row) * row


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _build(cls, raw: Any, where: str):
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__}")
    known = _fields(cls)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    missing = [
        n
        for n, f in known.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and n not in raw
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    return cls(**raw)


def _check_list(value: Any, kind: type, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list")
    for v in value:
        ok = isinstance(v, kind) and not isinstance(v, bool)
        if kind is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            raise ConfigError(f"{where}: {v!r} is not a {kind.__name__}")
    return value


def validate(cfg: CalibrationConfig) -> CalibrationConfig:
    """Check a config; return it.

    Args:
        cfg: the config.

    Returns:
        ``cfg``.

    Raises:
        ConfigError: what is wrong and how to fix it.
    """
    if not isinstance(cfg.name, str) or not cfg.name:
        raise ConfigError("name must be a non-empty string")
    if cfg.device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {cfg.device!r}")
    _check_list(cfg.options, str, "options")
    for o in cfg.options:
        if o not in OPTION_NAMES:
            raise ConfigError(f"options: unknown option {o!r}; options are {OPTION_NAMES}")
    if "eager" not in cfg.options:
        raise ConfigError("options must include 'eager' (the planner needs a valid option)")
    for name in ("reps", "warmup"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "reps" else 0):
            raise ConfigError(f"{name} must be an integer >= {1 if name == 'reps' else 0}")
    if cfg.threads is not None and (not isinstance(cfg.threads, int) or cfg.threads < 1):
        raise ConfigError("threads must be a positive integer or null")
    if not isinstance(cfg.memory_limit_gib, (int, float)) or cfg.memory_limit_gib <= 0:
        raise ConfigError("memory_limit_gib must be a positive number")
    if cfg.grid is None and cfg.model is None:
        raise ConfigError("nothing to measure: give a 'grid', a 'model', or both")
    if cfg.grid is not None:
        g = cfg.grid
        _check_list(g.buffer_mib, float, "grid.buffer_mib")
        _check_list(g.write_ratios, float, "grid.write_ratios")
        _check_list(g.live_versions, int, "grid.live_versions")
        for w in g.write_ratios:
            if not 0 < w <= 1:
                raise ConfigError(f"grid.write_ratios: {w} is not in (0, 1]")
        for v in g.live_versions:
            if v < 1:
                raise ConfigError(f"grid.live_versions: {v} must be >= 1")
        for m in g.buffer_mib:
            if m <= 0:
                raise ConfigError(f"grid.buffer_mib: {m} must be > 0")
        for name in ("batch", "width", "expand"):
            v = getattr(g, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"grid.{name} must be a positive integer")
        limit = int(cfg.memory_limit_gib * 2**30)
        for s in cfg.shapes():
            est = s.estimate_bytes(g)
            if est > limit:
                raise ConfigError(
                    f"shape {s.label()} needs about {est / 2**30:.2f} GiB (buffer x "
                    f"(live versions + 2)), over memory_limit_gib={cfg.memory_limit_gib}; "
                    "lower buffer_mib or live_versions, or raise the limit if the machine has it"
                )
    if cfg.model is not None:
        if not isinstance(cfg.model.factory, str) or ":" not in cfg.model.factory:
            raise ConfigError(
                f"model.factory must be 'pkg.module:function', got {cfg.model.factory!r}"
            )
        if not isinstance(cfg.model.kwargs, dict):
            raise ConfigError("model.kwargs must be a mapping")
    return cfg


def reduce_config(cfg: CalibrationConfig) -> CalibrationConfig:
    """A short run of a config (``--reduced``): the same devices, options and model, fewer shapes.

    The grid keeps its smallest buffer size, its smallest and largest write
    ratio and its smallest and largest live-version count (at most 4 shapes,
    the corners of the grid at one size); at most 2 timed steps
    after at most 1 warm-up; shapes are measured in this process (no
    isolation: on CUDA the peak comes from the allocator's counters anyway).

    Args:
        cfg: a validated config.

    Returns:
        A new validated config named ``<name>-reduced``.
    """
    grid = None
    if cfg.grid is not None:
        g = cfg.grid
        grid = dataclasses.replace(
            g,
            buffer_mib=[min(g.buffer_mib)],
            write_ratios=sorted({min(g.write_ratios), max(g.write_ratios)}),
            live_versions=sorted({min(g.live_versions), max(g.live_versions)}),
        )
    return validate(
        dataclasses.replace(
            cfg,
            name=f"{cfg.name}-reduced",
            reps=min(cfg.reps, 2),
            warmup=min(cfg.warmup, 1),
            isolate=False,
            grid=grid,
        )
    )


def _parse_text(text: str, path: str) -> Any:
    try:
        import yaml  # type: ignore[import-not-found]
    except ImportError:
        yaml = None
    if yaml is not None:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: PyYAML is not installed, so configs are read as JSON (the JSON subset "
            f"of YAML), and this one is not JSON ({e}). Install pyyaml or write it as JSON."
        ) from None


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> CalibrationConfig:
    """Read and validate a calibration config.

    Args:
        source: a path to a YAML (or JSON) file, or the already-parsed mapping.

    Returns:
        The validated :class:`CalibrationConfig`.

    Raises:
        ConfigError: unreadable file, unknown or missing keys, bad values.
    """
    if isinstance(source, Mapping):
        raw, where = dict(source), "config"
    else:
        where = str(source)
        try:
            text = Path(source).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {where}: {e}") from None
        raw = _parse_text(text, where)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: the top level must be a mapping")
    raw = dict(raw)
    if raw.get("grid") is not None:
        raw["grid"] = _build(GridConfig, raw["grid"], f"{where}: grid")
    if raw.get("model") is not None:
        raw["model"] = _build(ModelConfig, raw["model"], f"{where}: model")
    try:
        cfg = _build(CalibrationConfig, raw, where)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    return validate(cfg)


# ----------------------------------------------------------------- workloads


@dataclass(kw_only=True, slots=True)
class Workload:
    """A model cut into segments, with its declared state and an input."""

    segments: list[torch.nn.Module]
    """The segments in program order."""
    state: list[Any]
    """Declared state of every checkpointed segment."""
    make_input: Callable[[], torch.Tensor]
    """Returns a fresh input batch (requires grad)."""
    description: str = ""
    """One line for reports."""
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    """Maps the last segment's output to the scalar loss (None: mean of squares).
    It runs between the forward and the backward, where a training step also
    updates its state (a MoCo queue's in-place enqueue), so the options are
    measured, and refused, as that step would run them."""


class BufferSegment(torch.nn.Module):
    """A segment that reads and rewrites rows of a shared buffer.

    It reads the ``write_rows`` rows it is about to rewrite (old keys), mixes
    their mean into a linear layer, widens the activation ``expand`` times
    (elementwise, so activations are large but cheap), and rewrites the rows as
    an exponential moving average toward its output (read-modify-write). The
    buffer is never saved for backward, so running it eagerly is valid.

    Args:
        buffer: the shared ``(rows, width)`` float32 buffer.
        index: position of the segment (selects its rows, ring-buffer style).
        write_rows: rows rewritten per call (``rows`` for a dense write).
        width: features.
        expand: activation size in multiples of the input.
    """

    def __init__(
        self, buffer: torch.Tensor, index: int, write_rows: int, width: int, expand: int
    ) -> None:
        super().__init__()
        self.buffer = buffer  # not a registered buffer: it is declared state
        self.index = index
        self.write_rows = write_rows
        self.lin = torch.nn.Linear(width, width)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, expand).unsqueeze(1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Read the old rows, compute, rewrite the rows."""
        rows = self.buffer.shape[0]
        k = min(self.write_rows, rows)
        start = (self.index * k) % rows
        end = min(rows, start + k)
        ctx = self.buffer[start:end].mean(0)
        z = self.lin(h) + ctx
        wide = torch.tanh(z.unsqueeze(1) * self.scale)
        out = torch.tanh(wide.mean(1))
        with torch.no_grad():  # one destructive write: halfway toward the new key
            self.buffer[start:end].lerp_(out.mean(0).expand(end - start, -1), 0.5)
        return out


def buffer_workload(
    *,
    segments: int,
    buffer_mib: float,
    write_ratio: float,
    batch: int,
    width: int,
    expand: int | Sequence[int],
    seed: int = 0,
    device: str = "cpu",
) -> Workload:
    """Segments that share one declared buffer (see :class:`BufferSegment`).

    Args:
        segments: number of segments (live versions of the buffer).
        buffer_mib: buffer size in MiB.
        write_ratio: share of the buffer each segment rewrites, in (0, 1].
        batch: rows of the activation.
        width: features (and floats per buffer row).
        expand: activation size per segment in multiples of the input: one
            integer, or one per segment (cycled).
        seed: parameter and input seed.
        device: where the buffer, parameters and input live.

    Returns:
        The :class:`Workload`.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = _buffer_bytes(buffer_mib, width) // (width * 4)
    buffer = torch.randn(rows, width, generator=gen).to(device)
    k = max(1, round(write_ratio * rows))
    expands = [expand] if isinstance(expand, int) else list(expand)
    torch.manual_seed(seed)
    segs = [
        BufferSegment(buffer, i, k, width, expands[i % len(expands)]).to(device)
        for i in range(segments)
    ]
    x = torch.randn(batch, width, generator=gen).to(device)

    def make_input() -> torch.Tensor:
        return x.clone().requires_grad_(True)

    return Workload(
        segments=segs,
        state=[buffer],
        make_input=make_input,
        description=(
            f"{segments} segments, buffer {rows * width * 4 / _MIB:g} MiB, "
            f"{k} of {rows} rows rewritten per segment, batch {batch} x {width}, expand {expand}"
        ),
    )


def shape_workload(
    shape: Shape, grid: GridConfig, *, seed: int = 0, device: str = "cpu"
) -> Workload:
    """The workload of one grid shape.

    Args:
        shape: the shape.
        grid: the grid's activation settings.
        seed: seed.
        device: where it lives.

    Returns:
        The :class:`Workload`.
    """
    return buffer_workload(
        segments=shape.live_versions,
        buffer_mib=shape.buffer_bytes / _MIB,
        write_ratio=shape.write_ratio,
        batch=grid.batch,
        width=grid.width,
        expand=grid.expand,
        seed=seed,
        device=device,
    )


def queue_workload(
    *,
    segments: int = 8,
    queue_mib: float = 8,
    write_ratio: float = 0.001,
    batch: int = 128,
    width: int = 512,
    wide: int = 48,
    narrow: int = 4,
    seed: int = 0,
    device: str = "cpu",
) -> Workload:
    """Sparse writes into a large ring buffer with many live versions.

    Segments alternate wide (activations ``wide`` x input, larger than the
    queue) and narrow (``narrow`` x input); each rewrites ``write_ratio`` of
    the queue.

    Args:
        segments: number of segments.
        queue_mib: queue size in MiB.
        write_ratio: share of the queue each segment rewrites.
        batch: rows of the activation.
        width: features.
        wide: expansion of the even segments.
        narrow: expansion of the odd segments.
        seed: seed.
        device: where it lives.

    Returns:
        The :class:`Workload`.
    """
    return buffer_workload(
        segments=segments,
        buffer_mib=queue_mib,
        write_ratio=write_ratio,
        batch=batch,
        width=width,
        expand=[wide, narrow],
        seed=seed,
        device=device,
    )


def dense_workload(**kwargs: Any) -> Workload:
    """:func:`queue_workload` with ``write_ratio=1``: every segment rewrites the
    whole buffer (regions keep as much as a snapshot).

    Args:
        **kwargs: as :func:`queue_workload` (``write_ratio`` is forced to 1).

    Returns:
        The :class:`Workload`.
    """
    kwargs["write_ratio"] = 1.0
    return queue_workload(**kwargs)


def _resolve_factory(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # pkg.module names are found from the current directory
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"model.factory {spec!r}: cannot import {module!r}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"model.factory {spec!r}: {module} has no callable {name!r}")
    return fn


# --------------------------------------------------------------- measurement


def _rss_reset() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class _PhysicalPeak:
    """Peak RSS (CPU) or CUDA allocator peak above the level at start()."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = _rss_reset()

    def peak(self) -> int:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated() - self.base)
        return max(0, _status_kib("VmHWM") * 1024 - self.base)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _check_device(w: Workload, device: str) -> Workload:
    for t in w.state:
        if isinstance(t, torch.Tensor) and t.device.type != device:
            raise ConfigError(
                f"the workload's state lives on {t.device}, the config says {device!r}; "
                "let the factory take device= (the built-in factories do)"
            )
    return w


def _call_factory(fn: Callable[..., Workload], kwargs: dict[str, Any], device: str) -> Workload:
    import inspect

    kwargs = dict(kwargs)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "device" in params and "device" not in kwargs:
        kwargs["device"] = device
    return fn(**kwargs)


def measure_segments(
    workload: Workload,
    options: Sequence[str],
    *,
    reps: int = 3,
    warmup: int = 1,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every option on every segment of a workload (see the module docstring).

    Args:
        workload: the segments, declared state and input.
        options: option names to try; ``guard`` is tried per segment and kept
            where the engine accepts it.
        reps: timed steps (median kept).
        warmup: untimed steps first.
        device: ``"cpu"`` or ``"cuda"`` (for the physical peak).
        progress: called with a short label after each measurement
            (:func:`measurement_count` says how many there will be).

    Returns:
        ``{"persistent": int, "options": {name: {...}}, "segments": [[option
        dicts]], "fingerprint": {...}}``: per option the step time, the physical and tracked peaks
        and the per-segment costs (or ``valid: False`` with the reason), and
        per segment its list of valid options as :class:`Option` fields; the
        fingerprint of the segments and of each segment's input (see
        :func:`model_fingerprint`).
    """
    n = len(workload.segments)
    tick = progress or (lambda label: None)
    inputs = _record_inputs(workload)
    per_option: dict[str, Any] = {}
    seg_opts: list[dict[str, dict[str, Any]]] = [{} for _ in range(n)]
    persistent = 0
    for name in options:
        if name == "guard":
            continue
        res = _measure_choices(workload, [name] * n, reps=reps, warmup=warmup, device=device)
        persistent = res.pop("persistent")
        per_option[name] = res
        tick(name)
        if res["valid"]:
            for i, cost in enumerate(res["segments"]):
                seg_opts[i][name] = cost
    if "guard" in options:
        # Guard keeps nothing and refuses when the state changes: try it segment by
        # segment (others eager), only where the snapshot run saw no declared write.
        written = per_option.get("snapshot", {}).get("written_bytes")
        guard: dict[str, Any] = {"valid": False, "segments": [None] * n, "reason": {}}
        for i in range(n):
            if written is not None and written[i] > 0:
                guard["reason"][i] = "writes declared state"
                tick(f"guard {i}")
                continue
            choices = ["eager"] * n
            choices[i] = "guard"
            res = _measure_choices(workload, choices, reps=reps, warmup=warmup, device=device)
            res.pop("persistent")
            if res["valid"]:
                guard["segments"][i] = res["segments"][i]
                seg_opts[i]["guard"] = res["segments"][i]
                guard["valid"] = True
            else:
                guard["reason"][i] = res["reason"]
            tick(f"guard {i}")
        per_option["guard"] = guard
    return {
        "persistent": persistent,
        "options": per_option,
        "segments": [
            [dict(name=k, **v) for k, v in opts.items() if k in OPTION_NAMES] for opts in seg_opts
        ],
        "fingerprint": model_fingerprint(workload.segments, inputs),
    }


def measurement_count(options: Sequence[str], segments: int) -> int:
    """How many measurements :func:`measure_segments` makes (progress bar length).

    Args:
        options: the option names.
        segments: the number of segments.

    Returns:
        One per option other than ``guard``, plus one per segment for ``guard``.
    """
    return len([o for o in options if o != "guard"]) + (segments if "guard" in options else 0)


def _measure_choices(
    workload: Workload, choices: list[str], *, reps: int, warmup: int, device: str
) -> dict[str, Any]:
    from .planned import PlannedSequential

    model = PlannedSequential(workload.segments, state=workload.state, choices=choices)
    persistent = model.persistent
    kept = _state_tensors(workload.state)
    snapshot = [t.detach().clone() for t in kept]
    physical = _PhysicalPeak(device)
    times: list[list[float]] = [[] for _ in choices]
    steps: list[float] = []
    try:
        for _ in range(warmup):
            model.profile_step(workload.make_input(), workload.loss_fn, track_memory=False)
        physical.start()
        for _ in range(reps):
            for p in model.parameters():
                p.grad = None
            x = workload.make_input()
            _sync(device)
            t0 = time.perf_counter()
            profs, _ = model.profile_step(x, workload.loss_fn, track_memory=False)
            _sync(device)
            steps.append(time.perf_counter() - t0)
            for i, p in enumerate(profs):
                times[i].append(p.forward_s + p.backward_s)
        phys = physical.peak()
        kernel = None
        if device == "cuda":  # device time of one step from CUPTI (torch_replay.kernel_timing)
            kernel = time_kernels(
                lambda: model.profile_step(
                    workload.make_input(), workload.loss_fn, track_memory=False
                ),
                device=device,
                reps=1,
                warmup=0,
            )
        report = model.measure(workload.make_input(), workload.loss_fn)
    except ReplayError as e:
        return {"persistent": persistent, "valid": False, "reason": f"{type(e).__name__}: {e}"}
    finally:
        with torch.no_grad():  # the next measurement starts from the same state
            for t, c in zip(kept, snapshot, strict=True):
                t.copy_(c)
        for p in model.parameters():
            p.grad = None
    segments = []
    for i, p in enumerate(report.segments):
        preserved = p.preserved_bytes if choices[i] != "eager" else 0
        segments.append(
            {
                "retained": int(p.retained_tensor_bytes + preserved),
                "transient": int(max(p.forward_extra_bytes, p.backward_transient_bytes)),
                "time": float(statistics.median(times[i])),
                "preserved": int(preserved),
            }
        )
    model_peak = plan_peak(
        [Option(c, **s) for c, s in zip(choices, segments, strict=True)], persistent
    )
    return {
        "persistent": persistent,
        "valid": True,
        "step_s": float(statistics.median(steps)),
        **({"kernel_s": kernel.seconds, "kernel_source": kernel.source} if kernel else {}),
        "physical_peak_delta": int(phys),
        "tracked_peak": int(report.measured_peak),
        "model_peak": int(model_peak),
        "written_bytes": [int(p.written_bytes) for p in report.segments],
        "replay_transient_bytes": [int(p.replay_transient_bytes) for p in report.segments],
        "segments": segments,
    }


def _measure_shape(cfg: CalibrationConfig, index: int) -> dict[str, Any]:
    shape = cfg.shapes()[index]
    assert cfg.grid is not None
    w = shape_workload(shape, cfg.grid, seed=cfg.seed, device=cfg.device)
    res = measure_segments(w, cfg.options, reps=cfg.reps, warmup=cfg.warmup, device=cfg.device)
    return {
        "buffer_bytes": shape.buffer_bytes,
        "write_ratio": shape.write_ratio,
        "live_versions": shape.live_versions,
        "written_bytes_per_segment": _written(w),
        **res,
    }


def _written(w: Workload) -> int:
    seg = w.segments[0]
    if isinstance(seg, BufferSegment):
        rows, width = seg.buffer.shape
        return min(seg.write_rows, rows) * width * seg.buffer.element_size()
    return 0


# --------------------------------------------------------------- fingerprint


def _describe_value(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (list, tuple)):
        return [_describe_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _describe_value(x) for k, x in v.items()}
    return type(v).__name__


def _describe_segment(m: Any) -> dict[str, Any]:
    cls = type(m)
    out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    if isinstance(m, torch.nn.Module):
        out["parameters"] = [
            [n, list(p.shape), str(p.dtype).replace("torch.", "")] for n, p in m.named_parameters()
        ]
        out["buffers"] = [
            [n, list(b.shape), str(b.dtype).replace("torch.", "")]
            for n, b in m.named_buffers()
            if b is not None
        ]
    elif hasattr(m, "__qualname__"):
        out["class"] = f"{getattr(m, '__module__', '?')}.{m.__qualname__}"
    return out


def _segment_names(segments: Any) -> list[str]:
    if isinstance(segments, torch.nn.Sequential):
        return [n for n, _ in segments.named_children()]
    return [str(i) for i in range(len(list(segments)))]


def model_fingerprint(segments: Any, inputs: Sequence[Any] | None = None) -> dict[str, Any]:
    """What identifies the model a costs file was measured on.

    Args:
        segments: the segments (a list of modules or an ``nn.Sequential``).
        inputs: each segment's input as seen during calibration, already
            described (shapes and dtypes), or None.

    Returns:
        ``{"digest", "segments": [{"name", "class", "parameters",
        "buffers", "input"}]}``; ``digest`` is a SHA-256 over the segments'
        classes, parameter and buffer names, shapes and dtypes (not the
        inputs: the batch may change), so two models with the same digest
        have the same structure.
    """
    import hashlib

    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    names = _segment_names(segments)
    described = [_describe_segment(m) for m in mods]
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    segs = []
    for i, d in enumerate(described):
        entry = {"name": names[i], **d}
        if inputs is not None and i < len(inputs):
            entry["input"] = inputs[i]
        segs.append(entry)
    return {"digest": digest, "segments": segs}


def _state_tensors(state: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for item in state or ():
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, torch.nn.Module):
            out.extend(b for b in item.buffers() if b is not None)
            out.extend(item.parameters())
        elif isinstance(item, (list, tuple)):
            out.extend(_state_tensors(item))
    return out


class _Kept:
    """Restores buffers, declared state, gradients and torch's CPU generator on exit.

    Calibration runs training steps; the user's model must come out as it went in.
    """

    def __init__(self, segments: Sequence[Any], state: Any) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.params: list[torch.nn.Parameter] = []
        for m in segments:
            if isinstance(m, torch.nn.Module):
                for b in m.buffers():
                    if b is not None:
                        self.tensors[id(b)] = b
                self.params.extend(m.parameters())
        for t in _state_tensors(state):
            self.tensors[id(t)] = t
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.grads: list[Any] = []
        self.rng = None

    def __enter__(self) -> _Kept:
        self.copies = [(t, t.detach().clone()) for t in self.tensors.values()]
        self.grads = [p.grad for p in self.params]
        self.rng = torch.get_rng_state()
        return self

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for t, c in self.copies:
                t.copy_(c)
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g
        torch.set_rng_state(self.rng)


def _record_inputs(workload: Workload) -> list[Any]:
    """Each segment's input (described) in one no-grad forward; state restored after."""
    seen: list[Any] = []
    with _Kept(workload.segments, workload.state), torch.no_grad():
        h = workload.make_input()
        for seg in workload.segments:
            seen.append(_describe_value(h))
            h = seg(h)
    return seen


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """The machine a calibration ran on (written into every costs file).

    Args:
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        ``{"torch", "python", "platform", "cpu", "cpus", "threads", "device"}``
        and ``"gpu"`` on CUDA.
    """
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def _first_difference(want: Mapping[str, Any], have: Mapping[str, Any]) -> str:
    if want.get("class") != have.get("class"):
        return f"it is a {want.get('class')} in the costs, a {have.get('class')} here"
    for kind in ("parameters", "buffers"):
        a = {n: (s, d) for n, s, d in want.get(kind, [])}
        b = {n: (s, d) for n, s, d in have.get(kind, [])}
        for n in [*a, *(n for n in b if n not in a)]:  # registration order
            if n not in b:
                return f"{kind[:-1]} {n!r} is in the costs, not here"
            if n not in a:
                return f"{kind[:-1]} {n!r} is here, not in the costs"
            if a[n] != b[n]:
                return (
                    f"{kind[:-1]} {n!r} is {a[n][1]} {tuple(a[n][0])} in the costs, "
                    f"{b[n][1]} {tuple(b[n][0])} here"
                )
    return "their structure differs"


_RECALIBRATE = (
    "Calibrate the model you run: tr.calibrate_model(segments, example_input, state=..., "
    "out='costs.json'), `python -m torch_replay.calibrate --model pkg.module:factory "
    "--out costs.json`, or PlannedSequential(..., costs='auto')."
)


def check_costs(doc: Mapping[str, Any], segments: Any, *, source: str = "the costs") -> None:
    """Check that a costs document was calibrated on ``segments``, on this machine.

    Args:
        doc: a costs document (:data:`SCHEMA`) with a ``model`` section.
        segments: the segments that will run (modules or an ``nn.Sequential``).
        source: how to name the costs in messages (a file name).

    Raises:
        CostsMismatchError: another number of segments, or a segment whose
            class, parameter or buffer names, shapes or dtypes differ.

    Warns:
        UserWarning: the costs carry no fingerprint (written before it
            existed: nothing can be checked), or were measured with another
            torch version or on another CPU or GPU (costs may be stale).
    """
    import warnings

    from .errors import CostsMismatchError

    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    entry = doc.get("model") or {}
    n_costs = len(entry.get("segments") or [])
    what = entry.get("description") or entry.get("factory") or "another model"
    if n_costs != len(mods):
        raise CostsMismatchError(
            f"{source} describe {n_costs} segments ({what}); this model has {len(mods)}: "
            f"the costs belong to another model. {_RECALIBRATE}"
        )
    fp = entry.get("fingerprint")
    if not fp:
        warnings.warn(
            f"{source} carry no model fingerprint (written by an older torch_replay), so "
            "they cannot be checked against this model; recalibrate to get one",
            stacklevel=3,
        )
        return
    have = model_fingerprint(mods)
    if fp.get("digest") != have["digest"]:
        for i, (want, got) in enumerate(zip(fp["segments"], have["segments"], strict=True)):
            want_s = {k: want.get(k) for k in ("class", "parameters", "buffers")}
            got_s = {k: got.get(k) for k in ("class", "parameters", "buffers")}
            if want_s != got_s:
                raise CostsMismatchError(
                    f"{source} were calibrated on another model ({what}): segment {i}"
                    + (f" ({want['name']})" if want.get("name", str(i)) != str(i) else "")
                    + f" differs: {_first_difference(want, got)}. "
                    f"{_RECALIBRATE}"
                )
    machine = doc.get("machine") or {}
    here = machine_info(machine.get("device", "cpu"))
    stale = [
        f"{k} {machine[k]!r} there, {here.get(k)!r} here"
        for k in ("torch", "cpu", "gpu")
        if k in machine and machine[k] != here.get(k)
    ]
    if stale:
        warnings.warn(
            f"{source} were measured elsewhere ({'; '.join(stale)}): the plan follows those "
            "times and bytes; recalibrate on this machine for a plan that fits it",
            stacklevel=3,
        )


# ------------------------------------------------------------ your own model


def _as_workload(made: Any, where: str) -> Workload:
    if isinstance(made, Workload) or (
        type(made).__name__ == "Workload" and hasattr(made, "make_input")
    ):
        return made
    if isinstance(made, Mapping):
        made = dict(made)
        try:
            segs, x = made.pop("segments"), made.pop("example_input")
        except KeyError as e:
            raise ConfigError(f"{where} returned a dict without {e.args[0]!r}") from None
        return workload_from(segs, x, **made)
    if isinstance(made, tuple) and len(made) in (2, 3):
        return workload_from(*made)
    raise ConfigError(
        f"{where} must return a torch_replay.calibrate.Workload, a tuple (segments, "
        f"example_input) or (segments, example_input, state), or a dict with keys "
        f"'segments', 'example_input' (and optionally 'state', 'loss_fn'); got "
        f"{type(made).__name__}"
    )


def workload_from(
    segments: Any,
    example_input: Any,
    state: Any = None,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    description: str = "",
) -> Workload:
    """A :class:`Workload` from your segments and one example input.

    Args:
        segments: an ``nn.Sequential`` or a list of modules, in program order.
        example_input: the first segment's input (a tensor: a detached clone
            is passed at every step, requiring grad when it is floating
            point), or a callable returning a fresh input.
        state: the declared state (tensors, modules, generators), as for
            :class:`~torch_replay.PlannedSequential`.
        loss_fn: maps the last output to a scalar loss (default: mean of squares).
        description: one line for reports (default: the segment classes).

    Returns:
        The :class:`Workload`.
    """
    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    if callable(example_input) and not isinstance(example_input, torch.Tensor):
        make_input = example_input
    elif isinstance(example_input, torch.Tensor):
        x0 = example_input.detach().clone()

        def make_input() -> torch.Tensor:
            x = x0.clone()
            return x.requires_grad_(True) if x.is_floating_point() else x

    else:
        raise TypeError(
            "example_input must be a tensor or a callable returning the first segment's "
            f"input, got {type(example_input).__name__}"
        )
    if not description:
        kinds = [type(m).__name__ for m in mods]
        description = f"{len(mods)} segments: " + ", ".join(_cut(kinds, 6))
    return Workload(
        segments=mods,
        state=list(state) if state is not None else [],
        make_input=make_input,
        loss_fn=loss_fn,
        description=description,
    )


def _cut(items: Sequence[str], limit: int) -> list[str]:
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… ({len(items) - limit} more, {len(items)} in all)"]


def calibrate_model(
    segments: Any,
    example_input: Any = None,
    *,
    state: Any = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    options: Sequence[str] | None = None,
    reps: int = 3,
    warmup: int = 1,
    quick: bool = False,
    device: str | None = None,
    progress: bool = True,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Measure the options of each segment of **your** model; return (and write) its costs.

    Every option of ``options`` runs one training step per repetition on the
    whole sequence (forward, ``loss_fn``, backward); ``guard`` is tried one
    segment at a time where the snapshot run saw no write to declared state.
    Buffers, declared state, gradients and torch's CPU generator are restored
    afterwards. The costs carry the model's fingerprint (segment names,
    classes, parameter and buffer shapes and dtypes, each segment's input
    shape and dtype) and the machine (torch version, CPU, GPU), which
    :class:`~torch_replay.PlannedSequential` checks.

    Args:
        segments: an ``nn.Sequential`` or a list of modules, or a
            :class:`Workload` (then ``example_input``, ``state`` and
            ``loss_fn`` come from it).
        example_input: the first segment's input (tensor or callable).
        state: the declared state, as for ``PlannedSequential``.
        loss_fn: maps the last output to a scalar (default: mean of squares).
            Put there what your training step does between forward and
            backward (an in-place queue update), so the options are measured
            and refused as your step would run them.
        options: option names (default: all five).
        reps: timed steps per option (median kept).
        warmup: untimed steps before them.
        quick: the small run: one timed step, no warm-up (noisier times,
            the same byte counts).
        device: ``"cpu"`` or ``"cuda"`` (default: where the first parameter lives).
        progress: draw a progress bar on stderr.
        out: also write the costs JSON there.

    Returns:
        The costs document (:data:`SCHEMA`); give it, or the file, to
        ``PlannedSequential(costs=...)``.

    Raises:
        ConfigError: an unknown option name or a bad count.
    """
    if isinstance(segments, Workload):
        w = segments
    else:
        if example_input is None:
            raise TypeError("calibrate_model needs example_input (the first segment's input)")
        w = workload_from(segments, example_input, state, loss_fn=loss_fn)
    opts = list(options) if options is not None else list(OPTION_NAMES)
    for o in opts:
        if o not in OPTION_NAMES:
            raise ConfigError(f"unknown option {o!r}; options are {OPTION_NAMES}")
    if "eager" not in opts:
        raise ConfigError("options must include 'eager' (the planner needs a valid option)")
    if quick:
        reps, warmup = 1, 0
    if reps < 1 or warmup < 0:
        raise ConfigError("reps must be >= 1 and warmup >= 0")
    if device is None:
        device = "cpu"
        for m in w.segments:
            if isinstance(m, torch.nn.Module):
                p = next(m.parameters(), None)
                if p is not None:
                    device = p.device.type
                    break
    bar = _Progress(measurement_count(opts, len(w.segments)), progress)
    with _Kept(w.segments, w.state):
        res = measure_segments(
            w, opts, reps=reps, warmup=warmup, device=device, progress=bar.update
        )
    doc = {
        "schema": SCHEMA,
        "config": {"options": opts, "reps": reps, "warmup": warmup, "device": device},
        "machine": machine_info(device),
        "time_unit": "s",
        "grid": [],
        "model": {"factory": None, "kwargs": {}, "description": w.description, **res},
    }
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# ------------------------------------------------------------------ progress


class _Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool = True, width: int = 28) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled and total > 0
        self.width = width
        self.start = time.perf_counter()

    def update(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        sys.stderr.write(
            f"\r[{bar}] {self.done}/{self.total} {label:<32} {elapsed:6.1f}s eta {eta:5.0f}s"
        )
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


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
        fn = _resolve_factory(cfg.model.factory)
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
        with _Kept(w.segments, w.state):
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
        One list of :class:`Option` per segment (valid options only).

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


# ----------------------------------------------------------------------- CLI


def summary(doc: Mapping[str, Any]) -> str:
    """A markdown table of the grid: per shape, region vs snapshot and eager.

    Args:
        doc: a costs document.

    Returns:
        Markdown text.
    """
    grid = doc.get("grid") or []
    # CUDA runs also carry the step's device time from CUPTI (torch_replay.kernel_timing).
    kernel = any(o and "kernel_s" in o for g in grid for o in g["options"].values())
    lines = [
        "| buffer MiB | write ratio | live versions | option | step s "
        + ("| kernel s (source) " if kernel else "")
        + "| tracked peak MiB | physical peak delta MiB | model peak MiB | peak / snapshot "
        "| time / snapshot |",
        "|---|---|---|---|---|" + ("---|" if kernel else "") + "---|---|---|---|---|",
    ]
    for g in grid:
        snap = g["options"].get("snapshot") or {}
        for name in OPTION_NAMES:
            o = g["options"].get(name)
            if not o or not o.get("valid") or "step_s" not in o:
                continue
            pr = f"{o['tracked_peak'] / snap['tracked_peak']:.4f}" if snap.get("valid") else "-"
            tr_ = f"{o['step_s'] / snap['step_s']:.3f}" if snap.get("valid") else "-"
            lines.append(
                f"| {g['buffer_bytes'] / _MIB:g} | {g['write_ratio']:g} | {g['live_versions']} "
                f"| {name} | {o['step_s']:.4f} "
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
        _resolve_factory(cfg.model.factory)
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
    src.add_argument("--config", help="a YAML (or JSON) config, e.g. configs/cpu.yaml")
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
        fn = _resolve_factory(a.model)
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


if __name__ == "__main__":
    # Run the CLI from the imported module, not from ``__main__``, so that the factories'
    # Workload (torch_replay.calibrate.Workload) is the class this code checks for.
    from torch_replay.calibrate import main as _main

    raise SystemExit(_main())
