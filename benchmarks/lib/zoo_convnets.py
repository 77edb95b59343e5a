"""The convolutional families of the model zoo (``inductor_zoo``): compact ResNet,
MobileNet, EfficientNet, RegNet, DenseNet, Inception, ConvNeXt, DeepLab, U-Net and MCU
models.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, k=3, s=1, groups=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


def shortcut(cin, cout, s):
    """A residual's skip path: a strided 1x1 projection where the shape changes."""
    if s != 1 or cin != cout:
        return nn.Sequential(nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))
    return nn.Identity()


class Basic(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, s)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.sc = shortcut(cin, cout, s)

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


def stem_and_blocks(block, *stages: tuple[int, int]) -> list[nn.Module]:
    """A 16-channel stride-2 stem, then ``block(cin, cout, stride)`` per ``(cout, stride)``
    of ``stages``, each block taking the channels of the one before."""
    layers, cin = [conv_bn(3, 16, 3, 2)], 16
    for cout, s in stages:
        layers.append(block(cin, cout, s))
        cin = cout
    return layers


class SmallMobileNet(Pooled):
    """MobileNetV2-style inverted residuals (stand-in for torchvision MobileNetV2)."""

    def __init__(self):
        super().__init__(*stem_and_blocks(InvRes, (16, 1), (24, 2), (24, 1)), features=24)


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
        self.sc = shortcut(cin, cout, s)

    def forward(self, x):
        return F.relu(self.f(x) + self.sc(x))


class RegNet(Pooled):
    def __init__(self):
        super().__init__(*stem_and_blocks(XBlock, (32, 2), (32, 1), (64, 2)), features=64)
