"""Writes the dispatcher never sees (Note [Unseen writes] in csrc/core/region_journal.h).

A buffer the segment reads is updated between forward and backward by a torch.compile'd
function (a compiled EMA update: Inductor's kernel writes the buffer in place and only
bumps its version counter) or through the memory of ``.numpy()`` (no version bump at
all). Against eager PyTorch (the forward that ran: the gradient without the update):
``readset`` and ``snapshot`` restore their copy however the bytes changed and give
eager's gradient bitwise; the journal, the guard, ``auto`` and ``detect="preserve"``
cannot undo a compiled write and refuse it by name (before, all of them gave torch's
wrong gradient); a ``.numpy()`` write leaves no trace the dispatcher can see, and is
refused under ``verify="bytes"`` (docs/limits.md).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint as tcp
from torch import nn

import torch_replay as tr

ENGINES = ("auto", "journal", "readset", "snapshot", "guard")
COPYING = ("readset", "snapshot")
REENTRANT = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x):
        return torch.tanh(self.lin(x) * self.shift)


@torch.compile(backend="inductor", fullgraph=True)
def compiled_ema(buf, new):
    buf.mul_(0.5).add_(new)


def numpy_ema(buf, new):
    a = buf.numpy()
    a *= 0.5
    a += new.numpy()


def _setup():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(4, 8, requires_grad=True)
    new = torch.randn(8)
    return block, x, new


def _eager_grads():
    """The forward that ran, differentiated: no update happens before its backward."""
    block, x, _ = _setup()
    block(x).sum().backward()
    return block.lin.weight.grad, x.grad


def _run(write, *, reentrant, engine=None, detect=None, verify=None):
    block, x, new = _setup()
    kw = {} if engine is None else {"state": [block], "engine": engine}
    settings = {k: v for k, v in (("detect", detect), ("verify", verify)) if v is not None}
    with tr.config.patch(**settings):
        y = tr.checkpoint(block, x, use_reentrant=reentrant, **kw)
        write(block.shift, new)
        after_write = block.shift.clone()
        rng = torch.get_rng_state()
        try:
            y.sum().backward()
        except tr.ReplayError as e:
            # Nothing the user owns moved: the buffer keeps the update, the generator
            # its position.
            assert torch.equal(block.shift, after_write)
            assert torch.equal(torch.get_rng_state(), rng)
            return e
    assert torch.equal(block.shift, after_write)  # the re-run left the update in place
    return block.lin.weight.grad, x.grad


def _eager_grads_torch_misses(write):
    """Eager's gradients, having checked that the case is real: torch's checkpoint is
    wrong when ``write`` updates the buffer between forward and backward."""
    eager = _eager_grads()
    block, x, new = _setup()
    y = tcp.checkpoint(block, x, use_reentrant=False)
    write(block.shift, new)
    y.sum().backward()
    assert not torch.equal(block.lin.weight.grad, eager[0])
    return eager


def _assert_grads_equal(got, want):
    assert not isinstance(got, Exception), got
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@REENTRANT
@pytest.mark.parametrize("engine", ENGINES)
def test_compiled_update_of_declared_state(engine, reentrant):
    eager = _eager_grads_torch_misses(compiled_ema)
    got = _run(compiled_ema, reentrant=reentrant, engine=engine)
    if engine in COPYING:
        _assert_grads_equal(got, eager)
    else:
        assert isinstance(got, tr.StateMutationError), got
        msg = str(got)
        assert "bypassed the dispatcher" in msg and "Block.shift" in msg
        assert "engine='readset' or 'snapshot'" in msg


@REENTRANT
@pytest.mark.parametrize("detect", ["reads", "preserve"])
def test_compiled_update_of_undeclared_state(detect, reentrant):
    got = _run(compiled_ema, reentrant=reentrant, detect=detect)
    assert isinstance(got, tr.StateMutationError), got
    assert "shift" in str(got)
    if detect == "preserve":
        assert "bypassed the dispatcher" in str(got)


@REENTRANT
@pytest.mark.parametrize("engine", COPYING)
def test_numpy_write_to_declared_state_copying_engines(engine, reentrant):
    eager = _eager_grads_torch_misses(numpy_ema)
    _assert_grads_equal(_run(numpy_ema, reentrant=reentrant, engine=engine), eager)


@pytest.mark.parametrize("engine", ["auto", "journal", "guard"])
def test_numpy_write_refused_under_verify_bytes(engine):
    got = _run(numpy_ema, reentrant=False, engine=engine, verify="bytes")
    assert isinstance(got, tr.StateMutationError), got
    assert "Block.shift" in str(got)


def test_dispatcher_update_still_journaled():
    """The same update made eagerly (seen by the write watch) is undone by the journal,
    not refused: the check counts the writes it saw."""

    def eager_ema(buf, new):
        with torch.no_grad():
            buf.mul_(0.5).add_(new)

    eager = _eager_grads()
    for engine in ("auto", "journal"):
        got = _run(eager_ema, reentrant=False, engine=engine)
        assert not isinstance(got, Exception), got
        assert torch.equal(got[0], eager[0])
    got = _run(eager_ema, reentrant=False, detect="preserve")
    assert torch.equal(got[0], eager[0])


def test_compiled_update_of_state_the_segment_does_not_read_is_not_refused():
    """state=[model] declares every buffer; a compiled update of one the segment never
    touched changes nothing the re-run reads: no refusal, eager's gradient."""
    block, x, new = _setup()
    block.register_buffer("other", torch.zeros(8))
    ref = copy.deepcopy(block)
    ref(x).sum().backward()
    y = tr.checkpoint(block, x, use_reentrant=False, state=[block], engine="journal")
    compiled_ema(block.other, new)
    y.sum().backward()
    assert torch.equal(block.lin.weight.grad, ref.lin.weight.grad)
