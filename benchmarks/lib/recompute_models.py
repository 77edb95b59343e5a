"""Models for the selective-recomputation benchmark and tests (issue 14).

``ReDimNetStyle``: 2D features ``[B, 1, F, T]`` (small: one channel) go through a
stem (3x3 convolution to ``C`` channels, batch norm, ReLU) at full resolution;
stages of residual blocks follow, the first at full resolution, the later ones
at half the frequency resolution with twice the channels (equal bytes); the head
pools each over frequency and adds the stem's pooled output (ReDimNet's
aggregation of earlier stage outputs, here of the stem only). The stem's output
is the long-lived buffer; its chain (one cheap convolution from the kept input
features) is what recomputation re-emits.

``SpecUNet``: a U-Net on spectrograms (frequency-only downsampling, channels
doubling per level, so every level's feature map has the same bytes) whose top
skip is the stem's output (3x3 convolution from one input channel, batch norm,
ReLU) and whose deeper skips are the outputs of residual blocks; the decoder
upsamples, concatenates each skip and convolves.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ReDimNetStyle", "SpecUNet", "REDIM_SIZES", "init_bn"]


class ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def _stem(cin: int, c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())


class ReDimNetStyle(nn.Module):
    def __init__(self, c: int = 16, blocks: tuple[int, ...] = (1, 2, 2)) -> None:
        super().__init__()
        self.stem = _stem(1, c)
        stages = []
        ch = c
        for i, n in enumerate(blocks):
            layers: list[nn.Module] = []
            if i > 0:
                layers += [
                    nn.Conv2d(ch, 2 * ch, 3, stride=(2, 1), padding=1, bias=False),
                    nn.BatchNorm2d(2 * ch),
                    nn.ReLU(),
                ]
                ch *= 2
            layers += [ResBlock(ch) for _ in range(n)]
            stages.append(nn.Sequential(*layers))
        self.stages = nn.ModuleList(stages)
        self.proj = nn.Conv1d(ch, c, 1)
        self.alpha = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        y = h
        for st in self.stages:
            y = st(y)
        return self.proj(y.mean(dim=2)) + self.alpha * h.mean(dim=2)


# (channels, blocks per stage, F, T): seven sizes, like ReDimNet's b0..b6 family.
REDIM_SIZES = {
    "r0": (8, (1, 1, 1), 40, 100),
    "r1": (12, (1, 2, 1), 40, 150),
    "r2": (16, (1, 2, 2), 60, 150),
    "r3": (16, (2, 2, 2), 72, 200),
    "r4": (24, (1, 2, 2), 72, 200),
    "r5": (24, (2, 3, 2), 80, 200),
    "r6": (32, (2, 3, 3), 80, 200),
}


class SpecUNet(nn.Module):
    def __init__(self, c: int = 16, levels: int = 3) -> None:
        super().__init__()
        self.stem = _stem(1, c)
        self.downs = nn.ModuleList()
        self.enc = nn.ModuleList()
        ch = c
        for _ in range(levels):
            self.downs.append(
                nn.Sequential(
                    nn.Conv2d(ch, 2 * ch, 3, stride=(2, 1), padding=1, bias=False),
                    nn.BatchNorm2d(2 * ch),
                    nn.ReLU(),
                )
            )
            ch *= 2
            self.enc.append(ResBlock(ch))
        self.mid = ResBlock(ch)
        self.ups = nn.ModuleList()
        self.dec = nn.ModuleList()
        for _ in range(levels):
            self.ups.append(nn.ConvTranspose2d(ch, ch // 2, (2, 1), stride=(2, 1)))
            self.dec.append(_stem(ch, ch // 2))  # conv over [up, skip] (ch channels)
            ch //= 2
        self.head = nn.Conv2d(ch, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skips = [h]
        y = h
        for down, enc in zip(self.downs, self.enc, strict=True):
            y = enc(down(y))
            skips.append(y)
        y = self.mid(skips.pop())
        for up, dec in zip(self.ups, self.dec, strict=True):
            y = dec(torch.cat([up(y), skips.pop()], dim=1))
        return self.head(y)


def init_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial batch-norm statistics (eval mode), deterministic."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()
