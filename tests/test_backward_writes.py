"""State written during the backward, before the re-run of the segment that read it.

The writer runs inside the backward itself: a tensor hook, a module's backward hook,
a custom autograd Function's backward, a TorchDispatchMode active during backward, a
saved-tensor unpack hook. Every program
runs two blocks, ``h = seg1(x); y = seg2(f(h))``, and writes seg1's ``shift`` buffer
once, after the backward started and before seg1 is re-run.

Reference: eager autograd, whose gradient is that of the forward that ran (the
writes land after it). torch.utils.checkpoint re-runs seg1 on the new buffer and is
wrong (checked, so each write really lands before the re-run); torch_replay must give
eager's gradient bit for bit, or refuse with the guard, which keeps nothing.

The write watch (Note [Write watch] in csrc/aten/write_watch.h) must see each of these
writes, the one a dispatch mode makes inside another operator's dispatch included.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp
from torch.utils._python_dispatch import TorchDispatchMode

import torch_replay as tr

from .reference import REENTRANT, ShiftBlock, assert_bitwise, storage_bytes


class _Once:
    """Adds 1 to ``blk.shift`` the first time it is called (through ``.data`` when
    asked: an alias with a version counter of its own)."""

    def __init__(self, blk: nn.Module, through_data: bool = False):
        self.blk, self.through_data, self.done = blk, through_data, False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            with torch.no_grad():
                (self.blk.shift.data if self.through_data else self.blk.shift).add_(1.0)


class _Bump(torch.autograd.Function):
    """Identity whose backward runs ``write`` (a custom Function: a Python node)."""

    @staticmethod
    def forward(ctx, x, write):
        ctx.write = write
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.write()
        return g, None


class _WriterMode(TorchDispatchMode):
    def __init__(self, write):
        super().__init__()
        self.write = write

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.expand.default:  # inside SumBackward0's formula
            self.write()
        return func(*args, **(kwargs or {}))


def _program(how: str):
    """(model builder, step) for one way of writing during the backward. ``step(ckpt,
    seg1, seg2, x)`` runs forward and backward, returns the tensors to compare."""

    def step(ckpt, seg1, seg2, x):
        write = _Once(seg1, through_data=how == "hook, through .data")
        h = ckpt(seg1, x)
        mode = contextlib.nullcontext()
        if how in ("tensor hook", "hook, through .data"):
            h.register_hook(lambda g: write())
        elif how == "module backward hook":
            seg2.register_full_backward_hook(lambda *a: write())
        elif how == "custom Function":
            h = _Bump.apply(h, write)
        elif how == "dispatch mode":
            mode = _WriterMode(write)
        if how == "saved-tensor hook":
            # Outside both segments: its unpack runs inside MulBackward0's apply.
            def unpack(t):
                write()
                return t

            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
                h = h * h
        else:
            h = h * 1.5
        y = ckpt(seg2, h)
        loss = (y * 2.0).sum()
        with mode:
            loss.backward()
        assert write.done, "the program's write never ran"
        return [x.grad, seg1.lin.weight.grad, seg2.lin.weight.grad]

    return step


WAYS = [
    "tensor hook",
    "hook, through .data",
    "module backward hook",
    "custom Function",
    "dispatch mode",
    "saved-tensor hook",
]


def _run(how, mode, reentrant=False, declare=False, engine=None):
    """One program under eager autograd, torch's checkpoint or ours (declaring each
    block with ``engine`` if ``declare``); its gradients and seg1."""
    torch.manual_seed(0)
    seg1, seg2 = ShiftBlock(), ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)

    def ckpt(f, h):
        if mode == "eager":
            return f(h)
        if mode == "torch":
            return tcp.checkpoint(f, h, use_reentrant=reentrant)
        state = [f] if declare else None
        return tr.checkpoint(f, h, use_reentrant=reentrant, state=state, engine=engine or "auto")

    return _program(how)(ckpt, seg1, seg2, x), seg1


@pytest.fixture
def preserve():
    with tr.config.patch(detect="preserve"):
        yield


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("how", WAYS)
def test_torch_checkpoint_reruns_on_the_written_state(how, reentrant):
    ref, _ = _run(how, "eager")
    theirs, _ = _run(how, "torch", reentrant)
    assert any(not torch.equal(a, b) for a, b in zip(theirs, ref, strict=True))


@pytest.mark.parametrize("engine", ["journal", "auto"])
@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("how", WAYS)
def test_declared_state_written_during_backward_is_eager(how, reentrant, engine):
    ref, _ = _run(how, "eager")
    ours, _ = _run(how, "ours", reentrant, declare=True, engine=engine)
    assert_bitwise(ours, ref)


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("how", WAYS)
def test_preserved_state_written_during_backward_is_eager(how, reentrant, preserve):
    ref, _ = _run(how, "eager")
    ours, _ = _run(how, "ours", reentrant)
    assert_bitwise(ours, ref)


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("how", WAYS)
def test_the_guard_refuses_state_written_during_backward(how, reentrant):
    with pytest.raises(tr.StateMutationError, match="shift"):
        _run(how, "ours", reentrant, declare=True, engine="guard")


# ------------------------------------------------------------- other observers


def test_a_profiler_sees_every_backward_operator_of_a_watched_step():
    """The write watch hides nothing from another observer of operators (here torch's
    profiler, during a backward the watch covers): it records the same operators as
    under torch's checkpoint."""

    def counted(ckpt_kind):
        torch.manual_seed(0)
        seg1, seg2 = ShiftBlock(), ShiftBlock()
        x = torch.randn(4, 8, requires_grad=True)
        if ckpt_kind == "torch":
            ckpt = lambda f, h: tcp.checkpoint(f, h, use_reentrant=False)  # noqa: E731
        else:
            ckpt = lambda f, h: tr.checkpoint(  # noqa: E731
                f, h, use_reentrant=False, state=[f], engine="journal"
            )
        y = ckpt(seg2, ckpt(seg1, x) * 1.5)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            (y * 2.0).sum().backward()
        names = [e.name for e in prof.events()]
        return {n: names.count(n) for n in ("aten::mm", "aten::tanh_backward", "aten::mul")}

    ours = counted("ours")
    assert ours == counted("torch")
    assert ours["aten::mm"] > 0


def test_the_live_state_is_left_as_written(preserve):
    """The journal puts the written bytes back after the re-run (what backward leaves
    is what the writer wrote, as in eager)."""
    (_, seg1_eager) = _run("custom Function", "eager")
    (_, seg1_ours) = _run("custom Function", "ours", False)
    assert storage_bytes(seg1_ours.shift) == storage_bytes(seg1_eager.shift)


# ------------------------------------------- a dispatch mode writing inside a segment


class _TanhWriterMode(TorchDispatchMode):
    """Adds 1 to ``blk.shift`` before every ``tanh``: a write made inside another
    operator's dispatch (the observer sees it nested in ``tanh``)."""

    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.tanh.default:
            with torch.no_grad():
                self.blk.shift.add_(1.0)
        return func(*args, **(kwargs or {}))


def _mode_program(mode, in_backward, engine="journal", declare=True):
    torch.manual_seed(0)
    blk = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    with _TanhWriterMode(blk):
        if mode == "eager":
            y = blk(x)
        else:
            state = [blk] if declare else None
            y = tr.checkpoint(blk, x, use_reentrant=False, state=state, engine=engine)
    with _TanhWriterMode(blk) if in_backward else contextlib.nullcontext():
        y.sum().backward()
    return [x.grad, blk.lin.weight.grad], blk


@pytest.mark.parametrize("engine", ["journal", "auto", "snapshot", "readset"])
def test_declared_state_a_mode_writes_in_forward_and_rerun_is_eager(engine):
    """The mode writes the declared buffer inside tanh's dispatch, in the forward and
    again in the re-run: the re-run starts from the forward's bytes and ends where it
    did, so the gradient and the state after backward are eager's."""
    ref, blk_ref = _mode_program("eager", True)
    ours, blk = _mode_program("ours", True, engine)
    assert_bitwise(ours, ref)
    assert storage_bytes(blk.shift) == storage_bytes(blk_ref.shift)


def test_declared_state_a_mode_writes_in_the_forward_only_is_refused():
    """Without the mode the re-run cannot reproduce the forward's write: refused, not a
    gradient of another forward."""
    with pytest.raises(tr.StateMutationError, match="shift"):
        _mode_program("ours", False)


@pytest.mark.parametrize("detect", ["reads", "preserve"])
def test_undeclared_state_a_mode_writes_after_the_segment_read_it(detect):
    """Undeclared: the segment reads ``shift`` (the add), then the mode writes it inside
    tanh's dispatch, in the forward and in the re-run. The write is the segment's own
    write of pre-existing state, kept for the re-run: eager's gradient and state (no
    second update left behind); without the mode in backward the re-run is refused."""
    with tr.config.patch(detect=detect):
        ref, blk_ref = _mode_program("eager", True)
        ours, blk = _mode_program("ours", True, "auto", declare=False)
        assert_bitwise(ours, ref)
        assert storage_bytes(blk.shift) == storage_bytes(blk_ref.shift)
        with pytest.raises(tr.StateMutationError, match="shift"):
            _mode_program("ours", False, "auto", declare=False)


def test_torch_checkpoint_is_wrong_on_the_undeclared_mode_write():
    """The reference can fail: torch's checkpoint re-runs from the written buffer and
    writes it again, a gradient and a state eager never had."""
    ref, blk_ref = _mode_program("eager", True)
    torch.manual_seed(0)
    blk = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    with _TanhWriterMode(blk):
        y = tcp.checkpoint(blk, x, use_reentrant=False)
    with _TanhWriterMode(blk):
        y.sum().backward()
    assert not torch.equal(x.grad, ref[0])
    assert storage_bytes(blk.shift) != storage_bytes(blk_ref.shift)
