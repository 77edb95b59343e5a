"""What the Inductor pass's tests share: one pass-config context manager, the models, and
the independent references (plain Inductor's outputs, peaks measured around the user's call).

The models are plain modules (no test code) so that the tests' subprocesses import them
too (``from tests.inductor_support import ...`` with the repository on ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

import inductor_pass
from inductor_pass.stages.guard import counting_window

from .installed import subprocess_env

__all__ = [
    "Branchy",
    "ConvNet",
    "FrozenBranchy",
    "Mixer",
    "RoutedTwoBranch",
    "SegmentNet",
    "Summed",
    "TwoBranch",
    "call_peak",
    "mixer_and_input",
    "pass_config",
    "real_step",
    "subprocess_env",
    "unbacked_config",
]


@contextlib.contextmanager
def pass_config(**changes: Any) -> Iterator[inductor_pass.PassConfig]:
    """``inductor_pass.set_config(**changes)`` for the block, restored on exit."""
    old = inductor_pass.set_config(**changes)
    try:
        yield inductor_pass.get_config()
    finally:
        inductor_pass.set_config(old)


class SegmentNet(nn.Module):
    """Embedding, scatter-add into ``segments`` rows, then Linear (+ optional hidden layer)."""

    def __init__(self, vocab, dim, segments, out, *, hidden=0, act="relu"):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, hidden) if hidden else None
        self.lin = nn.Linear(hidden or dim, out)
        self.segments = segments
        self.act = act

    def forward(self, ids, seg):
        e = self.emb(ids)
        pooled = torch.zeros(self.segments, e.shape[1], dtype=e.dtype).index_add(0, seg, e)
        if self.hidden is not None:
            pooled = torch.tanh(self.hidden(pooled))
        y = self.lin(pooled)
        y = torch.relu(y) if self.act == "relu" else torch.nn.functional.gelu(y)
        return y.sum()


class ConvNet(nn.Module):
    """Conv-BN-ReLU blocks with a residual: training graphs with extern and C++ kernels."""

    def __init__(self, width=8, blocks=2):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1),
                nn.BatchNorm2d(width),
            )
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for b in self.blocks:
            x = torch.relu(x + b(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        return self.head(x.mean((2, 3))).logsumexp(1).sum()


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.n1 = nn.LayerNorm(dim)
        self.n2 = nn.LayerNorm(dim)
        self.tok = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens)
        )
        self.ch = nn.Sequential(
            nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim)
        )

    def forward(self, x):
        x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.n2(x))


class Mixer(nn.Module):
    """MLP-Mixer: its inference graph peaks lower with ``reorder_for_peak_memory`` off."""

    def __init__(self, depth=4, tokens=64, dim=128, token_hidden=64, channel_hidden=512):
        super().__init__()
        self.stem = nn.Linear(48, dim)
        self.blocks = nn.Sequential(
            *[MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(depth)]
        )
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(1))


class Branchy(nn.Module):
    """Two wide branches into one head: Inductor's order holds both branches' activations at
    once, and the pass deploys a permutation of the default program (a cached decision)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 512)
        self.b = nn.Linear(64, 512)
        self.h = nn.Linear(512, 8)

    def forward(self, x):
        return self.h(torch.relu(self.a(x))) * self.h(torch.tanh(self.b(x)))


class TwoBranch(nn.Module):
    """Two branches of different depths and widths into one product: with symbolic sizes
    (``dynamic=True``, where Inductor fuses Branchy's two activations into one kernel)
    Inductor's order is still not the lowest, in inference and in the backward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 512)
        self.b1 = nn.Linear(64, 256)
        self.b2 = nn.Linear(256, 768)
        self.h = nn.Linear(512, 8)
        self.g = nn.Linear(768, 8)

    def forward(self, x):
        b = self.g(torch.sigmoid(self.b2(torch.tanh(self.b1(x)))))
        return self.h(torch.relu(self.a(x))) * b


class RoutedTwoBranch(nn.Module):
    """A mixture of experts whose routing decides sizes: a top-1 gate picks each row's
    expert (``torch.nonzero``: unbacked symbols), around :class:`TwoBranch` as the
    shared layer, where Inductor's order is not the lowest. Compile it with
    ``capture_dynamic_output_shape_ops`` (:func:`unbacked_config`)."""

    def __init__(self, experts: int = 2, hidden: int = 256):
        super().__init__()
        self.gate = nn.Linear(64, experts)
        self.shared = TwoBranch()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 8))
            for _ in range(experts)
        )

    def routing(self, x: torch.Tensor) -> list[int]:
        """Rows per expert (the sizes the data decides)."""
        choice = self.gate(x).argmax(-1)
        return [int((choice == e).sum()) for e in range(len(self.experts))]

    def forward(self, x):
        choice = self.gate(x).argmax(-1)
        y = self.shared(x)
        out = y
        for e, expert in enumerate(self.experts):
            rows = torch.nonzero(choice == e).squeeze(-1)
            out = out.index_add(0, rows, expert(y[rows]))
        return out


@contextlib.contextmanager
def unbacked_config() -> Iterator[None]:
    """Dynamo traces data-dependent sizes (``nonzero``, ``.item()``) into the graph."""
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
    ):
        yield


class FrozenBranchy(nn.Module):
    """Three conv branches of different widths multiplied together: with
    ``torch._inductor.config.freezing`` (weights prepacked into mkldnn tensors, each conv
    and its activation one oneDNN call) Inductor's order is not the lowest."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b1 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.b2 = nn.Conv2d(2 * c, 4 * c, 1)
        self.b3 = nn.Conv2d(4 * c, c, 1)
        self.c1 = nn.Conv2d(c, c // 4, 3, padding=1)
        self.c2 = nn.Conv2d(c // 4, c, 1)
        self.proj = nn.Conv2d(c, c, 1)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        a = self.a(x)
        b = self.b3(torch.sigmoid(self.b2(torch.tanh(self.b1(x)))))
        c = self.c2(torch.tanh(self.c1(x)))
        return self.head(self.proj(a * b * c).mean((2, 3)))


class Summed(nn.Module):
    """``inner(x).sum()``: a scalar loss for a training step."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).sum()


def mixer_and_input() -> tuple[Mixer, torch.Tensor]:
    """A seeded Mixer in eval mode and its input."""
    torch.manual_seed(0)
    return Mixer().eval(), torch.randn(16, 64, 48)


def call_peak(model, x, backend) -> tuple[int, torch.Tensor]:
    """Peak bytes of the second inference call, measured around it, and its output."""
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(model, backend=backend)
        f(x)  # compiles; the pass runs here
        with counting_window() as stats:
            out = f(x)
            peak = stats()["peak"]
    return peak, out


def real_step(model, inputs, backend) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """Peak bytes of a real training step (the second; the first compiles and profiles),
    measured around the user's calls, with its loss and gradients."""
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    f = torch.compile(m, backend=backend)
    f(*inputs).backward()
    m.zero_grad(set_to_none=True)
    with counting_window() as stats:
        loss = f(*inputs)
        loss.backward()
        peak = stats()["peak"]
    grads = [p.grad.clone() for p in m.parameters()]
    return peak, loss.detach(), grads


def logged_sum_op(name: str) -> list[float]:
    """Registers ``torch.ops.torch_replay_test.<name>``: the sum of its input as a
    one-element tensor, each call's value appended to the returned list (what the
    effect tests count: how often the operator really ran). One name per test file."""
    calls: list[float] = []

    @torch.library.custom_op(f"torch_replay_test::{name}", mutates_args=())
    def logged_sum(x: torch.Tensor) -> torch.Tensor:
        calls.append(float(x.sum()))
        return x.sum().reshape(1)

    @logged_sum.register_fake
    def _(x):
        return x.new_empty(1)

    return calls
