"""The model zoo of ``benchmarks/bench_inductor.py``: compact versions of 20+ families.

Each entry of :data:`COMPACT` is ``(key, name, builder, make_inputs, vision)``;
:func:`model_list` picks the models of a run (torchvision's with ``--tv``).
Also used by ``benchmarks/bench_inductor_device.py``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

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


class Pooled(nn.Module):
    """A classifier: a stack of layers ``f``, a global average pool, a linear head ``fc``.

    Args:
        *layers: the stack, in order.
        features: channels out of the stack.
        classes: outputs of the head.
    """

    def __init__(self, *layers: nn.Module, features: int, classes: int = 10):
        super().__init__()
        self.f = nn.Sequential(*layers)
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


class SmallMobileNet(Pooled):
    """MobileNetV2-style inverted residuals (stand-in for torchvision MobileNetV2)."""

    def __init__(self):
        super().__init__(
            conv_bn(3, 16, 3, 2),
            InvRes(16, 16, 1),
            InvRes(16, 24, 2),
            InvRes(24, 24, 1),
            features=24,
        )


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


class MCU(Pooled):
    """Microcontroller-class CNN (depthwise-separable)."""

    def __init__(self, w=8, depth=3):
        layers = [conv_bn(1, w, 3, 2)]
        for _ in range(depth):
            layers += [conv_bn(w, w, 3, 1, groups=w), conv_bn(w, 2 * w, 1)]
            w *= 2
        super().__init__(*layers, features=w, classes=4)


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


class EfficientNet(Pooled):
    def __init__(self, act=nn.SiLU, gate=torch.sigmoid):
        super().__init__(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            act(),
            MBConv(16, 16, 1, 4, act, gate),
            MBConv(16, 24, 2, 4, act, gate),
            MBConv(24, 24, 1, 4, act, gate),
            features=24,
        )


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


class RegNet(Pooled):
    def __init__(self):
        super().__init__(
            conv_bn(3, 16, 3, 2),
            XBlock(16, 32, 2),
            XBlock(32, 32, 1),
            XBlock(32, 64, 2),
            features=64,
        )


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
