"""The MoCo experiment's methods and scale (:class:`MocoConfig`), its model of a seed and
the bytes every plan is charged for (see :mod:`benchmarks.moco.train`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from torch_replay.planned import static_bytes

from .model import MoCo, queue_length

__all__ = [
    "CORRECT",
    "ENGINE_METHODS",
    "METHODS",
    "MIB",
    "MocoConfig",
    "TorchCheckpointed",
    "build_moco",
    "persistent_bytes",
]

MIB = 2**20

METHODS: tuple[str, ...] = (
    "eager",
    "torch_checkpoint",
    "snapshot",
    "journal",
    "readset",
    "joint",
    "eager_whole",
)
"""The seven methods, in table order."""

CORRECT: tuple[str, ...] = tuple(m for m in METHODS if m != "torch_checkpoint")
"""Methods whose score files must be byte-identical to ``eager``'s."""

ENGINE_METHODS = ("snapshot", "journal", "readset")


@dataclass(kw_only=True, slots=True)
class MocoConfig:
    """Scale and hyper-parameters of one experiment."""

    width: int = 16
    """First-stage channels (ResNet18: 64)."""
    dim: int = 128
    """Embedding dimension (MoCo: 128)."""
    queue_mib: float = 4.0
    """FP32 negative queue size in MiB (the source: 64)."""
    batch: int = 64
    """Images per step."""
    steps: int = 40
    """Encoder training steps per method."""
    train_images: int = 1024
    """Training images (encoder and probe)."""
    test_images: int = 512
    """Test images (scored by the probe)."""
    classes: int = 10
    """Classes of the synthetic data."""
    data_seed: int = 0
    """Seed of the data set (fixed across training seeds, as CIFAR is)."""
    temperature: float = 0.2
    """InfoNCE temperature (MoCo v2: 0.2)."""
    momentum: float = 0.99
    """Key encoder EMA momentum (MoCo: 0.999 for 200 epochs; fewer steps here)."""
    lr: float = 0.06
    """SGD learning rate (momentum 0.9)."""
    weight_decay: float = 5e-4
    """SGD weight decay."""
    probe_epochs: int = 25
    """Linear probe epochs (the source: 25)."""
    probe_lr: float = 0.1
    """Linear probe learning rate (SGD, momentum 0.9, standardised features)."""
    budget_frac: float = 0.5
    """Budget of the plans: this fraction of the way from the joint planner's
    smallest feasible budget to the all-eager peak."""
    budget_mib: float | None = None
    """An explicit budget in MiB (overrides ``budget_frac``)."""
    calibration_reps: int = 3
    """Timed calibration steps per option (median kept)."""
    track_step: int = 1
    """The step whose peak memory is tracked (untimed)."""

    @property
    def queue_keys(self) -> int:
        """K, the number of keys in the queue."""
        return queue_length(self.queue_mib, self.dim, self.batch)


def build_moco(cfg: MocoConfig, seed: int) -> MoCo:
    """The MoCo model of ``seed`` (parameters drawn under ``torch.manual_seed(seed)``)."""
    torch.manual_seed(seed)
    return MoCo(
        width=cfg.width,
        dim=cfg.dim,
        queue_keys=cfg.queue_keys,
        temperature=cfg.temperature,
        momentum=cfg.momentum,
        seed=seed,
    )


class TorchCheckpointed(nn.Module):
    """Every segment through ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self, segments: Sequence[nn.Module]) -> None:
        super().__init__()
        self.segments = nn.ModuleList(segments)
        self.choices = ["torch"] * len(segments)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for seg in self.segments:
            x = torch_checkpoint(seg, x, use_reentrant=False)
        return x


def persistent_bytes(moco: MoCo, cfg: MocoConfig) -> int:
    """Bytes held through a step: both encoders, the queue, SGD momentum, the
    query gradients and the two views."""
    q_params = sum(p.numel() * p.element_size() for p in moco.encoder_q.parameters())
    views = 2 * cfg.batch * 3 * 32 * 32 * 4
    return static_bytes([*moco.parameters(), *moco.buffers()]) + 2 * q_params + views
