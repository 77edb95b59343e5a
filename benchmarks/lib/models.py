"""Small models that tests and benchmarks share (one definition each).

Import as ``from benchmarks.lib.models import PreNormBlock, ResBlock`` (the repository root
on the path: ``python -m benchmarks.NAME``, or pytest from the root).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

__all__ = ["BasicBlock", "PreNormBlock", "ResBlock"]


class PreNormBlock(nn.Module):
    """A pre-norm transformer block: causal self-attention (SDPA) and an MLP, each residual.

    Args:
        d: Model width.
        heads: Attention heads (``d`` divisible by it).
        dropout: Dropout of the attention and of the MLP's output (0: none, deterministic).
    """

    def __init__(self, d: int = 32, heads: int = 4, *, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout,
        )
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        mlp = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + (F.dropout(mlp, self.dropout) if self.dropout else mlp)


class ResBlock(nn.Module):
    """A ResNet basic block without a stride: conv-BN-ReLU-conv-BN plus the input, ReLU."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convs with BN, a projection shortcut when needed.

    Args:
        cin: Input channels.
        cout: Output channels.
        stride: Stride of the first conv (and of the shortcut).
    """

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))
