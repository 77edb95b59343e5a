"""tr.checkpoint_wrapper / tr.apply_activation_checkpointing: torch's CheckpointWrapper
with tr.checkpoint inside. References: torch's own wrapper where torch is right
(bitwise: outputs, every gradient, buffers), eager PyTorch where it is wrong (BatchNorm
updated twice, a buffer changed before backward). Alone, under FSDP2 fully_shard with two
gloo processes, and under torch.compile."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as torch_apply,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper as torch_wrapper,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import torch_replay as tr
from tests.reference import assert_bitwise
from tests.test_distributed import _spawn


class Block(nn.Module):
    def __init__(self, norm: bool = False):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.norm = nn.BatchNorm1d(32) if norm else nn.Identity()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, scale=None):
        h = self.drop(torch.nn.functional.gelu(self.norm(self.lin1(x))))
        out = x + self.lin2(h)
        return out if scale is None else out * scale


class ScaledBlock(nn.Module):
    """Reads a buffer that the training loop changes between forward and backward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("gain", torch.full((16,), 0.5))

    def forward(self, x):
        return torch.tanh(self.lin(x) * self.gain)


def _model(norm=False, blocks=3):
    torch.manual_seed(0)
    return nn.Sequential(*[Block(norm) for _ in range(blocks)])


def _step(model, x, kwargs=None, between=None):
    """One forward and backward (seeded); returns output, every gradient, every buffer."""
    torch.manual_seed(1)
    x = x.clone().requires_grad_(True)
    out = model(x) if kwargs is None else x
    for block in model if kwargs is not None else ():
        out = block(out, **kwargs)
    if between is not None:
        between(model)
    out.pow(2).mean().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return out.detach(), grads, [b.clone() for b in model.buffers()]


def _wrap_each(model, wrap):
    for i in range(len(model)):
        model[i] = wrap(model[i])
    return model


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("kwargs", [None, {"scale": 2.0}], ids=["args", "kwargs"])
def test_bitwise_torch_wrapper_on_a_pure_model(reentrant, kwargs):
    x = torch.randn(8, 16)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    ref = _wrap_each(_model(), functools.partial(torch_wrapper, checkpoint_impl=impl))
    ours = _wrap_each(_model(), functools.partial(tr.checkpoint_wrapper, use_reentrant=reentrant))
    o_t, g_t, _ = _step(ref, x, kwargs)
    o_r, g_r, _ = _step(ours, x, kwargs)
    assert torch.equal(o_r, o_t)
    assert_bitwise(g_r, g_t)


def test_is_torchs_wrapper_with_torchs_state_dict_keys():
    plain, ref, ours = _model(), _model(), _model()
    torch_apply(ref, check_fn=lambda m: isinstance(m, Block))
    tr.apply_activation_checkpointing(ours, check_fn=lambda m: isinstance(m, Block))
    assert all(isinstance(b, CheckpointWrapper) for b in ours)
    assert type(ours[0]).__name__ == "ReplayCheckpointWrapper"
    assert list(ours.state_dict()) == list(ref.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in ours[0].named_parameters()] == [n for n, _ in plain[0].named_parameters()]
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(1.0)
    ours.load_state_dict(plain.state_dict())  # an unwrapped model's keys load
    for a, b in zip(ours.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    assert ours[0].lin1 is ours[0]._checkpoint_wrapped_module.lin1  # attributes forward


def test_auto_wrap_policy_selects_as_torchs():
    ref, ours = _model(), _model()
    torch_apply(ref, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    tr.apply_activation_checkpointing(ours, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    wrapped = lambda m: [n for n, s in m.named_modules() if isinstance(s, CheckpointWrapper)]  # noqa: E731
    assert wrapped(ours) == wrapped(ref) and len(wrapped(ours)) == 6


@pytest.mark.parametrize("reentrant", [False, True])
def test_batchnorm_gives_eagers_gradients_and_statistics(reentrant):
    x = torch.randn(8, 16)
    o_e, g_e, b_e = _step(_model(norm=True), x)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    _, _, b_t = _step(
        _wrap_each(_model(True), functools.partial(torch_wrapper, checkpoint_impl=impl)), x
    )
    o_r, g_r, b_r = _step(
        _wrap_each(_model(True), functools.partial(tr.checkpoint_wrapper, use_reentrant=reentrant)),
        x,
    )
    assert not all(torch.equal(a, b) for a, b in zip(b_t, b_e, strict=True))  # torch: twice
    assert torch.equal(o_r, o_e)
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)


def _bump_gain(model):
    with torch.no_grad():
        for block in model.modules():
            if isinstance(block, ScaledBlock):
                block.gain.mul_(3.0)


def _scaled(wrap=None):
    torch.manual_seed(0)
    model = nn.Sequential(ScaledBlock(), ScaledBlock())
    return model if wrap is None else _wrap_each(model, wrap)


def test_buffer_changed_before_backward_declared_module_is_eager():
    x = torch.randn(4, 16)
    eager = _scaled()
    _, g_e, _ = _step(eager, x)  # eager's backward uses the forward-time gain
    _bump_gain(eager)
    _, g_t, _ = _step(_scaled(torch_wrapper), x, between=_bump_gain)
    _, g_r, _ = _step(_scaled(tr.checkpoint_wrapper), x, between=_bump_gain)
    _, g_l, _ = _step(
        _scaled(lambda m: tr.checkpoint_wrapper(m, replay_state=[m.gain])), x, between=_bump_gain
    )
    assert not torch.equal(g_t[0], g_e[0])  # torch re-runs with the new gain
    assert_bitwise(g_r, g_e)
    assert_bitwise(g_l, g_e)  # a list declares what it lists


@pytest.mark.parametrize("detect", ["reads", "preserve"])
def test_replay_state_none_declares_nothing(detect, monkeypatch):
    """Undeclared and changed: refused under detect="reads", preserved
    (eager's gradient) under "preserve"."""
    monkeypatch.setattr(tr.config, "detect", detect)
    x = torch.randn(4, 16)
    model = _scaled(lambda m: tr.checkpoint_wrapper(m, replay_state=None))
    if detect == "reads":
        with pytest.raises(tr.StateMutationError, match="gain"):
            _step(model, x, between=_bump_gain)
    else:
        _, g_e, _ = _step(_scaled(), x)  # eager: the forward-time gain
        _, g_r, _ = _step(model, x, between=_bump_gain)
        assert_bitwise(g_r, g_e)
    tr.apply_activation_checkpointing(model2 := _scaled(), replay_state=None)
    assert model2[0].checkpoint_fn.keywords["replay_state"] is None


def test_bad_keywords_refused_before_wrapping():
    model = _model()
    with pytest.raises(TypeError, match="replay_state="):
        tr.apply_activation_checkpointing(model, state=[model])
    with pytest.raises(TypeError, match="use_reentrant="):
        tr.checkpoint_wrapper(model[0], checkpoint_impl=CheckpointImpl.REENTRANT)
    with pytest.raises(ValueError, match="'module'"):
        tr.apply_activation_checkpointing(model, replay_state="layer")
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())


# ------------------------------------------------------------------ nested wrappers


def _torch_wrap_after_ours(select):
    """tr's recipe, then torch's apply_activation_checkpointing as accelerate's FSDP2
    plugin applies it (``preserve_rng_state=False``) on the modules ``select`` picks
    (Note [Nested wrappers] in torch_replay/wrapper.py)."""
    model = _model(norm=True)
    tr.apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    wrap = functools.partial(torch_wrapper, preserve_rng_state=False)
    torch_apply(model, checkpoint_wrapper_fn=wrap, check_fn=select)
    return model


def test_torch_wrapper_inside_ours_is_disarmed_with_a_warning():
    """torch's wrapper inside ours (accelerate's transformer policy): ours wins, eager's
    gradients and statistics, and the user is told once what to turn off."""
    x = torch.randn(8, 16)
    o_e, g_e, b_e = _step(_model(norm=True), x)
    model = _torch_wrap_after_ours(lambda m: isinstance(m, Block))
    inner = model[0]._checkpoint_wrapped_module
    assert type(inner) is CheckpointWrapper and isinstance(inner._checkpoint_wrapped_module, Block)
    with pytest.warns(UserWarning, match="activation_checkpointing=False") as seen:
        o_r, g_r, b_r = _step(model, x)
    assert sum("torch_replay" in str(w.message) for w in seen) == len(model)  # once each
    assert torch.equal(o_r, o_e)
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)
    # torch's own wrapper alone, in the same place, updates the statistics twice
    torch_only = _model(norm=True)
    torch_apply(torch_only, checkpoint_wrapper_fn=functools.partial(torch_wrapper))
    assert not all(torch.equal(a, b) for a, b in zip(_step(torch_only, x)[2], b_e, strict=True))


def test_ours_inside_torch_checkpoint_is_refused_before_any_write():
    """torch's wrapper around ours (accelerate's size-based policy): torch's re-run would
    run our segment again, so the first forward refuses, naming what to turn off."""
    model = _torch_wrap_after_ours(lambda m: type(m).__name__ == "ReplayCheckpointWrapper")
    assert type(model[0]) is CheckpointWrapper
    before = [b.clone() for b in model.buffers()]
    with pytest.raises(tr.UnsupportedReplayError, match="activation_checkpointing=False"):
        model(torch.randn(8, 16, requires_grad=True))
    assert_bitwise([b.clone() for b in model.buffers()], before)


# ------------------------------------------------------------------ torch.compile


def _compiled(wrap, norm):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = _model(norm)
    if wrap is not None:
        _wrap_each(model, wrap)
    counter = CompileCounterWithBackend("aot_eager")
    out, grads, buffers = _step(torch.compile(model, backend=counter), torch.randn(8, 16))
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    return (counter.frame_count, breaks), out, grads, buffers


def test_compiled_wrapped_model_graphs_and_gradients_as_torchs():
    counts_t, o_t, g_t, _ = _compiled(torch_wrapper, norm=False)
    counts_r, o_r, g_r, _ = _compiled(tr.checkpoint_wrapper, norm=False)
    assert counts_t == (1, 0)  # torch's own figure on this model
    assert counts_r == counts_t
    assert torch.equal(o_r, o_t)
    assert_bitwise(g_r, g_t)


def test_compiled_wrapped_batchnorm_model_is_eagers():
    """Under torch.compile torch's checkpoint region updates the statistics once
    (functionalized), so there torch is right and both are eager's."""
    _, o_e, g_e, b_e = _compiled(None, norm=True)
    counts_t, _, g_t, b_t = _compiled(torch_wrapper, norm=True)
    counts_r, o_r, g_r, b_r = _compiled(tr.checkpoint_wrapper, norm=True)
    assert counts_r == counts_t
    assert_bitwise(g_r, g_t)
    assert_bitwise(b_r, b_t)
    assert torch.equal(o_r, o_e)
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)


# ------------------------------------------------------------------ FSDP2, two processes


def _fsdp_wrapper_run(which: str, norm: bool, rank: int):
    from torch.distributed.fsdp import fully_shard

    model = _model(norm)
    if which == "torch":
        torch_apply(model, check_fn=lambda m: isinstance(m, Block))
    elif which == "tr":
        tr.apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    for block in model:
        fully_shard(block)  # after wrapping, as torchtitan does
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    grads = []
    for step in range(3):
        torch.manual_seed(step)
        h = torch.randn(8, 16, generator=gen)
        for block in model:
            h = block(h)
        h.pow(2).mean().backward()
        grads.append([p.grad.to_local().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads, [b.clone() for b in model.buffers()]


def _fsdp_wrapper_job(rank):
    return {
        (which, norm): _fsdp_wrapper_run(which, norm, rank)
        for norm in (False, True)
        for which in ("eager", "torch", "tr")
    }


def test_fsdp2_two_processes_torch_where_right_eager_where_wrong():
    for res in _spawn(_fsdp_wrapper_job):
        # Dropout, no state: bitwise torch's wrapper.
        (g_t, _), (g_r, _) = res[("torch", False)], res[("tr", False)]
        for a, b in zip(g_t, g_r, strict=True):
            assert_bitwise(b, a)
        # BatchNorm: eager's gradients and statistics; torch's wrapper updates twice.
        (g_e, b_e), (_, b_t), (g_r, b_r) = (res[(w, True)] for w in ("eager", "torch", "tr"))
        assert not all(torch.equal(a, b) for a, b in zip(b_t, b_e, strict=True))
        for a, b in zip(g_e, g_r, strict=True):
            assert_bitwise(b, a)
        assert_bitwise(b_r, b_e)
