"""The model zoo of ``benchmarks/bench_inductor.py``: compact versions of 20+ families.

Each entry of :data:`COMPACT` is ``(key, name, builder, make_inputs, vision)``;
:func:`model_list` picks the models of a run (torchvision's with ``--tv``). The models
are ``zoo_convnets``' and ``zoo_sequence``'s; ``benchmarks/bench_inductor_device.py``
builds some of them too.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.lib.zoo_convnets import (
    MCU,
    ConvNeXt,
    DenseBlock,
    EfficientNet,
    Inception,
    RegNet,
    SmallDeepLab,
    SmallMobileNet,
    SmallResNet,
    UNet,
)
from benchmarks.lib.zoo_sequence import (
    BNMLP,
    Block,
    DropoutMLP,
    EmbedScatter,
    EmbedSegments,
    LSTMNet,
    Mixer,
    Swin,
    ViT,
)


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
