"""torch_replay.checkpoint with state that changes between forward and backward.

Every hidden-state test runs three programs that do the same thing: eager (the
reference: the gradient of the forward that ran), torch.utils.checkpoint (shown to be
wrong, so the condition really is hidden) and torch_replay.checkpoint (must equal the
reference, and leave the live state byte-identical to what it was before backward).
Kinds of state: module buffers, ring-buffer queues, MoCo queues enqueued outside the
segments, generators, typed aliases, batch-norm statistics; what each engine keeps.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr

from .reference import (
    ALL_ENGINES,
    ENGINES_WRITING,
    REENTRANT,
    MoCoHead,
    ShiftBlock,
    assert_bitwise,
    assert_refused_leaving,
    grads,
    storage_bytes,
)


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


# -------------------------------------------------------------- hidden state kinds


def check_hidden(program, engines, reentrant_modes=REENTRANT):
    """program(mode, reentrant, engine) -> (grads, state_before_backward, state_after)."""
    ref, _, _ = program("eager", False, None)
    for reentrant in reentrant_modes:
        try:
            theirs, _, _ = program("torch", reentrant, None)
            assert max_diff(theirs, ref) > 1e-4, "torch.utils.checkpoint was right: not hidden"
        except RuntimeError as exc:  # torch may also fail outright (version counter)
            assert "modified by an inplace operation" in str(exc)
        for engine in engines:
            ours, before, after = program("ours", reentrant, engine)
            assert_bitwise(ours, ref)
            assert before == after, f"live state changed by backward ({engine})"


def _ckpt(mode, reentrant, engine, fn, *args, state=None):
    if mode == "eager":
        return fn(*args)
    if mode == "torch":
        return tcp.checkpoint(fn, *args, use_reentrant=reentrant)
    return tr.checkpoint(fn, *args, state=state, engine=engine, use_reentrant=reentrant)


def test_mutated_module_buffer():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        m = ShiftBlock()
        x = torch.randn(4, 8, requires_grad=True)
        y = _ckpt(mode, reentrant, engine, m, x, state=[m])
        m.shift.mul_(-3.0)  # e.g. an EMA update after forward, before backward
        before = storage_bytes(m.shift)
        y.pow(2).sum().backward()
        return grads(x, m.lin.weight), before, storage_bytes(m.shift)

    check_hidden(program, ["auto", "snapshot", "readset"])


@pytest.mark.detect("reads")  # what the refusing level says
@pytest.mark.parametrize("reentrant", REENTRANT)
def test_undeclared_mutated_buffer_raises_naming_it(reentrant):
    torch.manual_seed(0)
    m = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    y = tr.checkpoint(m, x, use_reentrant=reentrant)
    m.shift.add_(1.0)
    assert_refused_leaving(y, m.shift, "shift")


def test_saved_level_detects_saved_tensor_mutation():
    # y = x * w saves w; eager autograd raises on w.add_(); torch's checkpoint does not.
    w = torch.randn(5)
    x = torch.randn(5, requires_grad=True)
    with tr.config.patch(detect="saved"):
        y = tr.checkpoint(lambda a: a * w, x, use_reentrant=False)
        w.add_(1)
        with pytest.raises(tr.StateMutationError, match="saved for backward"):
            y.sum().backward()


class Queue(nn.Module):
    """MoCo-style ring buffer: logits against every slot, then one slot overwritten."""

    def __init__(self, slots=16, dim=8, reference=False):
        super().__init__()
        self.register_buffer("queue", torch.randn(slots, dim))
        self.ptr = 0
        self.reference = reference

    def forward(self, q):
        bank = self.queue.clone() if self.reference else self.queue
        logits = q @ bank.t()
        with torch.no_grad():
            self.queue[self.ptr % self.queue.shape[0]] = q.detach()[0]
        self.ptr += 1
        return torch.log_softmax(logits, dim=-1)


def test_ring_buffer_queue_with_sparse_writes():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        enc = nn.Linear(8, 8)
        qm = Queue(reference=mode == "eager")
        x = torch.randn(3, 4, 8, requires_grad=True)
        loss = 0
        for step in range(3):  # three segments, each reading all and writing one slot

            def seg(inp, qm=qm, step=step):
                qm.ptr = step  # the replay must see the same slot
                return qm(enc(inp))

            loss = loss + _ckpt(mode, reentrant, engine, seg, x[step], state=[qm]).sum()
        qm.queue[5:7] = 0.0  # the queue keeps moving before backward
        before = storage_bytes(qm.queue)
        loss.backward()
        return grads(x, enc.weight), before, storage_bytes(qm.queue)

    check_hidden(program, ENGINES_WRITING[:3])  # journal: see the next test


def test_ring_buffer_journal_keeps_only_written_rows():
    torch.manual_seed(0)
    enc = nn.Linear(8, 8)
    qm = Queue(slots=64)
    x = torch.randn(4, 8, requires_grad=True)

    def seg(inp, step):
        qm.ptr = step  # the replay must write the same slot
        return qm(enc(inp))

    ys, txns = [], []
    for step in range(3):
        ys.append(tr.checkpoint(seg, x, step, state=[qm], engine="journal", use_reentrant=False))
        txns.append(tr.last_transaction())
    # Each segment keeps its own written row and those of the later segments.
    row = 8 * 4
    assert [t.engine for t in txns] == ["journal"] * 3
    assert [t.retained_bytes for t in txns] == [3 * row, 2 * row, row]
    before = storage_bytes(qm.queue)
    sum(y.sum() for y in ys).backward()
    assert storage_bytes(qm.queue) == before


@pytest.fixture
def detect_level():
    old = tr.config.detect
    yield lambda level: setattr(tr.config, "detect", level)
    tr.config.detect = old


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("how", ["journal", "auto", "preserve"])
def test_queue_enqueued_outside_segments_is_preserved(reentrant, how, detect_level):
    """Note [Write watch]: the enqueue in the training loop is journaled before it
    overwrites the rows, so the re-run sees the forward's queue and the journal keeps
    about the written rows, not the queue. The queue is declared with
    engine="journal" or "auto", or not declared at all under
    tr.config.detect = "preserve" (Note [Preserved reads])."""
    if how == "preserve":
        detect_level("preserve")
        options = {}
    else:
        options = {"engine": how}

    def run(ckpt):
        torch.manual_seed(0)
        head = MoCoHead()
        x = torch.randn(8, 16, requires_grad=True)
        losses = []
        for step in range(3):
            if ckpt:
                state = None if how == "preserve" else [head.queue]
                y = tr.checkpoint(head, x, use_reentrant=reentrant, state=state, **options)
            else:
                y = head(x)
            keys = torch.randn(8, 16)
            if ckpt:  # MoCo's order: enqueue, then backward
                head.enqueue(keys)
                kept = tr.last_transaction().retained_bytes
            loss = -y[:, step].sum()
            loss.backward()
            if not ckpt:  # eager autograd cannot run the enqueue before backward
                head.enqueue(keys)
                kept = 0
            losses.append((loss.detach(), kept))
        return [x.grad, head.proj.weight.grad, head.queue.clone()], losses

    ours, ours_losses = run(True)
    ref, ref_losses = run(False)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a, b)
    assert [loss for loss, _ in ours_losses] == [loss for loss, _ in ref_losses]
    row_bytes = 8 * 16 * 4  # one enqueue of 8 keys
    assert all(kept == row_bytes for _, kept in ours_losses)  # not the 16 KiB queue


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_without_preserve_the_same_queue_is_refused(reentrant, detect_level):
    detect_level("reads")
    head = MoCoHead()
    x = torch.randn(8, 16, requires_grad=True)
    y = tr.checkpoint(head, x, use_reentrant=reentrant)
    head.enqueue(torch.randn(8, 16))
    with pytest.raises(tr.StateMutationError, match="queue"):
        y.sum().backward()


def test_preserve_refuses_a_write_that_bypasses_the_dispatcher(detect_level, monkeypatch):
    detect_level("preserve")
    monkeypatch.setattr(tr.config, "verify", "bytes")  # (Note [Verification levels])
    head = MoCoHead()
    x = torch.randn(8, 16, requires_grad=True)
    y = tr.checkpoint(head, x, use_reentrant=False)
    head.queue.numpy()[:4] *= 2.0  # raw memory: no operator, nothing journaled
    assert_refused_leaving(y, head.queue, "bypassed the dispatcher")


def test_preserve_keeps_parameters_it_only_reads_at_no_cost(observer, detect_level):
    detect_level("preserve")
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3)])
    x = torch.randn(4, 32, requires_grad=True)
    h = x
    for b in blocks:
        h = tr.checkpoint(b, h, use_reentrant=False)
    assert tr.last_transaction().retained_bytes == 0
    ref_model = [p.detach().clone() for p in blocks.parameters()]
    with torch.no_grad():  # e.g. an EMA update of the weights before backward
        for p in blocks.parameters():
            p.mul_(0.5)
    h.pow(2).sum().backward()
    got = grads(x, *blocks.parameters())
    # Eager on the forward-time weights.
    clone = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3)])
    with torch.no_grad():
        for p, v in zip(clone.parameters(), ref_model, strict=True):
            p.copy_(v)
    x2 = x.detach().clone().requires_grad_(True)
    clone(x2).pow(2).sum().backward()
    assert_bitwise(got, grads(x2, *clone.parameters()))


def test_journal_refuses_a_write_that_bypasses_the_dispatcher(monkeypatch):
    monkeypatch.setattr(tr.config, "verify", "bytes")  # (Note [Verification levels])
    head = MoCoHead()
    x = torch.randn(8, 16, requires_grad=True)
    y = tr.checkpoint(head, x, use_reentrant=False, state=[head.queue], engine="journal")
    head.queue.numpy()[:4] *= 2.0  # raw memory: no operator, nothing journaled
    assert_refused_leaving(y, head.queue, "bypassed the dispatcher")


def test_explicit_generator():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8)
        g = torch.Generator().manual_seed(123)
        x = torch.randn(4, 8, requires_grad=True)

        def seg(inp):
            noise = torch.rand(inp.shape, generator=g)
            return torch.tanh(lin(inp) * noise)

        state = [g] if engine == "auto" else None  # undeclared generators are found too
        y = _ckpt(mode, reentrant, engine, seg, x, state=state)
        torch.rand(3, generator=g)  # later draws move the generator
        before = bytes(g.get_state().numpy())
        y.pow(2).sum().backward()
        return grads(x, lin.weight), before, bytes(g.get_state().numpy())

    check_hidden(program, ["auto", "snapshot"])


def test_default_generator_dropout():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8)
        x = torch.randn(16, 8, requires_grad=True)
        seg = lambda inp: torch.nn.functional.dropout(torch.tanh(lin(inp)), 0.5)  # noqa: E731
        if mode == "torch":  # torch is right here unless RNG preservation is off
            y = tcp.checkpoint(seg, x, use_reentrant=reentrant, preserve_rng_state=False)
        else:
            y = _ckpt(mode, reentrant, engine, seg, x)
        torch.rand(5)  # the default generator moves on before backward
        before = bytes(torch.get_rng_state().numpy())
        y.pow(2).sum().backward()
        return grads(x, lin.weight), before, bytes(torch.get_rng_state().numpy())

    check_hidden(program, ["auto"])


def test_typed_alias_written_through_the_other_view():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8)
        w = torch.randn(8)
        w_bits = w.view(torch.int32)  # same bytes, another dtype
        x = torch.randn(4, 8, requires_grad=True)
        seg = lambda inp: torch.tanh(lin(inp) + w)  # noqa: E731
        y = _ckpt(mode, reentrant, engine, seg, x, state=[w_bits])  # declare the int view
        w_bits[::2] ^= 0x00400000  # flip a mantissa bit through the integer view
        before = storage_bytes(w)
        y.pow(2).sum().backward()
        return grads(x, lin.weight), before, storage_bytes(w)

    check_hidden(program, ENGINES_WRITING[:3])


def test_state_mutated_by_a_later_segment_in_the_same_forward():
    def program(mode, reentrant, engine):
        torch.manual_seed(0)
        lin1, lin2 = nn.Linear(8, 8), nn.Linear(8, 8)
        buf = torch.randn(8)
        x = torch.randn(4, 8, requires_grad=True)
        if mode == "eager":
            seg1 = lambda inp: torch.tanh(lin1(inp) + buf.clone())  # noqa: E731
        else:
            seg1 = lambda inp: torch.tanh(lin1(inp) + buf)  # noqa: E731

        def seg2(inp):
            buf.mul_(-2.0)  # a later segment overwrites what segment 1 read
            return torch.tanh(lin2(inp))

        h = _ckpt(mode, reentrant, engine, seg1, x, state=[buf])
        y = _ckpt(mode, reentrant, engine, seg2, h, state=[buf])
        before = storage_bytes(buf)
        y.pow(2).sum().backward()
        return grads(x, lin1.weight), before, storage_bytes(buf)

    check_hidden(program, ENGINES_WRITING)


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_batchnorm_running_stats_are_updated_once(reentrant):
    def run(ckpt):
        torch.manual_seed(0)
        bn = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
        x = torch.randn(10, 6, requires_grad=True)
        y = ckpt(bn, x) if ckpt else bn(x)
        y.pow(2).sum().backward()
        return [bn[1].running_mean.clone(), bn[1].running_var.clone()] + grads(x)

    ref = run(None)
    theirs = run(lambda f, x: tcp.checkpoint(f, x, use_reentrant=reentrant))
    ours = run(lambda f, x: tr.checkpoint(f, x, use_reentrant=reentrant))
    assert not torch.equal(theirs[0], ref[0])  # torch updates the running stats twice
    assert_bitwise(ours, ref)


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_retain_graph_repeated_backward_identical(engine):
    torch.manual_seed(0)
    m = ShiftBlock()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 8, requires_grad=True)

    def seg(inp):
        return m(inp) * torch.rand(inp.shape, generator=g)

    y = tr.checkpoint(seg, x, state=[m, g], engine=engine, use_reentrant=False)
    if engine not in ("guard", "journal"):
        m.shift.add_(5.0)
    before = (storage_bytes(m.shift), bytes(g.get_state().numpy()), torch.get_rng_state())
    results = []
    for _ in range(3):
        x.grad = None
        y.sum().backward(retain_graph=True)
        results.append(x.grad.clone())
        now = (storage_bytes(m.shift), bytes(g.get_state().numpy()), torch.get_rng_state())
        assert now[0] == before[0] and now[1] == before[1] and torch.equal(now[2], before[2])
    assert_bitwise(results[1:], results[:-1])


def test_guard_refuses_changed_state_and_keeps_nothing():
    torch.manual_seed(0)
    m = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    y = tr.checkpoint(m, x, state=[m], engine="guard", use_reentrant=False)
    assert tr.last_transaction().retained_bytes == 0
    m.shift.add_(1.0)
    assert_refused_leaving(y, m.shift, "guard")


def test_auto_keeps_nothing_for_state_it_only_reads():
    # Copy-on-write: nothing is kept until something writes the state before
    # backward, and then only the old bytes of what was written.
    torch.manual_seed(0)
    big = torch.randn(1000)
    x = torch.randn(10, requires_grad=True)
    y = tr.checkpoint(lambda a: torch.tanh(a * big[:10]), x, state=[big], use_reentrant=False)
    txn = tr.last_transaction()
    assert txn.engine == "journal"
    assert txn.retained_bytes == 0
    ref = torch.autograd.grad(torch.tanh(x * big[:10].clone()).sum(), x)[0]
    big[5:20].mul_(3.0)  # outside any segment, before backward
    assert txn.retained_bytes == 15 * 4
    after = storage_bytes(big)
    y.sum().backward()
    assert torch.equal(x.grad, ref)
    assert storage_bytes(big) == after


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_readme_usage_keeps_no_copy_of_parameters(reentrant):
    # tr.checkpoint(block, x, state=[block]): the blocks only read their
    # parameters, so nothing is kept from forward to backward.
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(4)])
    x = torch.randn(8, 64, requires_grad=True)
    gc.collect()  # transactions an earlier test left in reference cycles go now, not mid-test
    base = tr.engine_bytes()
    h = x
    for b in blocks:
        h = tr.checkpoint(b, h, state=[b], use_reentrant=reentrant)
    assert tr.engine_bytes() == base
    h.pow(2).sum().backward()
    got = grads(x, *blocks.parameters())
    x.grad = None
    blocks.zero_grad()
    blocks(x).pow(2).sum().backward()
    assert_bitwise(got, grads(x, *blocks.parameters()))


# ------------------------------------------ Note [Verification levels]: "dispatcher"


@pytest.mark.parametrize("verify", ["dispatcher", "bytes"])
@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda b: b.data.add_(1.0), id="data"),  # its own version counter
        pytest.param(lambda b: b.view(torch.int32)[1].add_(1), id="int-view"),
        pytest.param(
            lambda b: torch.tensor([], dtype=b.dtype).set_(b.untyped_storage())[2].fill_(7.0),
            id="set_-alias",
        ),
    ],
)
def test_guard_refuses_a_dispatcher_write_through_any_alias(write, verify, monkeypatch):
    """The guard keeps nothing: a write made after the forward through any alias of
    the declared storage is refused at both levels (without hashing at
    "dispatcher": the write watch marks it), and the buffer is left as the write
    left it. torch.utils.checkpoint gives a wrong gradient here, since the change
    reaches no version counter the forward saw."""
    monkeypatch.setattr(tr.config, "verify", verify)
    torch.manual_seed(0)
    m = ShiftBlock()
    x = torch.randn(4, 8, requires_grad=True)
    y = tr.checkpoint(m, x, state=[m], engine="guard", use_reentrant=False)
    write(m.shift)
    before = storage_bytes(m.shift)
    with pytest.raises(tr.StateMutationError, match="guard"):
        y.sum().backward()
    assert storage_bytes(m.shift) == before


@pytest.mark.parametrize("engine", ["guard", "journal", "auto", "readset", "snapshot"])
def test_a_write_to_bytes_the_segment_did_not_read_is_not_a_change(engine):
    """Marks are per byte range: the guard accepts a write to rows the forward never
    read, and every engine gives eager's gradient."""
    torch.manual_seed(0)
    big = torch.randn(64)
    x = torch.randn(8, requires_grad=True)
    y = tr.checkpoint(
        lambda a: torch.tanh(a * big[:8]), x, state=[big], engine=engine, use_reentrant=False
    )
    ref = torch.autograd.grad(torch.tanh(x * big[:8].clone()).sum(), x)[0]
    big[32:].mul_(2.0)  # bytes the segment never read
    y.sum().backward()
    assert torch.equal(x.grad, ref)


@pytest.mark.parametrize("verify", ["dispatcher", "bytes"])
@pytest.mark.parametrize("engine", ["journal", "readset", "snapshot"])
def test_a_rerun_writing_what_the_forward_only_read_is_verified(engine, verify, monkeypatch):
    """The forward reads a declared buffer; the re-run (its control flow depends on a
    Python flag the user flipped) writes it. The end state differs from the
    forward's, so the re-run is refused at both levels (at "dispatcher" the bytes are
    hashed just before the re-run writes them), and the buffer keeps its value."""
    monkeypatch.setattr(tr.config, "verify", verify)
    buf = torch.randn(8)
    flag = {"write": False}

    def seg(a):
        if flag["write"]:
            buf.mul_(2.0)
        return a * buf

    x = torch.randn(8, requires_grad=True)
    y = tr.checkpoint(seg, x, state=[buf], engine=engine, use_reentrant=False)
    flag["write"] = True
    before = storage_bytes(buf)
    with pytest.raises(tr.StateMutationError, match="reproduce"):
        y.sum().backward()
    assert storage_bytes(buf) == before


# ------------------------------------------------ how declared modules are collected


class _Shared(nn.Module):
    """A tree torch's walk de-duplicates: a submodule reached twice, a tied
    parameter, a None buffer, a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        inner = nn.Linear(4, 4)
        self.a = nn.Sequential(inner, nn.BatchNorm1d(4))
        self.b = inner  # the same module again
        self.c = nn.Linear(4, 4)
        self.c.weight = self.a[0].weight  # tied
        self.register_buffer("nothing", None)
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


class _OwnWalk(nn.Module):
    """A module that changes what named_parameters yields."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def named_parameters(self, *args, **kwargs):
        return iter([("only.bias", self.lin.bias)])


@pytest.mark.parametrize("make", [_Shared, _OwnWalk, lambda: nn.TransformerEncoderLayer(8, 2)])
def test_declared_modules_are_collected_as_torchs_own_walk_lists_them(make):
    """state=[module] declares exactly module.named_buffers() then
    module.named_parameters() (torch's own methods are the reference), with their
    names, whatever the tree shares or overrides."""
    from torch_replay._replay.segment import collect_state

    m = make()
    tensors, names, _, _ = collect_state([m], m)
    want = [(n, "buffer", b) for n, b in m.named_buffers()]
    want += [(n, "parameter", p) for n, p in m.named_parameters()]
    assert [t is w for t, (_, _, w) in zip(tensors, want, strict=True)] == [True] * len(want)
    prefix = type(m).__name__
    assert names == [f"{prefix}.{n} ({kind})" for n, kind, _ in want]


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_a_weight_read_whole_then_written_in_the_segment_gives_eagers_gradient(engine):
    """Note [Whole reads]: once a declared weight was read whole, later reads are
    dismissed, but a write to it inside the segment (and the reads after that write)
    still counts: every engine that may preserve a write gives eager's gradient and
    leaves the weight as eager left it; the guard refuses."""
    torch.manual_seed(0)
    w0 = torch.randn(6, 6)
    x0 = torch.randn(3, 6)

    def program(w, x):
        # (Copies of w enter the products, so that eager autograd saves no tensor
        # the in-place write changes: eager is a valid reference.)
        h = torch.tanh(x @ w.clone())  # reads w whole
        h = h @ (w * 1.0).t()  # again
        w.mul_(0.5)  # writes it
        return (torch.sigmoid(h @ w.clone()) * (x @ (w + 0.0))).sum()  # reads after the write

    w_ref, x_ref = w0.clone(), x0.clone().requires_grad_()
    ref = torch.autograd.grad(program(w_ref, x_ref), x_ref)[0]
    w, x = w0.clone(), x0.clone().requires_grad_()
    if engine == "guard":
        with pytest.raises(tr.StateMutationError, match="guard"):
            tr.checkpoint(program, w, x, state=[w], engine=engine, use_reentrant=False)
        assert torch.equal(w, w0)
        return
    y = tr.checkpoint(program, w, x, state=[w], engine=engine, use_reentrant=False)
    y.backward()
    assert torch.equal(x.grad, ref)
    assert torch.equal(w, w_ref)
