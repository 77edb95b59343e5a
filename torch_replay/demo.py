"""The main job: torch.utils.checkpoint returns a wrong gradient on a model whose buffer
changes between forward and backward; torch_replay.checkpoint returns the right one,
with the block declared (``state=[block]``) and with nothing declared (the default
level, ``tr.config.detect = "preserve"``); at the refusing level (``"reads"``) it refuses,
naming the buffer, instead of returning a wrong gradient.

    python -m torch_replay.demo

The model is a residual MLP block with a ``shift`` buffer (a stand-in for an EMA
statistic, a MoCo queue or a cache) that the training loop updates after the forward
and before the backward. Eager PyTorch keeps the activations, so its gradient is the
gradient of the forward that ran: it is the reference.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr


class Block(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.register_buffer("shift", torch.randn(4 * dim) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x)) + self.shift))


def step(method: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(32, 64, requires_grad=True)
    if method == "eager":
        y = block(x)
    elif method == "torch.utils.checkpoint":
        y = tcp.checkpoint(block, x, use_reentrant=False)
    elif method == "state=[block]":
        with tr.config.patch(detect="reads"):
            y = tr.checkpoint(block, x, state=[block], use_reentrant=False)
    else:  # nothing declared: what the segment reads is preserved
        with tr.config.patch(detect="preserve"):
            y = tr.checkpoint(block, x, use_reentrant=False)
    with torch.no_grad():
        block.shift.mul_(0.9).add_(0.3)  # the buffer moves on before backward
    y.pow(2).mean().backward()
    return [x.grad] + [p.grad for p in block.parameters()]


def main(argv: list[str] | None = None) -> int:
    """Run the demo (``python -m torch_replay.demo [-h]``).

    Args:
        argv: arguments (default ``sys.argv[1:]``); the demo takes none but ``-h``.

    Returns:
        0 when torch_replay's gradient equals eager PyTorch's and torch's differs.
    """
    import argparse

    argparse.ArgumentParser(
        prog="python -m torch_replay.demo",
        description=__doc__.split("\n\n    python")[0]
        + "\n\nRuns one training step four ways (eager PyTorch, torch.utils.checkpoint, "
        "torch_replay.checkpoint with state=[block] and with nothing declared at the "
        'default level, "preserve"), prints each gradient\'s largest difference to eager, then '
        'shows the error torch_replay gives when nothing is declared at the level "reads". '
        "Takes a few seconds; writes nothing. Exit status 0 when the outcome is as expected.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    ref = step("eager")
    print("gradient difference to eager PyTorch (the forward that actually ran):")
    worst = {}
    methods = ("torch.utils.checkpoint", "state=[block]", "preserve")
    labels = {
        "torch.utils.checkpoint": "torch.utils.checkpoint",
        "state=[block]": "torch_replay.checkpoint, state=[block]",
        "preserve": "torch_replay.checkpoint, nothing declared",
    }
    for method in methods:
        got = step(method)
        worst[method] = max((a - b).abs().max().item() for a, b in zip(got, ref, strict=True))
        print(f"  {labels[method]:42s} max |grad - reference| = {worst[method]:.3e}")
    try:
        with tr.config.patch(detect="reads"):  # refuse instead of preserving
            torch.manual_seed(0)
            block = Block()
            x = torch.randn(32, 64, requires_grad=True)
            y = tr.checkpoint(block, x, use_reentrant=False)  # the buffer is not declared
            with torch.no_grad():
                block.shift.add_(1.0)
            y.sum().backward()
        print('nothing declared, detect="reads": no error (unexpected)')
        return 1
    except tr.StateMutationError as e:
        print(f'nothing declared, detect="reads": torch_replay refuses: {e}')
    ok = worst["torch.utils.checkpoint"] > 0.0 and all(worst[m] == 0.0 for m in methods[1:])
    print("OK" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
