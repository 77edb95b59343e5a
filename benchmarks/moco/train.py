"""The seven methods, the MoCo training step and the linear probe (the calibration is
:mod:`benchmarks.moco.plans`'s, the configuration :mod:`benchmarks.moco.config`'s).

One training step (MoCo v2, ``moco/builder.py`` order): two augmented views of a
batch; momentum update of the key encoder; keys of view 2; query logits of
view 1 (the checkpointed query encoder, :mod:`benchmarks.moco.model`); InfoNCE
loss; the keys are enqueued **in place** into the queue; backward; SGD step.

The seven methods (:data:`METHODS`) differ only in how the query encoder's four
segments keep or recompute their activations:

* ``eager``: no recomputation ("delayed eager"): the head's matmul saved the
  queue for backward, so an in-place enqueue before backward would make autograd
  refuse; the enqueue is delayed until after backward, which computes the same
  values (the enqueue reads the keys only).
* ``torch_checkpoint``: every segment through ``torch.utils.checkpoint``
  (non-reentrant); its re-run of the head reads the already-enqueued queue and
  BatchNorm statistics are updated twice: expected to diverge.
* ``snapshot`` / ``journal`` / ``readset``: every segment through
  :class:`torch_replay.PlannedSequential` with that engine, the queue declared
  for the head.
* ``joint``: :class:`~torch_replay.PlannedSequential` planned with
  ``objective="joint"`` from costs calibrated on this model
  (:func:`calibrate_plans`), under the budget given there.
* ``eager_whole``: the same costs and budget, ``objective="eager_whole"``
  (eager and whole snapshot only).

Whenever a plan runs the head eagerly the enqueue is delayed as for ``eager``;
otherwise it happens between forward and backward.

Randomness: the model is built under ``torch.manual_seed(seed)``; batch order
and augmentations come from a per-run ``torch.Generator`` seeded with ``seed``;
the probe's order from one seeded with ``seed + 1``. Nothing else draws.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torch_replay as tr
from torch_replay.planned import LiveBytesTracker, PlannedSequential, static_bytes

from .config import CORRECT, ENGINE_METHODS, METHODS, MocoConfig, TorchCheckpointed, build_moco
from .data import SyntheticCifar, augment, normalize
from .plans import Plans, calibrate_plans

__all__ = [
    "CORRECT",
    "METHODS",
    "MocoConfig",
    "Plans",
    "Run",
    "accuracy_from_scores",
    "calibrate_plans",
    "run_seed",
]


# ------------------------------------------------------------------------ run


def _sha256(buf: bytes) -> str:
    return hashlib.sha256(buf).hexdigest()


def _tensor_bytes(tensors: Sequence[torch.Tensor]) -> bytes:
    return b"".join(
        t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() for t in tensors
    )


def accuracy_from_scores(path: str | os.PathLike, labels: torch.Tensor, classes: int) -> float:
    """Top-1 accuracy recomputed from a score file alone (float32 ``N x classes``).

    Args:
        path: the score file.
        labels: the test labels.
        classes: columns of the file.

    Returns:
        Accuracy in [0, 1].
    """
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    scores = torch.frombuffer(raw, dtype=torch.float32).view(-1, classes)
    return float((scores.argmax(1) == labels).float().mean())


class Run:
    """One method trained from one seed.

    Args:
        method: one of :data:`METHODS`.
        seed: the training seed.
        cfg: the experiment.
        data: the data set.
        plans: calibrated costs and budget (``joint`` / ``eager_whole`` need them;
            the fixed methods use them for the predicted peak).

    ``error`` is set (and the run stops) when the method cannot be built (no
    feasible plan) or a step raises.
    """

    def __init__(
        self, method: str, seed: int, cfg: MocoConfig, data: SyntheticCifar, plans: Plans | None
    ) -> None:
        self.method, self.seed, self.cfg, self.data = method, seed, cfg, data
        self.moco = build_moco(cfg, seed)
        self.g = torch.Generator().manual_seed(seed)
        self.error: str | None = None
        self.failed_step: int | None = None
        self.step_times: list[float] = []
        self.peak: int | None = None
        self.engine_peak = 0
        self.steps_done = 0
        self._order: list[int] = []
        self.query: nn.Module | None = None
        self.predicted_peak: int | None = None
        segs, state = self.moco.segments(), self.moco.segment_state()
        costs = plans.costs if plans is not None else None
        persistent = plans.persistent if plans is not None else None
        try:
            if method == "torch_checkpoint":
                self.query = TorchCheckpointed(segs)
            elif method == "eager" or method in ENGINE_METHODS:
                measured = costs is not None and all(
                    any(o.name == method for o in s) for s in costs
                )
                self.query = PlannedSequential(
                    segs,
                    state=state,
                    choices=[method] * len(segs),
                    costs=costs if measured else None,
                    persistent=persistent,
                )
                self.predicted_peak = self.query.predicted_peak
            elif method in ("joint", "eager_whole"):
                if plans is None:
                    raise ValueError(f"method {method!r} needs calibrated costs")
                self.query = PlannedSequential(
                    segs,
                    budget=plans.budget,
                    costs=costs,
                    state=state,
                    objective=method,
                    persistent=persistent,
                )
                self.predicted_peak = self.query.predicted_peak
            else:
                raise ValueError(f"unknown method {method!r}; methods are {METHODS}")
        except tr.ReplayError as e:  # InfeasibleBudgetError: no static policy fits
            self.error = f"{type(e).__name__}: {e}"
        self.choices = list(self.query.choices) if self.query is not None else []
        self.delay = bool(self.choices) and self.choices[-1] == "eager"
        self.opt = torch.optim.SGD(
            self.moco.encoder_q.parameters(),
            lr=cfg.lr,
            momentum=0.9,
            weight_decay=cfg.weight_decay,
        )
        self.target = torch.zeros(cfg.batch, dtype=torch.long)

    # ------------------------------------------------------------- training

    def _next_batch(self) -> torch.Tensor:
        if len(self._order) < self.cfg.batch:
            n = self.data.train_images.shape[0]
            self._order = torch.randperm(n, generator=self.g).tolist()
        idx, self._order = self._order[: self.cfg.batch], self._order[self.cfg.batch :]
        return torch.tensor(idx)

    def _held(self) -> int:
        q = self.query
        held = q._held_bytes() if isinstance(q, PlannedSequential) else 0
        self.engine_peak = max(self.engine_peak, held)
        return held

    def step(self, index: int) -> None:
        """One training step (timed unless it is the warm-up or the tracked step)."""
        if self.error is not None:
            return
        imgs = self.data.train_images[self._next_batch()]
        v1, v2 = augment(imgs, self.g), augment(imgs, self.g)
        self.opt.zero_grad(set_to_none=True)
        track = index == self.cfg.track_step
        tracker = None
        static = 0
        if track:
            opt_state = [
                t for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t)
            ]
            static = static_bytes(
                [*self.moco.parameters(), *self.moco.buffers(), *opt_state, v1, v2]
            )
            tracker = LiveBytesTracker(self._held)
        t0 = time.perf_counter()
        try:
            if tracker is not None:
                with tracker:
                    self._step(v1, v2)
            else:
                self._step(v1, v2)
        except RuntimeError as e:  # ReplayError or autograd's own refusal: report, stop
            self.error = f"{type(e).__name__}: {e}"
            self.failed_step = index
            self.moco.head.keys = None
            return
        dt = time.perf_counter() - t0
        if tracker is not None:
            self.peak = static + tracker.peak
        elif index > 0:
            self.step_times.append(dt)
        self.steps_done += 1

    def _step(self, v1: torch.Tensor, v2: torch.Tensor) -> None:
        moco = self.moco
        keys = moco.keys(v2)
        moco.head.keys = keys
        logits = self.query(v1)
        loss = F.cross_entropy(logits, self.target)
        if not self.delay:
            moco.enqueue(keys)  # in place, between the forward and its backward (MoCo)
        loss.backward()
        if self.delay:
            moco.enqueue(keys)
        self.opt.step()
        moco.head.keys = None

    # ---------------------------------------------------------------- probe

    def state_sha256(self) -> str:
        """SHA-256 of every parameter and buffer of both encoders and the queue."""
        return _sha256(_tensor_bytes([*self.moco.parameters(), *self.moco.buffers()]))

    @torch.no_grad()
    def _features(self, images: torch.Tensor) -> torch.Tensor:
        enc = self.moco.encoder_q
        enc.eval()
        try:
            return torch.cat(
                [enc.features(normalize(images[i : i + 256])) for i in range(0, len(images), 256)]
            )
        finally:
            enc.train()

    def probe(self, scores_dir: str | os.PathLike) -> dict[str, Any]:
        """Train a linear probe on frozen features, write the test score file.

        The probe (zero-initialised ``nn.Linear`` on features standardised with
        the training set's mean and std) is trained with SGD for
        ``probe_epochs`` epochs in batches of 256 drawn by a generator seeded with
        ``seed + 1``. The score file is its float32 logits on the test set, row
        per image, little-endian, nothing else; its accuracy is recomputed from
        the file alone (:func:`accuracy_from_scores`).

        Args:
            scores_dir: where ``<method>_seed<seed>.f32`` is written.

        Returns:
            ``path``, ``sha256``, ``accuracy``.
        """
        cfg, data = self.cfg, self.data
        ftr = self._features(data.train_images)
        fte = self._features(data.test_images)
        mu, sd = ftr.mean(0), ftr.std(0) + 1e-6
        ftr, fte = (ftr - mu) / sd, (fte - mu) / sd
        lin = nn.Linear(ftr.shape[1], data.classes)
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
        opt = torch.optim.SGD(lin.parameters(), lr=cfg.probe_lr, momentum=0.9)
        g = torch.Generator().manual_seed(self.seed + 1)
        n = ftr.shape[0]
        for _ in range(cfg.probe_epochs):
            perm = torch.randperm(n, generator=g)
            for i in range(0, n, 256):
                b = perm[i : i + 256]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(lin(ftr[b]), data.train_labels[b]).backward()
                opt.step()
        with torch.no_grad():
            scores = lin(fte).float().contiguous()
        path = os.path.join(scores_dir, f"{self.method}_seed{self.seed}.f32")
        with open(path, "wb") as f:
            f.write(scores.numpy().astype("<f4").tobytes())
        with open(path, "rb") as f:
            sha = _sha256(f.read())
        return {
            "path": path,
            "sha256": sha,
            "accuracy": accuracy_from_scores(path, data.test_labels, data.classes),
        }


def run_seed(
    cfg: MocoConfig,
    data: SyntheticCifar,
    seed: int,
    plans: Plans | None,
    scores_dir: str | os.PathLike,
    methods: Sequence[str] = METHODS,
    log: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every method from ``seed`` side by side in this process, then probe.

    Steps are interleaved round-robin (the method order rotates every step), so
    the machine's load falls on every method alike and step-time ratios are
    taken within one process run.

    Args:
        cfg: the experiment.
        data: the data set.
        seed: the training seed.
        plans: calibrated costs (None: ``joint`` / ``eager_whole`` cannot run).
        scores_dir: where score files are written.
        methods: the methods to run.
        log: progress printer.

    Returns:
        Per method: choices, error (or None), steps done, peak bytes, engine peak
        bytes, predicted peak, step times, score file hash and accuracy, state hash.
    """
    runs = [Run(m, seed, cfg, data, plans) for m in methods]
    for i in range(cfg.steps):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            run.step(i)
        if log is not None and (i + 1) % max(1, cfg.steps // 4) == 0:
            log(f"  seed {seed}: step {i + 1}/{cfg.steps}")
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        res: dict[str, Any] = {
            "choices": run.choices,
            "enqueue": "after backward" if run.delay else "between forward and backward",
            "error": run.error,
            "failed_step": run.failed_step,
            "steps_done": run.steps_done,
            "peak_bytes": run.peak,
            "engine_peak_bytes": run.engine_peak,
            "predicted_peak_bytes": run.predicted_peak,
            "step_times": run.step_times,
        }
        if run.error is None:
            res.update(run.probe(scores_dir))
            res["state_sha256"] = run.state_sha256()
        out[run.method] = res
    if "eager" in out and out["eager"]["error"] is None:
        ref = dict(runs[[r.method for r in runs].index("eager")].moco.encoder_q.named_parameters())
        for run in runs:
            if run.error is None:
                diff = max(
                    float((p.detach() - ref[n].detach()).abs().max())
                    for n, p in run.moco.encoder_q.named_parameters()
                )
                out[run.method]["max_param_diff_vs_eager"] = diff
    return out
