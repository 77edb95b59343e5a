"""The replay engines, the byte device and generator preservation on every device.

Each test runs on ``DEVICES`` (``cpu``, plus ``cuda`` where a GPU exists), so the
CUDA byte device (``csrc/aten/cuda/cuda_byte_device.cpp``), the CUDA generator
states and the CUDA branch of the Inductor guard are exercised by the same
assertions that pass on CPU. Hidden-state tests compare against eager PyTorch (the
gradient of the forward that actually ran) and require the live state after
backward to equal the state before it, byte for byte.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_replay as tr

from .conftest import DEVICES
from .reference import ShiftBlock, assert_bitwise, grads, storage_bytes

ENGINES = ["auto", "snapshot", "readset", "journal"]


def gen_state(device: str, g: torch.Generator | None = None) -> bytes:
    if g is not None:
        return bytes(g.get_state().numpy())
    if device == "cuda":
        return bytes(torch.cuda.get_rng_state().numpy())
    return bytes(torch.get_rng_state().numpy())


def assert_eager_and_put_back(program):
    """``program(ours)`` returns (gradients, state before backward, state after): with
    tr.checkpoint the gradients are eager's bit for bit and the backward leaves the state
    as it found it."""
    ref, _, _ = program(False)
    ours, before, after = program(True)
    assert_bitwise(ours, ref)
    assert before == after


def linear_step(seg, x, lin, ours, *, moved, read, **checkpoint_kw):
    """One step of a program for :func:`assert_eager_and_put_back`: ``seg(x)`` through
    tr.checkpoint (``ours``) or eagerly, then ``moved()`` changes the state between forward
    and backward; ``read()`` is that state before and after the backward."""
    y = tr.checkpoint(seg, x, **checkpoint_kw) if ours else seg(x)
    moved()
    before = read()
    y.pow(2).sum().backward()
    return grads(x, lin.weight), before, read()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("reentrant", [False, True])
def test_mutated_buffer_replays_the_forward_state(device, engine, reentrant):
    def program(ours):
        torch.manual_seed(0)
        m = ShiftBlock().to(device)
        x = torch.randn(4, 8, device=device, requires_grad=True)
        if ours:
            y = tr.checkpoint(m, x, state=[m], engine=engine, use_reentrant=reentrant)
            assert tr.last_transaction().engine in (engine, "journal", "guard")  # auto: either
        else:
            y = m(x)
        m.shift.mul_(-3.0)  # an EMA-style update between forward and backward
        before = storage_bytes(m.shift)
        y.pow(2).sum().backward()
        return grads(x, m.lin.weight), before, storage_bytes(m.shift)

    assert_eager_and_put_back(program)


@pytest.mark.parametrize("device", DEVICES)
def test_journal_keeps_only_written_rows_on_device(device):
    torch.manual_seed(0)
    enc = nn.Linear(8, 8).to(device)
    queue = torch.randn(64, 8, device=device)
    x = torch.randn(4, 8, device=device, requires_grad=True)

    def seg(inp, step, reference=False):
        bank = queue.clone() if reference else queue  # eager autograd saves the bank
        logits = enc(inp) @ bank.t()
        with torch.no_grad():
            queue[step] = inp.detach()[0]
        return torch.log_softmax(logits, dim=-1)

    ref_queue = queue.clone()
    ys, txns = [], []
    for step in range(3):
        ys.append(tr.checkpoint(seg, x, step, state=[queue], engine="journal", use_reentrant=False))
        txns.append(tr.last_transaction())
    row = 8 * 4
    assert [t.retained_bytes for t in txns] == [3 * row, 2 * row, row]
    before = storage_bytes(queue)
    sum(y.sum() for y in ys).backward()
    assert storage_bytes(queue) == before
    # Reference: the same three segments run eagerly from the same start.
    queue.copy_(ref_queue)
    got = x.grad.clone()
    x.grad = None
    sum(seg(x, step, True).sum() for step in range(3)).backward()
    assert_bitwise([got], [x.grad])


@pytest.mark.parametrize("device", DEVICES)
def test_explicit_device_generator_is_preserved(device):
    def program(ours):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8).to(device)
        g = torch.Generator(device=device).manual_seed(123)
        x = torch.randn(4, 8, device=device, requires_grad=True)

        def seg(inp):
            noise = torch.rand(inp.shape, generator=g, device=device)
            return torch.tanh(lin(inp) * noise)

        return linear_step(
            seg,
            x,
            lin,
            ours,
            state=[g],
            use_reentrant=False,
            moved=lambda: torch.rand(3, generator=g, device=device),  # later draws
            read=lambda: gen_state(device, g),
        )

    assert_eager_and_put_back(program)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reentrant", [False, True])
def test_default_device_generator_dropout(device, reentrant):
    def program(ours):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8).to(device)
        x = torch.randn(16, 8, device=device, requires_grad=True)
        seg = lambda inp: nn.functional.dropout(torch.tanh(lin(inp)), 0.5)  # noqa: E731
        return linear_step(
            seg,
            x,
            lin,
            ours,
            use_reentrant=reentrant,
            moved=lambda: torch.rand(5, device=device),  # the default generator moves on
            read=lambda: gen_state(device),
        )

    assert_eager_and_put_back(program)


@pytest.mark.parametrize("device", DEVICES)
def test_rng_mismatch_is_detected_on_device(device):
    with tr.config.patch(detect="saved"):  # let the hidden counter through to the RNG check
        n = torch.tensor([3])
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(3, device=device, requires_grad=True)

        def seg(a):
            extra = torch.rand(int(n.item()) * 1024, generator=g, device=device)
            return a * extra[:3]

        y = tr.checkpoint(seg, x, state=[g], use_reentrant=False)
        n.fill_(7)
        before = gen_state(device, g)
        with pytest.raises(tr.RngMismatchError):
            y.sum().backward()
        assert gen_state(device, g) == before


@pytest.mark.parametrize("device", DEVICES)
def test_typed_alias_on_device(device):
    def program(ours):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8).to(device)
        w = torch.randn(8, device=device)
        w_bits = w.view(torch.int32)
        x = torch.randn(4, 8, device=device, requires_grad=True)
        seg = lambda inp: torch.tanh(lin(inp) + w)  # noqa: E731

        def flip():  # a mantissa bit, through the integer view
            w_bits[::2] ^= 0x00400000

        return linear_step(
            seg,
            x,
            lin,
            ours,
            state=[w_bits],
            use_reentrant=False,
            moved=flip,
            read=lambda: storage_bytes(w),
        )

    assert_eager_and_put_back(program)


@pytest.mark.parametrize("device", DEVICES)
def test_retain_graph_repeated_backward_on_device(device):
    torch.manual_seed(0)
    m = ShiftBlock().to(device)
    g = torch.Generator(device=device).manual_seed(9)
    x = torch.randn(4, 8, device=device, requires_grad=True)

    def seg(inp):
        return m(inp) * torch.rand(inp.shape, generator=g, device=device)

    y = tr.checkpoint(seg, x, state=[m, g], engine="snapshot", use_reentrant=False)
    m.shift.add_(5.0)
    before = (storage_bytes(m.shift), gen_state(device, g), gen_state(device))
    results = []
    for _ in range(3):
        x.grad = None
        y.sum().backward(retain_graph=True)
        results.append(x.grad.clone())
        assert (storage_bytes(m.shift), gen_state(device, g), gen_state(device)) == before
    assert_bitwise(results[1:], results[:-1])


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_guard_reports_per_device(device):
    import inductor_pass  # here only: the other tests of this file run without the pass
    from tests.inductor_support import Branchy

    torch.manual_seed(0)
    model = Branchy().to(device)
    x = torch.randn(32, 64, device=device)
    torch._dynamo.reset()
    inductor_pass.clear_reports()
    with torch.no_grad():
        ref = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        got = torch.compile(model, backend="torch_replay")(x)
    assert torch.equal(ref, got)
    (r,) = inductor_pass.reports()
    assert r.device == device, r.reason
    assert r.modelled_original_peak is not None, r.reason
    if device == "cuda":  # the CUDA guard: measured peaks and CUPTI kernel times
        assert r.byte_exact is None and r.measured_original_peak > 0
        assert r.kernel_seconds["source"] == "cupti", r.notes
        assert r.kernel_seconds["original"] > 0 and r.kernel_seconds["kernels"] >= 1
    else:
        assert r.byte_exact and r.kernel_seconds == {}
