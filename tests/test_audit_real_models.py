"""torch_replay.audit on real models: layers whose forward takes ``**kwargs`` (as every
Hugging Face layer), the printed ``write:`` line executed as printed, spectral norm's
wrong gradient measured against eager, the fused QAT observers judged as
torch_replay.checkpoint judges them, and the model left exactly as it was. Every figure
is checked against eager PyTorch or torch's own checkpoint computed here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from torch_replay.audit import audit

from .hf_tiny import tiny_causal_lm
from .reference import assert_bitwise, grads


def _state(model):
    return {k: (v.clone(), v._version) for k, v in model.state_dict(keep_vars=True).items()}


def _assert_untouched(model, before):
    for k, v in model.state_dict(keep_vars=True).items():
        assert v.shape == before[k][0].shape and torch.equal(v, before[k][0]), k
        assert v._version == before[k][1], k
    assert all(p.grad is None for p in model.parameters())


class Layer(nn.Module):
    """A layer as Hugging Face writes them: options arrive as keywords, ``**kwargs``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, hidden_states, scale=1.0, **kwargs):
        with torch.no_grad():
            self.ema.mul_(0.9).add_(hidden_states.mean(0))
        return torch.tanh(self.lin(hidden_states)) * scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=2.0)
        return x


def test_kwargs_layers_are_probed_and_the_printed_line_runs():
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(4, 8, requires_grad=True)
    before = _state(model)
    eager = copy.deepcopy(model)
    r = audit(model, x)
    _assert_untouched(model, before)
    s = r["layers.0"]
    assert s.auto_engine == "journal" and s.torch_replay_error is None
    line = s.code()
    assert line == (
        "tr.checkpoint(model.layers[0], x, use_reentrant=False, "
        "replay_state=[model.layers[0].ema], **kwargs)"
    )
    assert f"write: {line}" in str(r)
    # The line as printed: eager's output, gradient and one update of the buffer.
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    y = eval(line, {"tr": tr, "model": model, "x": xa, "kwargs": {"scale": 2.0}})
    ref = eager.layers[0](xb, scale=2.0)
    y.sum().backward()
    ref.sum().backward()
    assert_bitwise(
        [y.detach(), *grads(xa, *model.layers[0].parameters())],
        [ref.detach(), *grads(xb, *eager.layers[0].parameters())],
    )
    assert torch.equal(model.layers[0].ema, eager.layers[0].ema)


def _spectral(api):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    lin = (
        nn.utils.spectral_norm(lin)
        if api == "hook"
        else nn.utils.parametrizations.spectral_norm(lin)
    )
    return nn.Sequential(lin, nn.LeakyReLU(0.2), nn.Linear(8, 1)).train()


@pytest.mark.parametrize("api", ["hook", "parametrizations"])
def test_spectral_norm_is_a_measured_wrong_gradient(api):
    model = _spectral(api)
    x = torch.randn(4, 8, requires_grad=True)
    before = _state(model)
    attribute = vars(model[0]).get("weight")  # the hook API's computed weight
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    held = tr.engine_bytes()
    r = audit(model, x)
    _assert_untouched(model, before)
    # No forward of the audit's stays on the module, nor its transaction in the engines.
    assert vars(model[0]).get("weight") is attribute and tr.engine_bytes() == held
    s = r["0"]
    assert any(m.startswith("double update") for m in s.reasons)
    assert any(m.startswith("wrong gradient") for m in s.reasons), s.reasons
    assert not s.torch_checkpoint_exact and s.torch_replay_error is None
    # Independent: the segment alone under eager and under torch's checkpoint.
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    a[0](xa).sum().backward()
    tcp.checkpoint(b[0], xb, use_reentrant=False).sum().backward()
    want = max(
        float((g - e).abs().max())
        for g, e in zip(grads(xb, *b[0].parameters()), grads(xa, *a[0].parameters()), strict=True)
    )
    assert want > 0 and s.torch_checkpoint_grad_error == pytest.approx(want, rel=1e-9)
    assert s.torch_replay_grad_error == 0.0
    assert f"{want:.2e}" in str(r)


def _fused_qat():
    q = torch.ao.quantization
    torch.manual_seed(0)
    model = nn.Sequential(q.QuantStub(), nn.Linear(8, 8), nn.ReLU(), q.DeQuantStub()).train()
    model.qconfig = q.get_default_qat_qconfig("x86")  # FusedMovingAvgObsFakeQuantize
    return q.prepare_qat(model)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_fused_qat_verdict_is_the_checkpoints():
    model = _fused_qat()
    x = torch.randn(4, 8, requires_grad=True)
    before = _state(model)  # per-channel observers hold empty buffers: restored empty
    probe_copy = copy.deepcopy(model)
    r = audit(model, x)
    _assert_untouched(model, before)
    for s in r.segments:
        # No gradient flows into zero_point: no claim of a float gradient through it.
        assert not any("integer" in m for m in s.reasons), (s.name, s.reasons)
    # What the audit says torch_replay does is what torch_replay.checkpoint does.
    s = r["0"]
    try:
        tr.checkpoint(
            probe_copy[0],
            x.detach().clone().requires_grad_(),
            use_reentrant=False,
            state=[probe_copy[0]],
        ).sum().backward()
        refused = None
    except tr.ReplayError as exc:
        refused = type(exc).__name__
    if refused is None:
        assert s.torch_replay_error is None, s.torch_replay_error
    else:
        assert s.torch_replay_error.startswith(refused)


def test_hugging_face_llama_layers():
    model = tiny_causal_lm("Llama", num_key_value_heads=1, use_cache=False)
    ids = torch.randint(0, 32, (2, 6))
    seen = {}

    def keep(mod, args, kwargs):  # what the layer is called with, to run the printed line
        seen.setdefault("x", args[0].detach().clone())
        seen.setdefault("kwargs", kwargs)

    hook = model.model.layers[1].register_forward_pre_hook(keep, with_kwargs=True)
    before = _state(model)
    r = audit(
        model,
        ids,
        segments=["model.layers.0", "model.layers.1"],
        loss_fn=lambda out: out.logits.sum(),
    )
    hook.remove()
    _assert_untouched(model, before)
    s = r["model.layers.1"]
    assert s.torch_checkpoint_exact and s.torch_replay_error is None, s
    assert s.state_keyword == "replay_state" and s.keywords
    assert s.torch_checkpoint_grad_error == 0.0 and s.torch_replay_grad_error == 0.0
    line = s.code()
    assert line == "tr.checkpoint(model.model.layers[1], x, use_reentrant=False, **kwargs)"
    xa = seen["x"].clone().requires_grad_()
    xb = seen["x"].clone().requires_grad_()
    y = eval(line, {"tr": tr, "model": model, "x": xa, "kwargs": seen["kwargs"]})
    ref = model.model.layers[1](xb, **seen["kwargs"])
    y.sum().backward()
    g = grads(xa)
    ref.sum().backward()
    assert_bitwise([y.detach(), *g], [ref.detach(), *grads(xb)])


def test_function_holding_a_generator_is_put_back_and_its_line_runs():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, requires_grad=True)

    def fn(x):
        return torch.tanh(x * w) * torch.rand(6, generator=g)

    x = torch.randn(6, requires_grad=True)
    start = g.get_state()
    r = audit(fn, x)
    assert torch.equal(g.get_state(), start) and w.grad is None and x.grad is None
    s = r["fn"]
    assert s.generators == ["g (captured)"] and s.state == ["g (captured)"]
    assert any(m.startswith("wrong gradient") and "measured" in m for m in s.reasons)
    line = s.code()
    assert line == "tr.checkpoint(fn, x, use_reentrant=False, state=[g])"
    # As printed, against eager from the same generator state.
    x1 = x.detach().clone().requires_grad_()
    eval(line, {"tr": tr, "fn": fn, "g": g, "x": x1}).sum().backward()
    got = [x1.grad, w.grad.clone(), g.get_state()]
    g.set_state(start)
    w.grad = None
    x2 = x.detach().clone().requires_grad_()
    fn(x2).sum().backward()
    assert_bitwise(got, [x2.grad, w.grad, g.get_state()])
