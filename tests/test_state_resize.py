"""State that is empty or changes size inside a segment (Note [Storage-changing
writes] in csrc/aten/storage_reshape.h), quantization-aware training's observers
(Note [Integer writes] in csrc/aten/transaction.h), and tensors without strided
storage. The reference is eager PyTorch (the forward that ran once); torch's
checkpoint is shown wrong where it is, so the condition really is hidden."""

from __future__ import annotations

import copy
import gc
import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr

from .reference import ALL_ENGINES, ENGINES_WRITING, REENTRANT, BufferedLinear


class Histogram(BufferedLinear):
    """Grows its own buffer by one slot per call (a buffer that starts empty)."""

    def __init__(self):
        super().__init__(4, "hist", lambda: torch.zeros(0))

    def forward(self, x):
        n = self.hist.numel()
        self.hist.resize_(n + 1)
        self.hist[n] = float(n + 1)
        return self.lin(x) * self.hist.sum()


class Repoint(BufferedLinear):
    """Points its buffer at a new storage (set_) holding more values."""

    def __init__(self):
        super().__init__(4, "table", lambda: torch.ones(2))

    def forward(self, x):
        self.table.set_(torch.cat([self.table, self.table.sum().reshape(1)]))
        return self.lin(x) * self.table.sum()


def _eager_and_checkpointed(make, run_checkpoint, calls=1):
    """Runs eager and a checkpointed copy; returns (eager grads, eager buffers,
    ours grads, ours buffers)."""
    torch.manual_seed(0)
    eager = make()
    ours = copy.deepcopy(eager)
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(calls):
        eager(x).sum().backward()
        run_checkpoint(ours, x.detach().requires_grad_()).sum().backward()
    g_e = [p.grad.clone() for p in eager.parameters()]
    g_o = [p.grad.clone() for p in ours.parameters()]
    b_e = [b.clone() for b in eager.buffers()]
    b_o = [b.clone() for b in ours.buffers()]
    return g_e, b_e, g_o, b_o


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape and torch.equal(x, y), (x, y)


@pytest.mark.parametrize("module", [Histogram, Repoint])
def test_torch_checkpoint_repeats_a_storage_changing_write(module):
    g_e, b_e, g_t, b_t = _eager_and_checkpointed(
        module, lambda m, x: tcp.checkpoint(m, x, use_reentrant=False)
    )
    assert any(x.shape != y.shape for x, y in zip(b_e, b_t, strict=True))


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("module", [Histogram, Repoint])
def test_undeclared_storage_changing_write_happens_once(observer, module, reentrant):
    g_e, b_e, g_o, b_o = _eager_and_checkpointed(
        module, lambda m, x: tr.checkpoint(m, x, use_reentrant=reentrant), calls=2
    )
    _assert_same(g_e, g_o)
    _assert_same(b_e, b_o)


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("engine", ENGINES_WRITING)
@pytest.mark.parametrize("module", [Histogram, Repoint])
def test_declared_state_may_start_empty_and_change_size(observer, module, engine, reentrant):
    g_e, b_e, g_o, b_o = _eager_and_checkpointed(
        module,
        lambda m, x: tr.checkpoint(m, x, use_reentrant=reentrant, state=[m], engine=engine),
        calls=2,
    )
    _assert_same(g_e, g_o)
    _assert_same(b_e, b_o)


def test_preserve_handles_a_storage_changing_write(observer):
    with tr.config.patch(detect="preserve"):
        g_e, b_e, g_o, b_o = _eager_and_checkpointed(
            Histogram, lambda m, x: tr.checkpoint(m, x, use_reentrant=False), calls=2
        )
    _assert_same(g_e, g_o)
    _assert_same(b_e, b_o)


def test_resized_state_changed_before_backward_is_put_back():
    """The buffer grows again outside the segment before backward: the re-run still
    starts from the forward's (empty) state, and the live buffer is left as it was."""
    torch.manual_seed(0)
    m = Histogram()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 4, requires_grad=True)
    ref(x).sum().backward()
    y = tr.checkpoint(m, x.detach().requires_grad_(), use_reentrant=False, state=[m])
    with torch.no_grad():
        m.hist.resize_(5).fill_(7.0)
    y.sum().backward()
    _assert_same([p.grad for p in ref.parameters()], [p.grad for p in m.parameters()])
    assert m.hist.tolist() == [7.0] * 5


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_declared_empty_buffer_is_accepted(engine):
    m = nn.Linear(4, 4)
    m.register_buffer("min_val", torch.tensor([]))
    x = torch.randn(2, 4, requires_grad=True)
    tr.checkpoint(m, x, use_reentrant=False, state=[m], engine=engine).sum().backward()
    ref = torch.autograd.grad(m(x).sum(), [m.weight])[0]
    assert torch.equal(m.weight.grad, ref)


# ------------------------------------------------------ quantization-aware training

QCONFIGS = {
    "fused-per-channel": lambda q: q.get_default_qat_qconfig("x86"),
    "fused-per-tensor": lambda q: q.default_qat_qconfig_v2,
    "unfused-per-tensor": lambda q: q.default_qat_qconfig,
    "unfused-per-channel": lambda q: q.default_per_channel_symmetric_qnnpack_qat_qconfig,
}


def _qat_model(kind):
    import torch.ao.quantization as tq

    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    m.train()
    m.qconfig = QCONFIGS[kind](tq)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tq.prepare_qat(m, inplace=True)
    return m


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("kind", sorted(QCONFIGS))
def test_qat_observers_checkpoint_like_eager(observer, kind, declared, reentrant):
    """Two training steps: every gradient and every observer buffer (min/max, scale,
    zero point) equal eager's; no gradient flows into the integer zero point."""
    torch.manual_seed(0)
    eager = _qat_model(kind)
    ours = copy.deepcopy(eager)
    opts = {"state": [ours]} if declared else {}
    for step in range(2):
        x = torch.randn(4, 8)
        eager(x).sum().backward()
        y = tr.checkpoint(ours, x.requires_grad_(), use_reentrant=reentrant, **opts)
        y.sum().backward()
        for (name, a), b in zip(eager.named_buffers(), ours.buffers(), strict=True):
            assert a.shape == b.shape and torch.equal(a, b), (step, name)
        for (name, p), q in zip(eager.named_parameters(), ours.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), (step, name)


def test_float_gradient_into_a_returned_integer_write_is_still_refused():
    ibuf = torch.zeros(4, dtype=torch.int32)
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(tr.UnsupportedReplayError, match="integer"):
        tr.checkpoint(lambda a: a * ibuf.copy_(a * 10), x, state=[ibuf], use_reentrant=False)
    assert torch.equal(ibuf, torch.zeros(4, dtype=torch.int32))


# ------------------------------------------------------------ non-strided tensors


def _csr():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (sparse CSR is a beta feature)
        return torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0], [0.0, 0.0, 4.0]]).to_sparse_csr()


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_segment_reading_a_sparse_tensor_runs_as_torch(observer, reentrant):
    a = _csr()
    x = torch.randn(3, 2, requires_grad=True)

    def fn(t):
        return torch.sparse.mm(a, t, "sum").tanh()

    tcp.checkpoint(fn, x, use_reentrant=reentrant).sum().backward()
    ref, x.grad = x.grad, None
    tr.checkpoint(fn, x, use_reentrant=reentrant).sum().backward()
    assert torch.equal(x.grad, ref)


def test_declared_sparse_tensor_is_a_named_refusal():
    a = _csr()
    x = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(tr.UnsupportedReplayError, match="SparseCsr.*values and indices"):
        tr.checkpoint(lambda t: torch.sparse.mm(a, t), x, state=[a], use_reentrant=False)


# --------------------------------------------- preserve: one module, several calls


def _gan_discriminator():
    sn = nn.utils.spectral_norm
    return nn.Sequential(sn(nn.Linear(4, 8)), nn.ReLU(), sn(nn.Linear(8, 1)))


@pytest.mark.parametrize("calls", [1, 2, 3])
def test_preserve_spectral_norm_called_several_times_before_one_backward(observer, calls):
    """The GAN step: a spectral-norm discriminator on fake and real batches, one
    backward. Each forward updates the power-iteration vectors in place (out=), and
    reads them after its own write; detect="preserve" gives eager's gradients and
    vectors, and claims no dispatcher bypass."""
    torch.manual_seed(0)
    eager = _gan_discriminator()
    ours = copy.deepcopy(eager)
    batches = [torch.randn(3, 4, requires_grad=(i == 0)) for i in range(calls)]
    sum(eager(b).mean() * (i + 1) for i, b in enumerate(batches)).backward()
    with tr.config.patch(detect="preserve"):
        loss = sum(
            tr.checkpoint(ours, b, use_reentrant=False).mean() * (i + 1)
            for i, b in enumerate(batches)
        )
        loss.backward()
    for p, q in zip(eager.parameters(), ours.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    for a, b in zip(eager.buffers(), ours.buffers(), strict=True):
        assert torch.equal(a, b)
    # spectral_norm keeps the computed weight (and so the graph, its segments and
    # their journal pins) on the module until its next forward, as in eager, through
    # a cycle Python's gc cannot see: a forward without grad replaces it.
    with torch.no_grad():
        ours.eval()(batches[0])
    del ours, loss
    gc.collect()


def _coo():
    return torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0], [0.0, 0.0, 4.0]]).to_sparse()


def _sparse_mm_with_reference(a):
    """``fn(t) = sparse.mm(a, t) ** 2``, an input ``x`` and the eager gradient of
    ``fn(x).sum()`` with ``a`` as it is now (the reference; ``x.grad`` is reset)."""
    x = torch.randn(3, 2, requires_grad=True)

    def fn(t):
        return torch.sparse.mm(a, t) ** 2

    fn(x).sum().backward()
    ref, x.grad = x.grad, None
    return fn, x, ref


@pytest.mark.detect("reads")  # what the refusing level says
@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("make", [_csr, _coo], ids=["csr", "coo"])
def test_sparse_tensor_changed_through_its_values_is_refused(observer, make, reentrant):
    """Note [Sparse tensors]: ``a.values()`` has a version counter of its own, so only
    the parts' bytes show the change; torch's checkpoint is silently wrong here."""
    a = make()
    fn, x, ref = _sparse_mm_with_reference(a)
    y = tcp.checkpoint(fn, x, use_reentrant=reentrant)
    with torch.no_grad():
        a.values().mul_(2)
    y.sum().backward()
    assert not torch.equal(x.grad, ref)  # torch: wrong, silently
    with torch.no_grad():
        a.values().div_(2)
    x.grad = None
    y = tr.checkpoint(fn, x, use_reentrant=reentrant)
    with torch.no_grad():
        a.values().mul_(2)
    with pytest.raises(tr.StateMutationError, match="sparse"):
        y.sum().backward()


def test_preserve_keeps_a_sparse_tensor_read(observer):
    a = _csr()
    fn, x, ref = _sparse_mm_with_reference(a)
    with tr.config.patch(detect="preserve"):
        y = tr.checkpoint(fn, x, use_reentrant=False)
        with torch.no_grad():
            a.values().mul_(2)
        y.sum().backward()
    assert torch.equal(x.grad, ref)
    assert torch.equal(a.values(), torch.tensor([4.0, 2.0, 6.0, 8.0]))


def test_write_to_a_pre_existing_sparse_tensor_is_refused(observer):
    a = _coo()
    before = a.to_dense()
    x = torch.randn(3, 3, requires_grad=True)

    def fn(t):
        a.mul_(2.0)
        return t * a.to_dense()

    with pytest.raises(tr.UnsupportedReplayError, match="sparse write"):
        tr.checkpoint(fn, x, use_reentrant=False)
    assert torch.equal(a.to_dense(), before)


def test_sparse_tensor_made_inside_the_segment_runs_as_torch(observer):
    x = torch.randn(3, 3, requires_grad=True)

    def fn(t):
        s = (t * (t > 0)).to_sparse()
        return torch.sparse.mm(s, t).sum(0)

    tcp.checkpoint(fn, x, use_reentrant=False).sum().backward()
    ref, x.grad = x.grad, None
    tr.checkpoint(fn, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, ref)
