"""tr.checkpoint inside torch.compile (Note [Checkpoint under torch.compile] in
torch_replay/_replay/compiled.py): captured graphs, graph breaks and gradients against
torch.utils.checkpoint on the same model; declared state, hidden buffers and
random numbers against eager PyTorch or an independent reference."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
import torch.utils.checkpoint as tcp
from torch._dynamo.testing import CompileCounterWithBackend

import torch_replay as tr
from benchmarks.lib.models import PreNormBlock, ResBlock

from .reference import assert_bitwise


class _Model(torch.nn.Module):
    def __init__(self, blocks, ck, reentrant):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.ck, self.reentrant = ck, reentrant

    def forward(self, x):
        for block in self.blocks:
            x = self.ck(block, x, use_reentrant=self.reentrant)
        return x.square().mean()


def _make(kind, ck, reentrant, blocks=6):
    torch.manual_seed(0)
    if kind == "transformer":
        return _Model([PreNormBlock() for _ in range(blocks)], ck, reentrant), torch.randn(2, 8, 32)
    return _Model([ResBlock() for _ in range(4)], ck, reentrant), torch.randn(2, 8, 8, 8)


def _compiled_step(kind, ck, reentrant, backend="aot_eager", blocks=6):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, x = _make(kind, ck, reentrant, blocks)
    x.requires_grad_(True)
    counter = CompileCounterWithBackend(backend)
    loss = torch.compile(model, backend=counter)(x)
    loss.backward()
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return counter, breaks, loss.detach(), grads, model


@pytest.mark.parametrize(
    "kind,reentrant", [("transformer", False), ("transformer", True), ("resnet", False)]
)
def test_capture_and_gradients_equal_torch_checkpoint(kind, reentrant):
    c_t, breaks_t, loss_t, g_t, m_t = _compiled_step(kind, tcp.checkpoint, reentrant)
    c_r, breaks_r, loss_r, g_r, m_r = _compiled_step(kind, tr.checkpoint, reentrant)
    assert c_t.frame_count == 1 and breaks_t == 0  # torch's own figure on this model
    assert (c_r.frame_count, c_r.op_count, breaks_r) == (c_t.frame_count, c_t.op_count, breaks_t)
    assert torch.equal(loss_r, loss_t)
    assert_bitwise(g_r, g_t)
    for b_r, b_t in zip(m_r.buffers(), m_t.buffers(), strict=True):
        assert torch.equal(b_r, b_t)  # batch-norm statistics updated once, as torch
    # and both are eager's gradient
    model, x = _make(kind, lambda f, x, **_: f(x), reentrant)
    x.requires_grad_(True)
    model(x).backward()
    for a, b in zip(g_r, [x.grad] + [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(a, b)


class _Shifted(torch.nn.Module):
    """Reads a buffer that the training loop updates between forward and backward."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("shift", torch.zeros(16))

    def forward(self, x):
        return torch.tanh(self.lin(x) + self.shift)


class _Stack(torch.nn.Module):
    def __init__(self, declare):
        super().__init__()
        torch.manual_seed(1)
        self.blocks = torch.nn.ModuleList([_Shifted() for _ in range(3)])
        for p in self.parameters():
            torch.nn.init.normal_(p)
        self.declare = declare

    def forward(self, x):
        for b in self.blocks:
            state = [b] if self.declare else None
            x = tr.checkpoint(b, x, use_reentrant=False, state=state)
        return x.sum()


@pytest.mark.parametrize("detect", ["preserve", "reads"])
def test_hidden_buffer_under_compile_declared_is_eager_undeclared_refused(detect, monkeypatch):
    """At every detect level, "preserve" included, an undeclared buffer
    inside a compiled segment is left to autograd, as torch leaves it (Note [Checkpoint
    under torch.compile])."""
    monkeypatch.setattr(tr.config, "detect", detect)
    x0 = torch.randn(4, 16)
    ref = _Stack(declare=False)  # eager reference: the forward that actually ran
    x_ref = x0.clone().requires_grad_(True)
    h = x_ref
    for b in ref.blocks:
        h = b(h)
    h.sum().backward()
    for declare in (True, False):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = _Stack(declare)
        counter = CompileCounterWithBackend("aot_eager")
        x = x0.clone().requires_grad_(True)
        loss = torch.compile(model, backend=counter)(x)
        assert counter.frame_count == 1
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
        with torch.no_grad():
            for b in model.blocks:
                b.shift.add_(1.0)  # an EMA / queue update before backward
        if declare:
            loss.backward()
            torch.testing.assert_close(x.grad, x_ref.grad)
            for b, r in zip(model.blocks, ref.blocks, strict=True):
                torch.testing.assert_close(b.lin.weight.grad, r.lin.weight.grad)
                assert torch.equal(b.shift, torch.ones(16))  # the user's update stays
        else:
            # AOTAutograd saved the live buffer: autograd refuses, never silently wrong
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()


def test_random_ops_replayed_under_memory_budget():
    """torch issue #190758: under activation_memory_budget < 1 Inductor's
    partitioner may redraw dropout in backward. The reference gradient is derived
    from the mask the forward actually used (visible in its output)."""
    w = torch.randn(64, 64)

    def seg(x):
        return F.dropout(torch.relu(x @ w) + 1.0, p=0.5, training=True)

    def f(x):
        h = tr.checkpoint(seg, x, use_reentrant=False)
        return h, (h * h).sum()

    torch._dynamo.reset()
    old = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = 0.5
    try:
        x = torch.randn(32, 64, requires_grad=True)
        h, loss = torch.compile(f, backend="inductor")(x)
        loss.backward()
    finally:
        functorch_config.activation_memory_budget = old
    mask = (h.detach() != 0).float()
    x2 = x.detach().requires_grad_(True)
    (mask * 2 * (torch.relu(x2 @ w) + 1)).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_random_ops_under_zero_budget_refused():
    """A budget of 0 ignores every checkpoint policy (torch issue #190758): a region
    that draws random numbers is refused by name instead of redrawn in backward."""

    def f(x):
        return tr.checkpoint(lambda x: F.dropout(x, p=0.5), x, use_reentrant=False).sum()

    torch._dynamo.reset()
    old = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = 0.0
    try:
        with pytest.raises(Exception, match="activation_memory_budget") as info:
            torch.compile(f, backend="aot_eager")(torch.randn(8, 8, requires_grad=True))
    finally:
        functorch_config.activation_memory_budget = old
        torch._dynamo.reset()
    chain = [info.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    assert any(isinstance(e, tr.UnsupportedReplayError) for e in chain) or (
        "UnsupportedReplayError" in str(info.value)
    )
    # torch < 2.13: torch.utils.checkpoint's non-reentrant forward that raised leaves its
    # saved-tensor hooks on until its generator is collected, and this traceback keeps it:
    # the next test's backward would re-run this region (torch_versions.md, torch 2.11).
    del info, chain
    gc.collect()


def test_compiled_block_inside_checkpoint_is_compiled():
    block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    for reentrant in (False, True):
        counts = []
        for ck in (tcp.checkpoint, tr.checkpoint):
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("aot_eager")
            x = torch.randn(4, 16, requires_grad=True)
            ck(torch.compile(block, backend=counter), x, use_reentrant=reentrant).sum().backward()
            counts.append(counter.frame_count)
        assert 1 <= counts[1] <= counts[0]  # torch: 1 (non-reentrant) or 2 (reentrant)


def test_compiled_batchnorm_block_inside_checkpoint_updates_statistics_once():
    """Inductor's kernels write the running statistics where no observer sees them;
    the segment is compiled as Dynamo's checkpoint region instead: one update, as
    eager, and eager's gradients (torch.utils.checkpoint updates them twice)."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh())
    eager = copy.deepcopy(block)
    x = torch.randn(16, 8, requires_grad=True)
    x2 = x.detach().requires_grad_(True)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    out = tr.checkpoint(torch.compile(block, backend=counter), x, use_reentrant=False)
    out.square().sum().backward()
    eager(x2).square().sum().backward()
    assert counter.frame_count == 1
    for a, b in zip(block.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(x.grad, x2.grad)
    for a, b in zip(block.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_observe_off_compiled_caller_custom_block():
    """Reported crash: observe=False, a compiled caller and a custom block raised
    CheckpointError (recomputed metadata) at backward."""
    with tr.config.patch(observe=False):
        torch._dynamo.reset()
        model, x = _make("transformer", tr.checkpoint, False)
        x.requires_grad_(True)
        torch.compile(model, backend="aot_eager")(x).backward()
        ref, x2 = _make("transformer", tcp.checkpoint, False)
        x2.requires_grad_(True)
        ref(x2).backward()
        torch.testing.assert_close(x.grad, x2.grad)


def test_torch_replay_backend_compiles_checkpointed_model():
    import inductor_pass  # noqa: F401  (registers backend="torch_replay")

    c_r, breaks_r, loss_r, g_r, _ = _compiled_step(
        "transformer", tr.checkpoint, False, "torch_replay", blocks=1
    )
    assert (c_r.frame_count, breaks_r) == (1, 0)
    model, x = _make("transformer", lambda f, x, **_: f(x), False, blocks=1)
    x.requires_grad_(True)
    loss = model(x)
    loss.backward()
    torch.testing.assert_close(loss_r, loss.detach())
    for a, b in zip(g_r, [x.grad] + [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(a, b)


def test_swapped_torch_checkpoint_under_compile(monkeypatch):
    """scripts/torch_checkpoint_tests.py swaps torch.utils.checkpoint.checkpoint for
    torch_replay's: under compile that must still reach torch's region, not recurse."""
    monkeypatch.setattr(tcp, "checkpoint", tr.checkpoint)
    block = _Shifted()
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    x = torch.randn(4, 16, requires_grad=True)
    fn = torch.compile(lambda x: tcp.checkpoint(block, x, use_reentrant=False), backend=counter)
    fn(x).sum().backward()
    assert counter.frame_count == 1
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    x2 = x.detach().requires_grad_(True)
    block(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_declared_tensor_no_module_owns_falls_back_eagerly_with_warning():
    """A declared tensor the region cannot take as an input: the eager segment runs
    behind a graph break (saying so), and the replay contract holds."""
    import torch_replay._replay.compiled as compiled

    compiled._warned.clear()
    queue = torch.randn(16)
    lin = torch.nn.Linear(16, 16)

    def seg(x):
        return torch.tanh(lin(x) * queue)

    torch._dynamo.reset()
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.warns(UserWarning, match="runs eagerly behind a graph break"):
        out = torch.compile(
            lambda x: tr.checkpoint(seg, x, use_reentrant=False, state=[queue]),
            backend="aot_eager",
        )(x)
    x2 = x.detach().requires_grad_(True)
    seg(x2).sum().backward()  # eager reference, before the queue changes
    queue.mul_(2.0)
    out.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=0)


def test_fullgraph_smoke():
    """fullgraph=True: a graph break anywhere in tr.checkpoint would raise."""
    torch._dynamo.reset()
    for declare in (False, True):
        model = _Stack(declare)
        x = torch.randn(4, 16, requires_grad=True)
        torch.compile(model, fullgraph=True, backend="aot_eager")(x).backward()
        x2 = x.detach().requires_grad_(True)
        ref = _Stack(False)
        h = x2
        for b in ref.blocks:
            h = b(h)
        h.sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
