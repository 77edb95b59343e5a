"""After a ReplayError, generators, buffers and tensors are as backward found them
(docs/errors.md), whatever ``preserve_rng_state`` and ``early_stop`` say (issue 44,
item 7).

With ``preserve_rng_state=False`` the default generator is not tracked: a re-run draws
from it where it is and leaves it advanced, as torch's re-run does (bitwise torch on
success). When that re-run then fails, the generator used to stay advanced; now it is put
back (Note [Generators after a failed re-run] in csrc/aten/transaction.h).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as tcp
from torch import nn

import torch_replay as tr


class DrawsThenWrites(nn.Module):
    """Draws a dropout mask, then adds a value that depends on it to a buffer: a re-run
    with another mask (its generator not preserved) ends with other bytes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.register_buffer("acc", torch.zeros(()))

    def forward(self, x):
        h = self.drop(self.lin(x))
        self.acc.add_(h.sum().detach())
        return torch.tanh(h)


def _segment_options(reentrant, early_stop):
    kw = {"use_reentrant": reentrant, "preserve_rng_state": False}
    if not reentrant:
        kw["early_stop"] = early_stop
    return kw


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("engine", [None, "journal", "snapshot"])
def test_failed_rerun_leaves_generators_buffers_and_inputs(engine, reentrant, early_stop):
    torch.manual_seed(0)
    block = DrawsThenWrites()
    x = torch.randn(4, 8, requires_grad=True)
    kw = _segment_options(reentrant, early_stop)
    if engine is not None:
        kw.update(state=[block], engine=engine)
    y = tr.checkpoint(block, x, **kw)
    torch.randn(3)  # the loop draws between forward and backward
    rng, acc, xs = torch.get_rng_state(), block.acc.clone(), x.detach().clone()
    with pytest.raises(tr.StateMutationError):
        y.sum().backward()
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(block.acc, acc)
    assert torch.equal(x.detach(), xs)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_successful_rerun_advances_the_generator_as_torch(reentrant):
    """The success path is unchanged: with preserve_rng_state=False the re-run's draws
    leave the generator where torch's re-run leaves it, and the gradient is torch's."""
    got = []
    for checkpoint in (tcp.checkpoint, tr.checkpoint):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Tanh())
        x = torch.randn(4, 8, requires_grad=True)
        y = checkpoint(model, x, use_reentrant=reentrant, preserve_rng_state=False)
        torch.randn(3)
        y.sum().backward()
        got.append((torch.get_rng_state(), model[0].weight.grad))
    assert torch.equal(got[0][0], got[1][0])
    assert torch.equal(got[0][1], got[1][1])
