"""Another thread drawing from the default generator while a segment runs (an
augmentation thread) does not disturb a segment that draws nothing itself (Note
[Generator draws by thread] in csrc/aten/generator_state.h; issue 44, item 6).

The other thread's draw is made deterministic here: the segment's forward starts a
thread, which draws, and joins it. The observer is per thread, so the draw is not the
segment's. Before, the default generator counted as moved by the segment: its re-run was
set back to the forward's start (replaying the other thread's stream), was found at
another end position and raised RngMismatchError.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import torch_replay as tr


def _draw_on_another_thread():
    t = threading.Thread(target=lambda: torch.randn(16))
    t.start()
    t.join()


class Block(nn.Module):
    def __init__(self, dropout: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5) if dropout else nn.Identity()

    def forward(self, x):
        _draw_on_another_thread()
        return torch.tanh(self.drop(self.lin(x)))


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_segment_that_draws_nothing_ignores_other_threads(reentrant, early_stop):
    torch.manual_seed(0)
    block = Block(dropout=False)
    x = torch.randn(4, 8, requires_grad=True)
    ref = copy.deepcopy(block)
    ref(x).sum().backward()
    kw = {"use_reentrant": reentrant}
    if not reentrant:
        kw["early_stop"] = early_stop
    y = tr.checkpoint(block, x, **kw)
    before = torch.get_rng_state()
    y.sum().backward()  # its re-run starts a thread that draws too
    after = torch.get_rng_state()
    assert torch.equal(block.lin.weight.grad, ref.lin.weight.grad)
    # The re-run neither rewound the generator nor put a saved state back: it is where
    # the re-run's other thread left it.
    torch.set_rng_state(before)
    torch.randn(16)
    assert torch.equal(torch.get_rng_state(), after)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_segment_that_draws_is_still_reproduced(reentrant):
    """A segment with dropout draws its own mask: the re-run reproduces it bitwise (the
    other thread's draw inside the forward moved the generator between the segment's
    start and its draw, so the forward's mask is what the re-run must see)."""
    torch.manual_seed(0)
    block = Block(dropout=True)
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(1)
    ref = copy.deepcopy(block)
    ref(x).sum().backward()
    torch.manual_seed(1)
    y = tr.checkpoint(block, x, use_reentrant=reentrant)
    y.sum().backward()
    assert torch.equal(block.lin.weight.grad, ref.lin.weight.grad)
