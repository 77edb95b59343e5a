"""The calibration config: schema, validation, loading (YAML or its JSON subset)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..planner import OPTION_NAMES

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


def shipped_config(name: str | os.PathLike) -> Path | None:
    """The file of a config shipped with the package (``configs/*.yaml`` of the source,
    installed as ``torch_replay/configs/``), wherever the package is installed.

    Args:
        name: ``"cpu"``, ``"cpu.yaml"`` or ``"configs/cpu.yaml"`` (as the docs and the
            command line's help spell them).

    Returns:
        The path, or ``None`` when ``name`` names no shipped config.
    """
    parent, base = os.path.split(os.fspath(name))
    stem = base[: -len(".yaml")] if base.endswith(".yaml") else base
    if parent not in ("", "configs") or not stem or os.sep in stem:
        return None
    package = Path(__file__).resolve().parent.parent
    # Installed: torch_replay/configs/ (pyproject.toml's package-dir); a checkout: configs/.
    for folder in (package / "configs", package.parent / "configs"):
        if (folder / f"{stem}.yaml").is_file():
            return folder / f"{stem}.yaml"
    return None


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> CalibrationConfig:
    """Read and validate a calibration config.

    Args:
        source: a path to a YAML (or JSON) file, or the already-parsed mapping. A path
            that does not exist and names a shipped config (``configs/cpu.yaml``,
            ``cpu.yaml`` or ``cpu``) reads the package's copy,
            so the examples of the docs work from any directory.

    Returns:
        The validated :class:`CalibrationConfig`.

    Raises:
        ConfigError: unreadable file, unknown or missing keys, bad values.
    """
    if isinstance(source, Mapping):
        raw, where = dict(source), "config"
    else:
        where = str(source)
        if not Path(source).exists():
            source = shipped_config(source) or source
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
