"""MoCo v2-style model: ResNet18-style query and momentum encoders and a negative queue.

The query encoder is cut into four segments for checkpointing:

====  ===============================================  ==========================
seg   modules                                          declared state
====  ===============================================  ==========================
0     stem (3x3 conv, BN, ReLU) + layer1               none (BN stats: automatic)
1     layer2                                           none
2     layer3                                           none
3     :class:`InfoNCEHead`: layer4, pool, MLP          the queue
      projection, normalise, logits vs keys and queue
====  ===============================================  ==========================

Segment 3 reads the whole queue (``l_neg = q @ queue``), and the trainer
enqueues the keys into the queue in place between the query forward and its
backward, as MoCo does (``_dequeue_and_enqueue`` inside ``forward``). A re-run
of segment 3 in the backward therefore reads a queue that has changed since
its forward: ``torch.utils.checkpoint`` differentiates a different computation
(silently), torch_replay restores the forward's queue bytes for the re-run.

The widths are ResNet18's (64, 128, 256, 512) times ``width / 64``; the
CIFAR variant (3x3 stem, no max-pool), as used for CIFAR MoCo baselines.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.lib.models import BasicBlock

__all__ = ["BasicBlock", "Encoder", "InfoNCEHead", "MoCo", "queue_length"]


def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))


class Encoder(nn.Module):
    """ResNet18-style backbone (CIFAR stem) with the MoCo v2 MLP projection.

    Args:
        width: channels of the first stage (ResNet18: 64).
        dim: embedding dimension (MoCo: 128).
    """

    def __init__(self, width: int, dim: int) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()
        )
        self.layer1 = _layer(w, w, 1)
        self.layer2 = _layer(w, 2 * w, 2)
        self.layer3 = _layer(2 * w, 4 * w, 2)
        self.layer4 = _layer(4 * w, 8 * w, 2)
        self.proj = nn.Sequential(nn.Linear(8 * w, 8 * w), nn.ReLU(), nn.Linear(8 * w, dim))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled backbone features (what the linear probe sees)."""
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return F.adaptive_avg_pool2d(self.layer4(h), 1).flatten(1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised projection (the keys)."""
        return F.normalize(self.proj(self.features(x)), dim=1)


class InfoNCEHead(nn.Module):
    """Last query segment: layer4, pool, projection, and the InfoNCE logits.

    ``keys`` (the momentum encoder's embeddings of the other view) is set by the
    trainer before each forward; ``queue`` (``dim x K``, the :class:`MoCo`
    module's buffer) is declared state.

    Args:
        encoder: the query encoder (its ``layer4`` and ``proj`` are used).
        queue: the ``(dim, K)`` negative queue.
        temperature: InfoNCE temperature.
    """

    def __init__(self, encoder: Encoder, queue: torch.Tensor, temperature: float) -> None:
        super().__init__()
        self.layer4 = encoder.layer4
        self.proj = encoder.proj
        # Registered here too (not saved in state dicts) so that errors name it.
        self.register_buffer("queue", queue, persistent=False)
        self.temperature = temperature
        self.keys: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[l_pos, l_neg] / T`` (the positive is column 0)."""
        f = F.adaptive_avg_pool2d(self.layer4(h), 1).flatten(1)
        q = F.normalize(self.proj(f), dim=1)
        l_pos = (q * self.keys).sum(1, keepdim=True)
        l_neg = q @ self.queue
        return torch.cat([l_pos, l_neg], 1) / self.temperature


def queue_length(queue_mib: float, dim: int, batch: int) -> int:
    """Keys in a float32 queue of ``queue_mib`` MiB, a multiple of ``batch`` (>= batch)."""
    k = int(queue_mib * 2**20) // (dim * 4)
    return max(batch, k - k % batch)


class MoCo(nn.Module):
    """Query encoder (segmented), momentum encoder and the negative queue.

    Built under ``torch.manual_seed(seed)`` by the caller; the key encoder starts
    as a copy of the query encoder (MoCo). The queue is drawn from a generator
    seeded with ``seed`` and normalised along ``dim``.

    Args:
        width: first-stage channels.
        dim: embedding dimension.
        queue_keys: K.
        temperature: InfoNCE temperature.
        momentum: key encoder EMA momentum.
        seed: seed of the queue's initial values.
    """

    def __init__(
        self,
        *,
        width: int,
        dim: int,
        queue_keys: int,
        temperature: float,
        momentum: float,
        seed: int,
    ) -> None:
        super().__init__()
        self.encoder_q = Encoder(width, dim)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("queue", F.normalize(torch.randn(dim, queue_keys, generator=g), dim=0))
        self.ptr = 0
        self.momentum = momentum
        self.head = InfoNCEHead(self.encoder_q, self.queue, temperature)

    def segments(self) -> list[nn.Module]:
        """The query encoder's four segments (shared modules, not copies)."""
        e = self.encoder_q
        return [nn.Sequential(e.stem, e.layer1), e.layer2, e.layer3, self.head]

    def segment_state(self) -> list[list[torch.Tensor] | None]:
        """Declared state per segment: the queue for the head only."""
        return [None, None, None, [self.queue]]

    @torch.no_grad()
    def keys(self, view: torch.Tensor) -> torch.Tensor:
        """Momentum update of the key encoder, then the keys of ``view`` (MoCo order)."""
        m = self.momentum
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters(), strict=True):
            pk.mul_(m).add_(pq.detach(), alpha=1 - m)
        return self.encoder_k.embed(view)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Write ``keys`` into the queue in place at the pointer (MoCo's
        ``_dequeue_and_enqueue``): the oldest ``batch`` keys are overwritten."""
        b = keys.shape[0]
        self.queue[:, self.ptr : self.ptr + b].copy_(keys.T)
        self.ptr = (self.ptr + b) % self.queue.shape[1]
