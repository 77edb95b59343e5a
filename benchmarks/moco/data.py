"""CIFAR-like 32x32 images made deterministically, and MoCo v2-style augmentations.

Nothing is downloaded. :func:`make_dataset` draws every image from one seeded
``torch.Generator`` (the data seed, fixed across training seeds as CIFAR is):

* each class has a prototype: three oriented plane waves (integer frequencies
  1-4 cycles per image in x and y, a phase, an RGB colour) and a Gaussian blob
  (centre, width, colour);
* an image of class ``c`` is that prototype circularly shifted by up to 8 pixels,
  each wave scaled by a factor in [0.6, 1.4], on a random background tint, plus
  Gaussian pixel noise (std 0.08), clamped to [0, 1] and quantised to ``uint8``
  like CIFAR; labels are balanced and shuffled.

The result depends only on ``(train, test, classes, seed)`` and torch's CPU
generator, so every run and every method sees the same images.

:func:`augment` makes one view of a batch, MoCo v2 / CIFAR style: random crop
with 4-pixel reflect padding, horizontal flip, brightness/contrast jitter (p=0.8),
grayscale (p=0.2), then normalisation. Every draw comes from the generator it is
given, in a fixed order, so two runs with equal generators see equal views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["MEAN", "STD", "SyntheticCifar", "augment", "make_dataset", "normalize"]

MEAN = 0.5
"""Normalisation mean (every channel)."""
STD = 0.25
"""Normalisation standard deviation (every channel)."""


@dataclass(kw_only=True, slots=True)
class SyntheticCifar:
    """A deterministic CIFAR-like data set (uint8 images, int64 labels)."""

    train_images: torch.Tensor
    """``(train, 3, 32, 32)`` uint8."""
    train_labels: torch.Tensor
    """``(train,)`` int64."""
    test_images: torch.Tensor
    """``(test, 3, 32, 32)`` uint8."""
    test_labels: torch.Tensor
    """``(test,)`` int64."""
    classes: int
    """Number of classes."""
    seed: int
    """The data seed."""


def _images(labels: torch.Tensor, protos: dict[str, torch.Tensor], g: torch.Generator):
    n = labels.numel()
    size = 32
    y = torch.arange(size, dtype=torch.float32).view(1, 1, size, 1)
    x = torch.arange(size, dtype=torch.float32).view(1, 1, 1, size)
    shift = torch.randint(-8, 9, (n, 2), generator=g).float()
    amp = 0.6 + 0.8 * torch.rand(n, 3, generator=g)
    tint = 0.15 * torch.randn(n, 3, generator=g)
    yy = y + shift[:, 0].view(n, 1, 1, 1)
    xx = x + shift[:, 1].view(n, 1, 1, 1)
    img = 0.5 + tint.view(n, 3, 1, 1)
    freq = protos["freq"][labels]  # (n, 3 waves, 2)
    phase = protos["phase"][labels]  # (n, 3)
    colour = protos["colour"][labels]  # (n, 3 waves, 3 channels)
    for w in range(3):
        arg = (
            2
            * math.pi
            * (freq[:, w, 0].view(n, 1, 1, 1) * yy + freq[:, w, 1].view(n, 1, 1, 1) * xx)
        ) / size + phase[:, w].view(n, 1, 1, 1)
        wave = torch.sin(arg)  # (n, 1, 32, 32)
        img = img + 0.12 * amp[:, w].view(n, 1, 1, 1) * colour[:, w].view(n, 3, 1, 1) * wave
    centre = protos["centre"][labels]  # (n, 2) in pixels
    width = protos["width"][labels]  # (n,)
    dy = torch.remainder(y - centre[:, 0].view(n, 1, 1, 1) - shift[:, 0].view(n, 1, 1, 1), size)
    dx = torch.remainder(x - centre[:, 1].view(n, 1, 1, 1) - shift[:, 1].view(n, 1, 1, 1), size)
    dy = torch.minimum(dy, size - dy)
    dx = torch.minimum(dx, size - dx)
    blob = torch.exp(-(dy**2 + dx**2) / (2 * width.view(n, 1, 1, 1) ** 2))
    img = img + 0.3 * protos["blob_colour"][labels].view(n, 3, 1, 1) * blob
    img = img + 0.08 * torch.randn(img.shape, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)


def make_dataset(*, train: int, test: int, classes: int = 10, seed: int = 0) -> SyntheticCifar:
    """Draw the data set (see the module docstring for how).

    Args:
        train: training images (for the encoder and the probe).
        test: test images (scored by the probe).
        classes: classes (balanced).
        seed: the data seed.

    Returns:
        A :class:`SyntheticCifar`.
    """
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(classes, 3, 2, generator=g) < 0.5, -1.0, 1.0)
    protos = {
        "freq": sign * torch.randint(1, 5, (classes, 3, 2), generator=g).float(),
        "phase": 2 * math.pi * torch.rand(classes, 3, generator=g),
        "colour": torch.randn(classes, 3, 3, generator=g),
        "centre": 32 * torch.rand(classes, 2, generator=g),
        "width": 2.5 + 4 * torch.rand(classes, generator=g),
        "blob_colour": torch.randn(classes, 3, generator=g),
    }

    def labels(n: int) -> torch.Tensor:
        lab = torch.arange(n) % classes
        return lab[torch.randperm(n, generator=g)]

    train_labels = labels(train)
    test_labels = labels(test)
    return SyntheticCifar(
        train_images=_images(train_labels, protos, g),
        train_labels=train_labels,
        test_images=_images(test_labels, protos, g),
        test_labels=test_labels,
        classes=classes,
        seed=seed,
    )


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (or [0, 1] float) images to the network's input scale."""
    x = images.float() / 255 if images.dtype == torch.uint8 else images
    return (x - MEAN) / STD


def augment(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """One augmented, normalised view of a uint8 batch.

    Args:
        images: ``(B, 3, 32, 32)`` uint8.
        g: the generator every draw comes from.

    Returns:
        ``(B, 3, 32, 32)`` float32.
    """
    b = images.shape[0]
    x = images.float() / 255
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    off = torch.randint(0, 9, (b, 2), generator=g).tolist()
    x = torch.stack([padded[i, :, oy : oy + 32, ox : ox + 32] for i, (oy, ox) in enumerate(off)])
    flip = (torch.rand(b, generator=g) < 0.5).view(b, 1, 1, 1)
    x = torch.where(flip, x.flip(3), x)
    jitter = (torch.rand(b, generator=g) < 0.8).view(b, 1, 1, 1)
    bright = 1 + 0.8 * (torch.rand(b, generator=g) - 0.5)
    contrast = 1 + 0.8 * (torch.rand(b, generator=g) - 0.5)
    mean = x.mean((1, 2, 3), keepdim=True)
    jittered = (x - mean) * contrast.view(b, 1, 1, 1) + mean * bright.view(b, 1, 1, 1)
    x = torch.where(jitter, jittered, x)
    gray = (torch.rand(b, generator=g) < 0.2).view(b, 1, 1, 1)
    x = torch.where(gray, x.mean(1, keepdim=True).expand_as(x), x)
    return normalize(x.clamp(0, 1))
