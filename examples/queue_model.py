"""A small model of your own, as the docs' planner workflow uses it.

Four residual MLP blocks; the last one also scores its output against a queue of
past keys (a MoCo-style negative queue) that the training step updates in place
between the forward and the backward. ``make()`` is the factory the calibration
command takes::

    python -m torch_replay.calibrate --model examples.queue_model:make --quick --out costs.json
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A residual MLP block: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class QueueHead(nn.Module):
    """Projects and scores against ``queue`` (rows of past keys): ``logits = h @ queue.T``."""

    def __init__(self, width: int, queue: torch.Tensor) -> None:
        super().__init__()
        self.proj = nn.Linear(width, queue.shape[1])
        self.queue = queue  # declared state: updated in place by the training loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) @ self.queue.T


def make(width: int = 128, hidden: int = 512, batch: int = 64, queue_rows: int = 1024):
    """The factory: ``(segments, example_input, state)``.

    Args:
        width: features of the activations.
        hidden: hidden features of each block.
        batch: rows of the example input.
        queue_rows: rows of the queue.

    Returns:
        An ``nn.Sequential`` of four segments, an example input, and the declared
        state ``[queue]``.
    """
    torch.manual_seed(0)
    queue = torch.randn(queue_rows, 32)
    segments = nn.Sequential(
        Block(width, hidden), Block(width, hidden), Block(width, hidden), QueueHead(width, queue)
    )
    x = torch.randn(batch, width)
    return segments, x, [queue]
