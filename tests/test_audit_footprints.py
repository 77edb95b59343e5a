"""torch_replay.audit and torch_replay.checkpoint cannot disagree: the audit judges accesses
by the exact strided footprints of the checkpoint's own C++ checks (Note [Audit recorder]),
compared on planted and randomized strided views with what eager PyTorch,
torch.utils.checkpoint and torch_replay.checkpoint actually do on the same program.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

from torch_replay.audit import audit

# ------------------------------------------- audit and checkpoint cannot disagree
# The audit judges accesses by their exact strided footprints, with the checkpoint's own
# byte arithmetic (Note [Audit recorder]); a bounding byte interval would not. Each case
# below runs the same program three ways: eagerly (the reference gradient), under
# torch.utils.checkpoint, and under torch_replay.checkpoint (without state=, and with the
# state= the audit recommends), and compares with the audit's verdict.

_N = 32  # elements of the shared buffer and of the segment's scratch tensor


class _Seg(nn.Module):
    """Reads a strided view of a captured buffer; optionally copies between two strided
    views of a scratch tensor of its own."""

    def __init__(self, buf, read, copy):
        super().__init__()
        self.buf = [buf]  # captured, not registered here
        self.read = read
        self.copy = copy

    def forward(self, x):
        s = x * 1.0
        if self.copy is not None:
            dst, src = self.copy
            s.as_strided(*dst).copy_(s.as_strided(*src))
        return torch.sin(s + self.buf[0].as_strided(*self.read).sum())


class _Program(nn.Module):
    """The segment, then (before backward) an in-place write to a view of the buffer."""

    def __init__(self, read, write, copy):
        super().__init__()
        self.register_buffer("buf", torch.linspace(-1.0, 1.0, _N))
        self.seg = _Seg(self.buf, read, copy)
        self.write = write
        self.run_segment = None  # None: call it; else e.g. a checkpoint wrapper

    def forward(self, x):
        y = self.seg(x) if self.run_segment is None else self.run_segment(self.seg, x)
        if self.write is not None:
            with torch.no_grad():
                self.buf.as_strided(*self.write).add_(1.0)
        return y


def _elements(view):
    size, stride, offset = view
    idx = {offset}
    for n, st in zip(size, stride, strict=True):
        idx = {i + k * st for i in idx for k in range(n)}
    return idx


def _run(prog, x, run_segment=None):
    """One step of ``prog``: x's gradient, or the exception; the buffer is put back."""
    before = prog.buf.clone()
    prog.run_segment = run_segment
    x = x.detach().requires_grad_()
    try:
        prog(x).sum().backward()
        return x.grad
    except RuntimeError as exc:
        return exc
    finally:
        prog.run_segment = None
        with torch.no_grad():
            prog.buf.copy_(before)


def _check_against_checkpoint(prog, x):
    """Asserts the audit's verdict on ``prog.seg`` is what the checkpoints do; returns it."""
    import torch_replay as tr
    from torch_replay.errors import OverlapError, StateMutationError

    report = audit(prog, x.detach().requires_grad_(), segments=["seg"], probe_engines=False)
    s = report["seg"]
    with tr.config.patch(detect="reads"):  # the refusing level, which the verdict is about
        theirs = _run(prog, x, lambda f, a: tr.checkpoint(f, a, use_reentrant=False))
    with tr.config.patch(detect="preserve"):
        preserved = _run(prog, x, lambda f, a: tr.checkpoint(f, a, use_reentrant=False))
    if s.overlapping_writes:
        assert isinstance(theirs, OverlapError), (s, theirs)
        assert isinstance(preserved, OverlapError), (s, preserved)
        return s
    eager = _run(prog, x)
    assert isinstance(eager, torch.Tensor), eager
    assert report.error is None
    torch_grad = _run(prog, x, lambda f, a: tcp.checkpoint(f, a, use_reentrant=False))
    assert torch.equal(torch_grad, eager) == s.torch_checkpoint_exact, s
    # detect="preserve" needs no declaration: eager's gradient always.
    assert isinstance(preserved, torch.Tensor) and torch.equal(preserved, eager), (s, preserved)
    if s.mutated_after_read or s.written_elsewhere_after_read:
        assert isinstance(theirs, StateMutationError), (s, theirs)
        assert s.state == ["buf (buffer)"]
        declared = _run(
            prog, x, lambda f, a: tr.checkpoint(f, a, use_reentrant=False, state=[prog.buf])
        )
        assert torch.equal(declared, eager)
    else:
        assert s.state == [] and torch.equal(theirs, eager), (s, theirs)
    return s


def test_interleaved_columns_copy_is_not_an_overlap():
    # Even columns <- odd columns of one tensor: the bounding intervals overlap, the bytes
    # do not. torch runs it, torch_replay.checkpoint runs it: the audit must not refuse.
    col = ((4, 4), (8, 2))
    prog = _Program(read=((4,), (1,), 0), write=None, copy=((*col, 0), (*col, 1)))
    s = _check_against_checkpoint(prog, torch.randn(_N))
    assert s.overlapping_writes == [] and s.torch_checkpoint_exact


def test_overlapping_columns_copy_is_an_overlap():
    col = ((4, 3), (8, 2))  # columns 0, 2, 4 <- columns 2, 4, 6
    prog = _Program(read=((4,), (1,), 0), write=None, copy=((*col, 0), (*col, 2)))
    s = _check_against_checkpoint(prog, torch.randn(_N))
    assert s.overlapping_writes and not s.torch_checkpoint_exact


def test_write_to_other_columns_after_the_read():
    # The segment reads the even columns, the loop then writes the odd ones: the re-run of
    # torch.utils.checkpoint reads unchanged bytes (exact), torch_replay's version check
    # refuses unless the buffer is declared, so the audit recommends declaring it.
    prog = _Program(read=((4, 4), (8, 2), 0), write=((4, 4), (8, 2), 1), copy=None)
    s = _check_against_checkpoint(prog, torch.randn(_N))
    assert s.torch_checkpoint_exact and s.mutated_after_read == []
    assert s.written_elsewhere_after_read == ["buf (buffer) (by <outside segments>)"]


def test_write_to_the_columns_read():
    prog = _Program(read=((4, 4), (8, 2), 0), write=((2, 4), (16, 2), 8), copy=None)
    s = _check_against_checkpoint(prog, torch.randn(_N))
    assert not s.torch_checkpoint_exact
    assert s.mutated_after_read == ["buf (buffer) (by <outside segments>)"]


def _random_view(g, writable, size=None):
    """A strided view of an _N-element storage; a writable one has no element twice."""
    while True:
        if size is None:
            dims = int(torch.randint(1, 3, (), generator=g))
            shape = tuple(int(v) for v in torch.randint(1, 5, (dims,), generator=g))
        else:
            shape = size
        low = 1 if writable else 0
        stride = tuple(int(v) for v in torch.randint(low, 9, (len(shape),), generator=g))
        offset = int(torch.randint(0, _N, (), generator=g))
        idx = _elements((shape, stride, offset))
        n = 1
        for v in shape:
            n *= v
        if max(idx) < _N and (not writable or len(idx) == n):
            return shape, stride, offset


def _interval(view):
    idx = _elements(view)
    return min(idx), max(idx)


def test_random_views_audit_equals_checkpoint():
    """Random strided views (offsets, strides, 1-2 dims): a read of the buffer in the
    segment, a write to it outside, a copy between views inside. The audit's verdict
    equals what the checkpoints do in every case, including those where the bounding
    interval rule of the former audit disagreed with the exact footprints."""
    g = torch.Generator().manual_seed(15)
    kinds = {
        "copy: interval overlaps, bytes do not": 0,
        "write: interval overlaps, bytes do not": 0,
    }
    for _ in range(60):
        read = _random_view(g, writable=False)
        write = _random_view(g, writable=True) if torch.rand((), generator=g) < 0.7 else None
        copy = None
        if torch.rand((), generator=g) < 0.5:
            dst = _random_view(g, writable=True)
            copy = (dst, _random_view(g, writable=False, size=dst[0]))
        prog = _Program(read, write, copy)
        s = _check_against_checkpoint(prog, torch.randn(_N, generator=g))
        if copy is not None:
            (a0, a1), (b0, b1) = _interval(copy[0]), _interval(copy[1])
            if a0 <= b1 and b0 <= a1 and copy[0] != copy[1] and not s.overlapping_writes:
                kinds["copy: interval overlaps, bytes do not"] += 1
        if write is not None and not s.overlapping_writes:
            (a0, a1), (b0, b1) = _interval(read), _interval(write)
            if a0 <= b1 and b0 <= a1 and not (_elements(read) & _elements(write)):
                assert s.torch_checkpoint_exact
                kinds["write: interval overlaps, bytes do not"] += 1
    assert all(kinds.values()), kinds


def test_instance_norm_running_stats_written_by_a_nested_operator():
    # instance_norm updates its running statistics through the operators it calls; the
    # recorder takes the write from the checkpoint observer's write table (Note [Audit
    # recorder]). Checked against what each checkpoint does to the statistics.
    import torch_replay as tr

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.InstanceNorm1d(3, track_running_stats=True), nn.Tanh()).train()

    x = torch.randn(2, 3, 5, requires_grad=True)
    s = audit(make(), x, segments=["0"])["0"]
    assert s.mutated_in_forward == ["0.running_mean (buffer)", "0.running_var (buffer)"]
    assert not s.torch_checkpoint_exact and s.auto_engine == "journal"
    stats = []
    for run in (
        lambda m: m(x),
        lambda m: tcp.checkpoint(m, x, use_reentrant=False),
        lambda m: tr.checkpoint(m, x, use_reentrant=False, state=[m[0]]),
    ):
        m = make()
        run(m).sum().backward()
        stats.append(m[0].running_mean.clone())
    assert not torch.equal(stats[1], stats[0])  # torch.utils.checkpoint: updated twice
    assert torch.equal(stats[2], stats[0])
