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

from .cli import costs_table, dry_run, main, summary
from .config import (
    SCHEMA,
    CalibrationConfig,
    ConfigError,
    GridConfig,
    ModelConfig,
    Shape,
    load_config,
    reduce_config,
)
from .fingerprint import check_costs, machine_info, model_fingerprint
from .measure import PhysicalPeak, measure_segments, measurement_count
from .own_model import calibrate_model, workload_from
from .run import calibrate, load_costs, plot
from .workloads import (
    BufferSegment,
    Workload,
    buffer_workload,
    dense_workload,
    queue_workload,
    resolve_factory,
    shape_workload,
)

__all__ = [
    "BufferSegment",
    "CalibrationConfig",
    "ConfigError",
    "GridConfig",
    "ModelConfig",
    "PhysicalPeak",
    "SCHEMA",
    "Shape",
    "Workload",
    "buffer_workload",
    "calibrate",
    "calibrate_model",
    "check_costs",
    "costs_table",
    "dense_workload",
    "dry_run",
    "load_config",
    "load_costs",
    "machine_info",
    "main",
    "measure_segments",
    "measurement_count",
    "model_fingerprint",
    "plot",
    "queue_workload",
    "reduce_config",
    "resolve_factory",
    "shape_workload",
    "summary",
    "workload_from",
]
