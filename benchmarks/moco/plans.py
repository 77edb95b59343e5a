"""Calibration of the MoCo query encoder's segments and the budget of the planned methods
(:func:`calibrate_plans`; see :mod:`benchmarks.moco.train`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import torch_replay as tr
from torch_replay.calibrate import Workload, measure_segments
from torch_replay.planner import Option, plan_peak

from .config import ENGINE_METHODS, MIB, MocoConfig, build_moco, persistent_bytes
from .data import SyntheticCifar, augment

__all__ = ["Plans", "calibrate_plans"]


@dataclass(kw_only=True, slots=True)
class Plans:
    """Calibrated costs and the budget the planned methods run under."""

    costs: list[list[Option]]
    """Valid options per segment (eager measured with the delayed enqueue, the
    others with the enqueue between forward and backward)."""
    persistent: int
    """Persistent bytes charged to every plan."""
    budget: int
    """The budget of ``joint`` and ``eager_whole``."""
    all_eager_peak: int
    """Predicted peak with every segment eager."""
    joint_min_budget: int
    """Smallest budget the joint planner can meet."""
    refused: dict[str, str] = field(default_factory=dict)
    """Options the calibration measured as invalid, with the error."""
    seconds: float = 0.0
    """Wall time of the calibration."""


def calibrate_plans(cfg: MocoConfig, data: SyntheticCifar, seed: int) -> Plans:
    """Measure every option of every query segment on a separate model of ``seed``.

    Uses :func:`torch_replay.calibrate.measure_segments` (one option on every
    segment per run). The recomputing options run with the MoCo step's in-place
    enqueue between forward and backward (``Workload.loss_fn``), so an engine
    that cannot undo it is measured as invalid; ``eager`` runs with the enqueue
    delayed, as the ``eager`` method does (an eager segment's costs do not depend
    on when the enqueue happens). The training runs never see this model.

    Args:
        cfg: the experiment.
        data: the data set (one batch is used).
        seed: seed of the calibration model.

    Returns:
        The :class:`Plans`.
    """
    t0 = time.perf_counter()
    moco = build_moco(cfg, seed)
    g = torch.Generator().manual_seed(seed)
    imgs = data.train_images[: cfg.batch]
    v1, v2 = augment(imgs, g), augment(imgs, g)
    keys = moco.keys(v2)
    moco.head.keys = keys
    target = torch.zeros(cfg.batch, dtype=torch.long)

    def enqueue_between(out: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(out, target)
        moco.enqueue(keys)
        return loss

    def loss_only(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    def workload(loss_fn: Callable[[Any], torch.Tensor]) -> Workload:
        return Workload(
            segments=moco.segments(),
            state=moco.segment_state(),
            make_input=lambda: v1.clone().requires_grad_(True),
            loss_fn=loss_fn,
            description="MoCo query encoder",
        )

    reps = cfg.calibration_reps
    eager = measure_segments(workload(loss_only), ["eager"], reps=reps, warmup=1)
    rest = measure_segments(workload(enqueue_between), list(ENGINE_METHODS), reps=reps, warmup=1)
    costs = [
        [Option(**o) for o in e] + [Option(**o) for o in r]
        for e, r in zip(eager["segments"], rest["segments"], strict=True)
    ]
    refused = {
        name: res["reason"] for name, res in rest["options"].items() if not res.get("valid", True)
    }
    persistent = persistent_bytes(moco, cfg)
    eager_opts = [next(o for o in seg if o.name == "eager") for seg in costs]
    all_eager = plan_peak(eager_opts, persistent)
    try:
        tr.plan(costs, budget=0, persistent=persistent, objective="joint")
        joint_min = 0
    except tr.InfeasibleBudgetError as e:
        joint_min = int(e.min_budget)
    if cfg.budget_mib is not None:
        budget = int(cfg.budget_mib * MIB)
    else:
        budget = int(joint_min + cfg.budget_frac * (all_eager - joint_min))
    return Plans(
        costs=costs,
        persistent=persistent,
        budget=budget,
        all_eager_peak=all_eager,
        joint_min_budget=joint_min,
        refused=refused,
        seconds=time.perf_counter() - t0,
    )
