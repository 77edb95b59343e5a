"""Inductor wrapper-permutation pass (design.md §3.3) on 20+ architectures: peaks, variants, regeneration, compile time.

For each architecture, in inference (``eval()``, ``no_grad``) and training
(forward + backward of ``sum(out**2)``), CPU FP32, one thread:

- per compiled graph (forward / backward / inference): the peak of Inductor's
  default program modelled by the pass and measured by the counting CPU
  allocator (as the runtime calls it, Note [Input ownership]), the measured
  peak of the ``reorder_for_peak_memory=False`` variant, the program the pass
  deploys (default or variant, permuted or not) with its modelled / measured
  peak, the min-cut lower bound and whether it certifies the result;
- the regeneration baseline (Note [Regeneration baseline] in
  ``inductor_pass/regenerate.py``): where the pass found a better order, that
  order is fed back to Inductor's scheduler and the program regenerated;
  ``predicted`` is the pass's modelled peak of its order, ``measured`` the
  regenerated program's peak;
- per step: the real-step peak from the profiler's memory events (whole step,
  above what was live at its start) under plain Inductor and under the pass,
  outputs and gradients bitwise equal to plain Inductor, and compile time
  cold (empty cache directory, in-memory caches cleared) and warm (same
  directory, in-memory caches cleared, dynamo reset) for both backends, in
  this process (first step minus a steady step; for compile memory in fresh
  processes see ``benchmarks/bench_compile.py``).

Models: compact hand-written versions of each family (they run on the CPU
torch 2.13 environment); with ``--tv`` the torchvision models instead (needs a
torchvision that imports, e.g. the torch 2.14.1 environment of
``TORCH_REPLAY_TORCH=2.14.1 bash scripts/setup.sh``).

Run:
    nice -n 10 .venv/bin/python benchmarks/bench_inductor.py [--quick | --models vit,lstm]
        [--modes inference,training] [--tv --tv-size 64] [--name inductor.md]
        [--out benchmarks/results]
prints the table; with --out, writes <out>/<name> and <out>/<name without .md>.json
(rewritten after every model). ``--quick`` runs three small models.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shlex
import shutil
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import inductor_pass  # noqa: E402  (registers the backend)
from inductor_pass import PassConfig, make_backend, regenerate  # noqa: E402

# --------------------------------------------------------------------------- models


def conv_bn(cin, cout, k=3, s=1, groups=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class Basic(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, s)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.sc = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))
            if s != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + self.sc(x))


class SmallResNet(nn.Module):
    """ResNet-style (stand-in for torchvision ResNet18/50)."""

    def __init__(self, w=16, blocks=(1, 1, 1)):
        super().__init__()
        layers = [conv_bn(3, w, 3, 1)]
        cin = w
        for i, n in enumerate(blocks):
            cout = w * 2**i
            for j in range(n):
                layers.append(Basic(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class InvRes(nn.Module):
    def __init__(self, cin, cout, s, e=4):
        super().__init__()
        h = cin * e
        self.use_res = s == 1 and cin == cout
        self.f = nn.Sequential(
            conv_bn(cin, h, 1),
            conv_bn(h, h, 3, s, groups=h),
            nn.Conv2d(h, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        y = self.f(x)
        return x + y if self.use_res else y


class SmallMobileNet(nn.Module):
    """MobileNetV2-style inverted residuals (stand-in for torchvision MobileNetV2)."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            conv_bn(3, 16, 3, 2), InvRes(16, 16, 1), InvRes(16, 24, 2), InvRes(24, 24, 1)
        )
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


class SmallDeepLab(nn.Module):
    """ResNet backbone + ASPP head + upsampling (stand-in for DeepLabV3-ResNet50)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(conv_bn(3, 16, 3, 2), Basic(16, 32, 2), Basic(32, 32, 1))
        self.aspp = nn.ModuleList(
            [nn.Conv2d(32, 16, 1)]
            + [nn.Conv2d(32, 16, 3, padding=d, dilation=d) for d in (2, 4, 6)]
        )
        self.proj = conv_bn(64, 16, 1)
        self.cls = nn.Conv2d(16, 5, 1)

    def forward(self, x):
        f = self.backbone(x)
        y = self.proj(torch.cat([torch.relu(a(f)) for a in self.aspp], 1))
        y = self.cls(y)
        return nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear")


class Inception(nn.Module):
    """Inception-style branchy block stack."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = conv_bn(3, c, 3, 1)
        self.b1 = conv_bn(c, c, 1)
        self.b2 = nn.Sequential(conv_bn(c, c, 1), conv_bn(c, c, 3))
        self.b3 = nn.Sequential(conv_bn(c, c, 1), conv_bn(c, c, 3), conv_bn(c, c, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv_bn(c, c, 1))
        self.fc = nn.Linear(4 * c, 10)

    def forward(self, x):
        x = self.stem(x)
        y = torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)
        return self.fc(y.mean((2, 3)))


class MCU(nn.Module):
    """Microcontroller-class CNN (depthwise-separable)."""

    def __init__(self, w=8, depth=3):
        super().__init__()
        layers = [conv_bn(1, w, 3, 2)]
        for _ in range(depth):
            layers += [conv_bn(w, w, 3, 1, groups=w), conv_bn(w, 2 * w, 1)]
            w *= 2
        self.f = nn.Sequential(*layers)
        self.fc = nn.Linear(w, 4)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


class UNet(nn.Module):
    """U-Net style encoder-decoder."""

    def __init__(self, c=8):
        super().__init__()
        self.e1 = conv_bn(3, c)
        self.e2 = conv_bn(c, 2 * c, 3, 2)
        self.e3 = conv_bn(2 * c, 4 * c, 3, 2)
        self.d2 = conv_bn(4 * c + 2 * c, 2 * c)
        self.d1 = conv_bn(2 * c + c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        c = self.e3(b)
        up = nn.functional.interpolate(c, scale_factor=2.0)
        y = self.d2(torch.cat([up, b], 1))
        y = self.d1(torch.cat([nn.functional.interpolate(y, scale_factor=2.0), a], 1))
        return self.out(y)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, d=64, h=4):
        super().__init__()
        self.n1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.n2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.n1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class DenseBlock(nn.Module):
    """DenseNet dense block + transition: every layer reads the concat of all before it."""

    def __init__(self, c=16, growth=8, layers=4):
        super().__init__()
        self.stem = conv_bn(3, c, 3, 1)
        self.layers = nn.ModuleList()
        ch = c
        for _ in range(layers):
            self.layers.append(
                nn.Sequential(
                    nn.BatchNorm2d(ch),
                    nn.ReLU(),
                    nn.Conv2d(ch, 4 * growth, 1, bias=False),
                    nn.BatchNorm2d(4 * growth),
                    nn.ReLU(),
                    nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
                )
            )
            ch += growth
        self.trans = nn.Sequential(nn.BatchNorm2d(ch), nn.Conv2d(ch, ch // 2, 1), nn.AvgPool2d(2))
        self.fc = nn.Linear(ch // 2, 10)

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.fc(self.trans(torch.cat(feats, 1)).mean((2, 3)))


class TBlock(nn.Module):
    """Pre-norm transformer block with explicit attention (ViT / Mixer building block)."""

    def __init__(self, d, h=4, r=4):
        super().__init__()
        self.h = h
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, r * d), nn.GELU(), nn.Linear(r * d, d))

    def attn(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.h) ** 0.5, -1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class ViT(nn.Module):
    """Vision transformer: patch embedding, class token, two blocks, head."""

    def __init__(self, d=64, patch=4, side=32, depth=2):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[TBlock(d) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class SwinBlock(nn.Module):
    """Swin-style block: attention inside shifted 4x4 windows, then an MLP."""

    def __init__(self, d=48, h=3, win=4, shift=2):
        super().__init__()
        self.win, self.shift, self.h = win, shift, h
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.bias = nn.Parameter(torch.zeros(h, win * win, win * win))
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):  # x: B, H, W, C
        b, hh, ww, c = x.shape
        w = self.win
        y = torch.roll(self.n1(x), (-self.shift, -self.shift), (1, 2))
        y = y.view(b, hh // w, w, ww // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
        n = y.shape[0]
        q, k, v = self.qkv(y).view(n, w * w, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) * (c // self.h) ** -0.5 + self.bias, -1)
        y = self.proj((a @ v).transpose(1, 2).reshape(n, w * w, c))
        y = y.view(b, hh // w, ww // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c)
        x = x + torch.roll(y, (self.shift, self.shift), (1, 2))
        return x + self.mlp(self.n2(x))


class Swin(nn.Module):
    def __init__(self, d=48):
        super().__init__()
        self.embed = nn.Conv2d(3, d, 4, 4)
        self.blocks = nn.Sequential(SwinBlock(d, shift=0), SwinBlock(d, shift=2))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.embed(x).permute(0, 2, 3, 1)
        return self.head(self.blocks(x).mean((1, 2)))


class ConvNeXtBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.pw1, self.pw2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 1e-1))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 4, 4)
        self.blocks = nn.Sequential(ConvNeXtBlock(d), ConvNeXtBlock(d))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class SE(nn.Module):
    def __init__(self, c, r=4, gate=torch.sigmoid):
        super().__init__()
        self.a, self.b, self.gate = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1), gate

    def forward(self, x):
        return x * self.gate(self.b(F.relu(self.a(x.mean((2, 3), keepdim=True)))))


class MBConv(nn.Module):
    """EfficientNet / MobileNetV3 inverted residual with squeeze-excitation."""

    def __init__(self, cin, cout, s, e=4, act=nn.SiLU, gate=torch.sigmoid):
        super().__init__()
        h = cin * e
        self.res = s == 1 and cin == cout
        self.f = nn.Sequential(
            nn.Conv2d(cin, h, 1, bias=False),
            nn.BatchNorm2d(h),
            act(),
            nn.Conv2d(h, h, 3, s, 1, groups=h, bias=False),
            nn.BatchNorm2d(h),
            act(),
            SE(h, 4, gate),
            nn.Conv2d(h, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        y = self.f(x)
        return x + y if self.res else y


class EfficientNet(nn.Module):
    def __init__(self, act=nn.SiLU, gate=torch.sigmoid):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            act(),
            MBConv(16, 16, 1, 4, act, gate),
            MBConv(16, 24, 2, 4, act, gate),
            MBConv(24, 24, 1, 4, act, gate),
        )
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


class XBlock(nn.Module):
    """RegNet X block: 1x1, grouped 3x3, 1x1 bottleneck with a residual."""

    def __init__(self, cin, cout, s, g=8):
        super().__init__()
        self.f = nn.Sequential(
            conv_bn(cin, cout, 1),
            conv_bn(cout, cout, 3, s, groups=cout // g),
            nn.Conv2d(cout, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.sc = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))
            if s != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return F.relu(self.f(x) + self.sc(x))


class RegNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            conv_bn(3, 16, 3, 2), XBlock(16, 32, 2), XBlock(32, 32, 1), XBlock(32, 64, 2)
        )
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


class LSTMNet(nn.Module):
    """LSTM cell unrolled over time, linear head on every step."""

    def __init__(self, d=32, h=64, cell=nn.LSTMCell):
        super().__init__()
        self.cell, self.h, self.head = cell(d, h), h, nn.Linear(h, 8)
        self.lstm = cell is nn.LSTMCell

    def forward(self, x):  # x: B, T, D
        b = x.shape[0]
        h = x.new_zeros(b, self.h)
        c = x.new_zeros(b, self.h)
        outs = []
        for t in range(x.shape[1]):
            if self.lstm:
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
            outs.append(self.head(h))
        return torch.stack(outs, 1)


class Mixer(nn.Module):
    """MLP-Mixer: token-mixing and channel-mixing MLPs."""

    def __init__(self, d=64, patch=4, side=32, depth=2):
        super().__init__()
        n = (side // patch) ** 2
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(
                nn.ModuleList(
                    [
                        nn.LayerNorm(d),
                        nn.Sequential(nn.Linear(n, 2 * n), nn.GELU(), nn.Linear(2 * n, n)),
                        nn.LayerNorm(d),
                        nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                    ]
                )
            )
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        for n1, tok, n2, ch in self.blocks:
            x = x + tok(n1(x).transpose(1, 2)).transpose(1, 2)
            x = x + ch(n2(x))
        return self.head(x.mean(1))


class EmbedSegments(nn.Module):
    """Embedding -> index_add into 4,096 segments -> Linear (issue 12's 22% case)."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin = nn.Embedding(1000, 32), nn.Linear(32, 16)

    def forward(self, ids, seg):
        pooled = torch.zeros(4096, 32).index_add(0, seg, self.emb(ids))
        return torch.relu(self.lin(pooled))


class EmbedScatter(nn.Module):
    """Embedding bag by scatter_add, gather back, MLP."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(500, 32)
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, ids, seg):
        e = self.emb(ids)
        bags = torch.zeros(256, 32).scatter_add(0, seg[:, None].expand(-1, 32), e)
        return self.mlp(torch.cat([e, bags[seg]], 1))


class DropoutMLP(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.f = nn.Sequential(
            nn.Linear(d, 4 * d),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(4 * d, 4 * d),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(4 * d, d),
        )

    def forward(self, x):
        return self.f(x)


class BNMLP(nn.Module):
    """BatchNorm1d between linears: running statistics updated in place in training."""

    def __init__(self, d=128):
        super().__init__()
        self.f = nn.Sequential(
            nn.Linear(d, 2 * d),
            nn.BatchNorm1d(2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, 2 * d),
            nn.BatchNorm1d(2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, 10),
        )

    def forward(self, x):
        return self.f(x)


# --------------------------------------------------------------------------- model list


def _img(b, side=32, c=3):
    return lambda: (torch.randn(b, c, side, side),)


def _ids(n_ids, n_seg, n=512):
    return lambda: (torch.randint(0, n_ids, (n,)), torch.randint(0, n_seg, (n,)))


COMPACT = [
    # key, name, builder, inputs, vision (replaced by torchvision with --tv)
    ("resnet", "ResNet", lambda: SmallResNet(16, (1, 1, 1)), _img(2), True),
    ("mobilenetv2", "MobileNetV2", SmallMobileNet, _img(2), True),
    (
        "mobilenetv3",
        "MobileNetV3 (hardswish + SE)",
        lambda: EfficientNet(nn.Hardswish, F.hardsigmoid),
        _img(2),
        True,
    ),
    ("efficientnet", "EfficientNet (MBConv + SE)", EfficientNet, _img(2), True),
    ("regnet", "RegNet (X blocks)", RegNet, _img(2), True),
    ("densenet", "DenseNet block", DenseBlock, _img(2), True),
    ("inception", "Inception block", Inception, _img(2), True),
    ("convnext", "ConvNeXt", ConvNeXt, _img(2), True),
    ("vit", "ViT", ViT, _img(2), True),
    ("swin", "Swin (shifted windows)", Swin, _img(2), True),
    ("mixer", "MLP-Mixer", Mixer, _img(2), True),
    ("deeplab", "DeepLabV3-style (ASPP)", SmallDeepLab, _img(1, 64), True),
    ("unet", "U-Net", UNet, _img(2), True),
    ("mcu", "MCU CNN (depthwise)", lambda: MCU(8, 2), _img(2, 32, 1), False),
    (
        "transformer",
        "Transformer block (nn.MultiheadAttention)",
        Block,
        lambda: (torch.randn(2, 32, 64),),
        False,
    ),
    ("lstm", "LSTM cell (8 steps)", LSTMNet, lambda: (torch.randn(4, 8, 32),), False),
    (
        "gru",
        "GRU cell (8 steps)",
        lambda: LSTMNet(cell=nn.GRUCell),
        lambda: (torch.randn(4, 8, 32),),
        False,
    ),
    (
        "embed-indexadd",
        "Embedding + index_add (4,096 segments)",
        EmbedSegments,
        _ids(1000, 4096),
        False,
    ),
    ("embed-scatter", "Embedding + scatter_add/gather", EmbedScatter, _ids(500, 256), False),
    ("dropout-mlp", "Dropout MLP", DropoutMLP, lambda: (torch.randn(64, 128),), False),
    (
        "bn-mlp",
        "BatchNorm MLP (in-place running stats)",
        BNMLP,
        lambda: (torch.randn(64, 128),),
        False,
    ),
]
QUICK = ("mcu", "embed-indexadd", "mixer")

TV = [  # key, torchvision name, minimum side
    ("resnet", "resnet50", 32),
    ("resnet18", "resnet18", 32),
    ("mobilenetv2", "mobilenet_v2", 32),
    ("mobilenetv3", "mobilenet_v3_small", 32),
    ("efficientnet", "efficientnet_b0", 32),
    ("regnet", "regnet_y_400mf", 32),
    ("densenet", "densenet121", 32),
    ("inception", "inception_v3", 75),
    ("convnext", "convnext_tiny", 32),
    ("vit", "vit_b_16", 32),
    ("swin", "swin_t", 32),
    ("deeplab", "deeplabv3_resnet50", 32),
]


def model_list(args):
    """``(key, name, builder, make_inputs)``; models are built lazily."""
    out = []
    tv_keys = set()
    if args.tv:
        import torchvision

        for key, arch, lo in TV:
            side = max(lo, args.tv_size)
            if arch.startswith("vit"):
                side = max(32, side // 16 * 16)

            def build(arch=arch, side=side):
                kw = {"image_size": side} if arch.startswith("vit") else {}
                if arch.startswith("deeplab"):
                    kw["weights_backbone"] = None
                m = torchvision.models.get_model(arch, weights=None, **kw)
                if arch.startswith("inception"):
                    m.aux_logits, m.AuxLogits = False, None
                return m

            out.append((key, f"{arch} (torchvision)", build, _img(2, side)))
            tv_keys.add(key)
    for key, name, build, inputs, vision in COMPACT:
        if not (args.tv and vision):
            out.append((key, name, build, inputs))
    return out


# --------------------------------------------------------------------------- runs


def _tensors(out):
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _step(f, m, inputs, train):
    """One step; returns outputs (and gradients) detached."""
    torch.manual_seed(0)
    if not train:
        with torch.no_grad():
            return [t.detach() for t in _tensors(f(*inputs))]
    for p in m.parameters():
        p.grad = None
    out = _tensors(f(*inputs))
    sum(t.float().pow(2).sum() for t in out).backward()
    return [t.detach() for t in out] + [p.grad for p in m.parameters() if p.grad is not None]


def _step_peak(f, m, inputs, train):
    """Peak bytes of one step above the start, from the profiler's CPU memory events."""
    from torch.profiler import ProfilerActivity, profile

    for p in m.parameters():
        p.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = _step(f, m, inputs, train)
        del res
    events = [
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    ]
    events.sort(key=lambda t: t[0])
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def _fresh(cache):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()


def compile_run(model, make_inputs, train, backend, cache, profile_step=False):
    """Compile and run the first step; returns (model copy, f, results, compile s, step peak)."""
    _fresh(cache)
    m = copy.deepcopy(model)
    if not train:
        m.eval()
    torch.manual_seed(1)
    inputs = make_inputs()
    f = torch.compile(m, backend=backend)
    t0 = time.perf_counter()
    res = _step(f, m, inputs, train)
    first = time.perf_counter() - t0
    steady = []
    for _ in range(2):
        t0 = time.perf_counter()
        _step(f, m, inputs, train)
        steady.append(time.perf_counter() - t0)
    peak = _step_peak(f, m, inputs, train) if profile_step else None
    return res, first - min(steady), peak


def _bitwise(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def one(key, name, build, make_inputs, train, args):
    """Every measurement of one (model, mode); returns the row dict."""
    torch.manual_seed(0)
    model = build()
    row = {"key": key, "model": name, "mode": "training" if train else "inference"}
    with contextlib.ExitStack() as stack:
        d_plain = tempfile.mkdtemp(prefix="bench_ind_plain_")
        d_ours = tempfile.mkdtemp(prefix="bench_ind_ours_")
        stack.callback(shutil.rmtree, d_plain, True)
        stack.callback(shutil.rmtree, d_ours, True)
        ref, row["cold_plain_s"], row["step_peak_plain"] = compile_run(
            model, make_inputs, train, "inductor", d_plain, profile_step=True
        )
        _, row["warm_plain_s"], _ = compile_run(model, make_inputs, train, "inductor", d_plain)
        cfg = PassConfig(time_limit_s=1.0)
        inductor_pass.clear_reports()
        with regenerate.Capture() as cap:
            got, cold, row["step_peak_ours"] = compile_run(
                model, make_inputs, train, make_backend(cfg), d_ours, profile_step=True
            )
        row["cold_ours_s"] = cold - cap.overhead_s
        row["capture_overhead_s"] = cap.overhead_s
        reps = inductor_pass.reports()
        row["bitwise"] = _bitwise(ref, got)
        del ref, got
        inductor_pass.clear_reports()
        _, row["warm_ours_s"], _ = compile_run(model, make_inputs, train, make_backend(cfg), d_ours)
        warm_reps = inductor_pass.reports()
        row["warm_from_cache"] = sum(
            "decision from the pass's cache" in " ".join(r.notes) for r in warm_reps
        )
        row["warm_graphs"] = len(warm_reps)
        # Regeneration (after the timed runs; in the cold cache directory).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = d_ours
        graphs = []
        for r in reps:
            g = next((c for c in cap.graphs if c.report is r), None)
            graphs.append(graph_row(r, g, args))
        row["graphs"] = graphs
    return row


def graph_row(r, g, args):
    off = r.variants.get("reorder_for_peak_memory=False") or {}
    ours = r.measured_permuted_peak if r.deployed else r.measured_original_peak
    gr = {
        "kind": r.kind,
        "units": r.num_units,
        "owned_inputs": r.owned_inputs,
        "num_inputs": r.num_inputs,
        "modelled_default": r.modelled_original_peak,
        "measured_default": r.measured_original_peak,
        "measured_reorder_off": off.get("measured_original_peak"),
        "modelled_reorder_off": off.get("modelled_original_peak"),
        "variant": r.variant,
        "deployed": r.deployed,
        "modelled_ours": r.modelled_permuted_peak if r.deployed else r.modelled_original_peak,
        "measured_ours": ours,
        "modelled_best_order": r.modelled_permuted_peak,
        "lower_bound": r.lower_bound,
        "certified": r.certified,
        "byte_exact": r.byte_exact,
        "pass_s": r.pass_seconds,
        "search_s": r.search_seconds,
        "reason": r.reason,
        "variants": r.variants,
        "regen": None,
    }
    target = r.permuted_source
    better = (
        target is not None
        and r.modelled_permuted_peak is not None
        and r.modelled_original_peak is not None
        and (r.modelled_permuted_peak < r.modelled_original_peak or r.deployed)
    )
    if args.regen_all and target is None:
        target = r.original_source
    if g is not None and target is not None and (better or args.regen_all):
        t0 = time.perf_counter()
        try:
            rg = regenerate.regenerate(g, target)
            gr["regen"] = {
                "predicted": r.modelled_permuted_peak if better else r.modelled_original_peak,
                "measured": rg.measured_peak,
                "bitwise": rg.bitwise,
                "matched_nodes": rg.matched,
                "nodes": rg.nodes,
                "in_order": rg.in_order,
                "better_order": better,
                "seconds": time.perf_counter() - t0,
                "notes": rg.notes,
            }
        except Exception as exc:
            gr["regen"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return gr


# --------------------------------------------------------------------------- output


def kib(x):
    return "-" if x is None else f"{x / 1024:.1f}"


def pct(new, old):
    if new is None or old in (None, 0):
        return "-"
    return f"{100.0 * (new - old) / old:+.1f}%"


def ratio(a, b):
    return "-" if not a or b is None else f"{b / a:.2f}"


def command_line():
    exe = sys.executable
    if exe.startswith(os.getcwd() + os.sep):
        exe = os.path.relpath(exe)
    return "nice -n 10 " + shlex.join([exe, os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def _geomean(xs):
    import math

    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _cert(g):
    """The program the pass runs is at the lower bound (modelled peaks are byte-exact)."""
    return (
        g["modelled_ours"] is not None
        and g["lower_bound"] is not None
        and g["modelled_ours"] <= g["lower_bound"]
    )


def _rewrite(g):
    """Measured peak of the pass's own rewrite with its best order (deployed or not)."""
    if g["deployed"]:
        return g["measured_ours"]
    return (g["variants"].get("default") or {}).get("measured_permuted_peak")


def summarize(rows):
    graphs = [g for r in rows for g in r["graphs"]]
    regen = [g["regen"] for g in graphs if g["regen"] and "measured" in g["regen"]]
    regen_better = [x for x in regen if x["better_order"]]
    gb = [g for g in graphs if g["regen"] and g["regen"].get("better_order")]
    s = {
        "configs": len(rows),
        "graphs": len(graphs),
        "deployed": sum(g["deployed"] for g in graphs),
        "deployed_permutation": sum(g["deployed"] and g["variant"] == "default" for g in graphs),
        "deployed_variant": sum(g["deployed"] and g["variant"] != "default" for g in graphs),
        "configs_deployed": sum(any(g["deployed"] for g in r["graphs"]) for r in rows),
        "certified": sum(_cert(g) for g in graphs),
        "byte_exact": sum(g["byte_exact"] is True for g in graphs),
        "bitwise_configs": sum(bool(r["bitwise"]) for r in rows),
        "ours_above_default": sum(
            g["measured_ours"] is not None
            and g["measured_default"] is not None
            and g["measured_ours"] > g["measured_default"]
            for g in graphs
        ),
        "ours_above_reorder_off": sum(
            g["measured_ours"] is not None
            and g["measured_reorder_off"] is not None
            and g["measured_ours"] > g["measured_reorder_off"]
            for g in graphs
        ),
        "step_peak_higher": sum(
            r["step_peak_ours"] > r["step_peak_plain"]
            for r in rows
            if r["step_peak_ours"] is not None and r["step_peak_plain"] is not None
        ),
        "step_peak_lower": sum(
            r["step_peak_ours"] < r["step_peak_plain"]
            for r in rows
            if r["step_peak_ours"] is not None and r["step_peak_plain"] is not None
        ),
        "regen_graphs": len(regen_better),
        "regen_missed_prediction": sum(x["measured"] > x["predicted"] for x in regen_better),
        "regen_below_prediction": sum(x["measured"] < x["predicted"] for x in regen_better),
        "regen_worse_than_default": sum(g["regen"]["measured"] > g["measured_default"] for g in gb),
        "regen_above_ours": sum(g["regen"]["measured"] > g["measured_ours"] for g in gb),
        "regen_above_rewrite": sum(
            _rewrite(g) is not None and g["regen"]["measured"] > _rewrite(g) for g in gb
        ),
        "regen_below_rewrite": sum(
            _rewrite(g) is not None and g["regen"]["measured"] < _rewrite(g) for g in gb
        ),
        "rewrite_missed_prediction": sum(
            _rewrite(g) is not None and _rewrite(g) > g["regen"]["predicted"] for g in gb
        ),
        "regen_not_bitwise": sum(not x["bitwise"] for x in regen),
        "regen_errors": sum(1 for g in graphs if g["regen"] and "error" in g["regen"]),
        "cold_ratio_geomean": _geomean([r["cold_ours_s"] / r["cold_plain_s"] for r in rows]),
        "cold_ratio_max": max((r["cold_ours_s"] / r["cold_plain_s"] for r in rows), default=0),
        "warm_ratio_geomean": _geomean([r["warm_ours_s"] / r["warm_plain_s"] for r in rows]),
        "warm_ratio_max": max((r["warm_ours_s"] / r["warm_plain_s"] for r in rows), default=0),
        "cold_plain_total_s": sum(r["cold_plain_s"] for r in rows),
        "cold_ours_total_s": sum(r["cold_ours_s"] for r in rows),
        "warm_plain_total_s": sum(r["warm_plain_s"] for r in rows),
        "warm_ours_total_s": sum(r["warm_ours_s"] for r in rows),
    }
    return s


def render(rows, failures, started, done, tv_info, commands=None, wall_s=None):
    s = summarize(rows)
    commands = commands or [command_line()]
    lines = [
        "# Inductor pass on 20+ architectures: CPU FP32, one thread",
        "",
        *[f"Command: `{c}`" for c in commands],
        "",
        f"torch {torch.__version__}; {tv_info}. Peaks in KiB."
        + ("" if done else " **Partial: the run is still going or was cut.**"),
        "",
        "## Per graph",
        "",
        "Peaks of one call as the runtime makes it (inputs the caller holds are not counted; "
        "inputs the call owns, a backward's saved activations, count from the start and are "
        "freed at their last use), measured by the counting CPU allocator. `default` = "
        "Inductor's default program, modelled / measured; `reorder off` = measured peak of "
        "the `reorder_for_peak_memory=False` program; `ours` = the program the pass runs from "
        "the second call (`program`: the variant, `+perm` when permuted), modelled / measured; "
        "`bound` = min-cut lower bound on any order of the chosen program, `cert` = ours equals "
        "it; `rewrite meas` = measured peak of the pass's own rewrite with its best order "
        "(deployed or not); `regen` = the pass's better order fed back to Inductor's scheduler and "
        "regenerated (`inductor_pass/regenerate.py`): predicted (the pass's modelled peak of "
        "that order) / measured, `-` where the pass found no better order.",
        "",
        "| mode | model | graph | units | default | reorder off | program | ours | saving | "
        "bound | cert | rewrite meas | regen pred / meas | regen vs rewrite |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for g in r["graphs"]:
            prog = g["variant"]
            if g["deployed"] and g["modelled_ours"] is not None:
                perm = g["variant"] == "default" or (
                    g["variants"].get(g["variant"], {}).get("deployed") is True
                )
                prog += " +perm" if perm else ""
            rg = g["regen"]
            if rg is None:
                regen_s, vs = "-", "-"
            elif "error" in rg:
                regen_s, vs = f"error: {rg['error'][:60]}", "-"
            else:
                regen_s = f"{kib(rg['predicted'])} / {kib(rg['measured'])}"
                if not rg["bitwise"]:
                    regen_s += " (not bitwise)"
                vs = pct(rg["measured"], _rewrite(g))
            lines.append(
                f"| {r['mode']} | {r['model']} | {g['kind']} | {g['units']} | "
                f"{kib(g['modelled_default'])} / {kib(g['measured_default'])} | "
                f"{kib(g['measured_reorder_off'])} | {prog} | "
                f"{kib(g['modelled_ours'])} / {kib(g['measured_ours'])} | "
                f"{pct(g['measured_ours'], g['measured_default'])} | {kib(g['lower_bound'])} | "
                f"{'yes' if _cert(g) else 'no'} | {kib(_rewrite(g)) if rg else '-'} | "
                f"{regen_s} | {vs} |"
            )
    lines += [
        "",
        "## Per step",
        "",
        "`step peak` = peak of one whole step (the third; forward and, in training, backward) "
        "above what was live at its start, from the profiler's CPU memory events "
        "(`torch.profiler`, `profile_memory=True`), plain Inductor vs the pass. `bitwise` = "
        "outputs (and gradients) of the first step equal to plain Inductor's. Compile s = "
        "first step minus the fastest of two steady steps, in this process: `cold` with an "
        "empty cache directory and Inductor's in-memory caches cleared, `warm` with the "
        "directory the cold run filled (in-memory caches cleared, dynamo reset); ours cold "
        "excludes the benchmark's own capture for the regeneration column. `warm cached` = "
        "graphs whose decision came from the pass's cache in the warm run.",
        "",
        "| mode | model | step peak plain | step peak ours | change | bitwise | cold plain / "
        "ours | ratio | warm plain / ours | ratio | warm cached |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['model']} | {kib(r['step_peak_plain'])} | "
            f"{kib(r['step_peak_ours'])} | {pct(r['step_peak_ours'], r['step_peak_plain'])} | "
            f"{r['bitwise']} | {r['cold_plain_s']:.1f} / {r['cold_ours_s']:.1f} | "
            f"{ratio(r['cold_plain_s'], r['cold_ours_s'])} | {r['warm_plain_s']:.2f} / "
            f"{r['warm_ours_s']:.2f} | {ratio(r['warm_plain_s'], r['warm_ours_s'])} | "
            f"{r['warm_from_cache']}/{r['warm_graphs']} |"
        )
    lines += [
        "",
        "## Summary",
        "",
        f"- {s['configs']} model/mode configurations, {s['graphs']} graphs; outputs bitwise "
        f"equal to plain Inductor in {s['bitwise_configs']}/{s['configs']}.",
        f"- Deployed: {s['deployed']}/{s['graphs']} graphs ({s['deployed_permutation']} "
        f"permutations of the default program, {s['deployed_variant']} variant programs), "
        f"in {s['configs_deployed']}/{s['configs']} configurations. Certified optimal (peak of "
        f"the chosen program = min-cut bound): {s['certified']}/{s['graphs']}. Byte-exact "
        f"(modelled == measured): {s['byte_exact']}/{s['graphs']}.",
        f"- Ours measured above Inductor's default program: {s['ours_above_default']} graphs; "
        f"above the reorder-off program: {s['ours_above_reorder_off']}. Real-step peak "
        f"(profiler) higher with the pass: {s['step_peak_higher']}/{s['configs']}, lower: "
        f"{s['step_peak_lower']}/{s['configs']}.",
        f"- Regeneration (graphs where the pass found a better order: {s['regen_graphs']}): "
        f"measured above the prediction in {s['regen_missed_prediction']}, below it in "
        f"{s['regen_below_prediction']}; above Inductor's default program in "
        f"{s['regen_worse_than_default']}; above the pass's own rewrite of that order in "
        f"{s['regen_above_rewrite']}, below it in {s['regen_below_rewrite']} (the rewrite "
        f"missed the prediction in {s['rewrite_missed_prediction']}); above the program the "
        f"pass runs in {s['regen_above_ours']}; not bitwise equal to the default program in "
        f"{s['regen_not_bitwise']}; failed in {s['regen_errors']} (source: missed the "
        "predicted peak in 22 of 54 CPU training configurations, worse in 9).",
        f"- Compile time ours / plain Inductor, in this process: cold geometric mean "
        f"{s['cold_ratio_geomean']:.2f}x (max {s['cold_ratio_max']:.2f}x; totals "
        f"{s['cold_ours_total_s']:.0f} / {s['cold_plain_total_s']:.0f} s), warm geometric mean "
        f"{s['warm_ratio_geomean']:.2f}x (max {s['warm_ratio_max']:.2f}x; totals "
        f"{s['warm_ours_total_s']:.1f} / {s['warm_plain_total_s']:.1f} s).",
        "- Wall time of the benchmark: "
        f"{(wall_s if wall_s is not None else time.perf_counter() - started) / 60:.1f} min.",
        "",
        "Reasons per graph:",
        "",
    ]
    for r in rows:
        for g in r["graphs"]:
            lines.append(f"- {r['mode']} / {r['model']} / {g['kind']}: {g['reason'][:300]}")
            if g["regen"] and g["regen"].get("notes"):
                lines.append(f"  - regen: {'; '.join(g['regen']['notes'])}")
    for f in failures:
        lines.append(f"- FAILED: {f}")
    return lines, s


def merge(args):
    """Render several runs' JSON files as one table (``--merge``)."""
    parts = []
    for f in [x for x in args.merge.split(",") if x]:
        with open(f) as fh:
            parts.append(json.load(fh))
    rows = [r for p in parts for r in p["rows"]]
    failures = [x for p in parts for x in p["failures"]]
    commands = [p["command"] for p in parts] + [command_line()]
    wall = sum(p.get("wall_s") or 0 for p in parts) or None
    stopped = [
        f"part {i + 1} was stopped after {len(p['rows'])} configuration(s)"
        for i, p in enumerate(parts)
        if not p["done"]
    ]
    lines, summary = render(rows, failures, 0.0, True, parts[0]["models"], commands, wall)
    lines.insert(
        2 + len(commands),
        f"(The first {len(parts)} commands ran as parallel processes over disjoint "
        "model/mode sets and wrote their parts' JSON; the last command merged them. "
        + ("; ".join(stopped) + " (their remaining models ran in later parts)." if stopped else "")
        + " Wall time below is the sum over parts.)",
    )
    if args.out:
        path = os.path.join(args.out, args.name)
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        with open(os.path.splitext(path)[0] + ".json", "w") as fh:
            json.dump(
                {
                    "commands": commands,
                    "torch": parts[0]["torch"],
                    "models": parts[0]["models"],
                    "done": True,
                    "summary": summary,
                    "rows": rows,
                    "failures": failures,
                },
                fh,
                indent=1,
                default=str,
            )
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(
        description="Benchmark the torch_replay Inductor pass on 20+ architectures (inference "
        "and training): modelled vs measured peaks per graph, Inductor's program variants, the "
        "regeneration baseline, real-step peaks (profiler) and compile time cold and warm. "
        "Prints the table; writes results only with --out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--models",
        default="",
        help="comma-separated model keys (default: all): " + ",".join(k for k, *_ in COMPACT),
    )
    ap.add_argument(
        "--quick", action="store_true", help=f"small run: models {','.join(QUICK)}, both modes"
    )
    ap.add_argument("--modes", default="inference,training", help="inference,training")
    ap.add_argument(
        "--tv", action="store_true", help="torchvision models instead of the compact vision models"
    )
    ap.add_argument("--tv-size", type=int, default=64, help="torchvision input side")
    ap.add_argument(
        "--regen-all",
        action="store_true",
        help="also regenerate graphs where the pass found no better order",
    )
    ap.add_argument("--name", default="inductor_arch.md", help="results file name")
    ap.add_argument(
        "--merge",
        default="",
        help="comma-separated .json files of earlier runs (e.g. the parts of one run split "
        "over processes): render them as one table into --out/--name, run nothing",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="folder to write <name> and its .json into (e.g. benchmarks/results); "
        "without it nothing is written",
    )
    args = ap.parse_args()
    if args.merge:
        return merge(args)
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1
    started = time.perf_counter()
    tv_info = "compact hand-written models"
    if args.tv:
        import torchvision

        tv_info = (
            f"torchvision {torchvision.__version__} models (weights=None) at "
            f"{args.tv_size}x{args.tv_size} where listed, compact models otherwise"
        )
    todo = model_list(args)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    if args.quick:
        keys = list(QUICK)
    if keys:
        todo = [t for t in todo if t[0] in keys]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    path = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, args.name)
    rows, failures = [], []
    # Warm-up: one-time costs of the first compile in a process (imports, toolchain
    # probes) would otherwise land on the first model's plain cold compile.
    with tempfile.TemporaryDirectory(prefix="bench_ind_warmup_") as d:
        for backend in ("inductor", make_backend(PassConfig())):
            compile_run(nn.Linear(4, 4), lambda: (torch.randn(2, 4),), True, backend, d)
    inductor_pass.clear_reports()

    def write(done):
        lines, summary = render(rows, failures, started, done, tv_info)
        if path is not None:
            with open(path, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            with open(os.path.splitext(path)[0] + ".json", "w") as fh:
                json.dump(
                    {
                        "command": command_line(),
                        "torch": torch.__version__,
                        "models": tv_info,
                        "done": done,
                        "summary": summary,
                        "rows": rows,
                        "failures": failures,
                    },
                    fh,
                    indent=1,
                    default=str,
                )
        return lines

    for key, name, build, make_inputs in todo:
        for mode in modes:
            t0 = time.perf_counter()
            print(f"{mode}: {name}", flush=True)
            try:
                rows.append(one(key, name, build, make_inputs, mode == "training", args))
            except Exception as exc:
                failures.append(f"{mode} / {name}: {type(exc).__name__}: {str(exc)[:300]}")
                print("  FAILED:", failures[-1], flush=True)
            print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
            write(False)
    print("\n".join(write(True)))


if __name__ == "__main__":
    main()
