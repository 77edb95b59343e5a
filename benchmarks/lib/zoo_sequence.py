"""The attention, recurrent, MLP and embedding families of the model zoo
(``inductor_zoo``): a transformer block, ViT, Swin, LSTM/GRU cells, MLP-Mixer, embedding
segment sums, the dropout / BatchNorm MLPs and a top-1 mixture of experts whose routing
decides its sizes.
"""

from __future__ import annotations

import torch
import torch.nn as nn


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


class RoutedMoE(nn.Module):
    """Top-1 mixture of experts over tokens ``[n, d]``: the router's argmax picks each
    token's expert, and each expert runs on the tokens ``nonzero`` gives it, so its sizes
    are data-dependent (unbacked symbols under ``torch.compile`` with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops``)."""

    def __init__(self, d=32, experts=4, hidden=128):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.up = nn.ModuleList(nn.Linear(d, hidden) for _ in range(experts))
        self.down = nn.ModuleList(nn.Linear(hidden, d) for _ in range(experts))

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, (up, down) in enumerate(zip(self.up, self.down, strict=True)):
            idx = (choice == i).nonzero().squeeze(1)
            out = out.index_add(0, idx, down(torch.relu(up(x[idx]))))
        return x + out
