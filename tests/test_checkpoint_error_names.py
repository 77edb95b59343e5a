"""torch_replay.checkpoint's errors name the tensor (module path and buffer name, a
captured variable) and the spelling of its options that works, also when the
checkpointed function is a ``functools.partial`` (as Hugging Face's
``GradientCheckpointingLayer`` passes it), a bound method or a closure
(Note [Naming in errors] in torch_replay/_replay/naming.py). The advice is followed in each
test: the spelling the message gives runs and gives eager's gradient."""

from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn as nn

import torch_replay as tr

from .hf_tiny import tiny_causal_lm
from .reference import REENTRANT, assert_bitwise, grads, storage_bytes

# The errors named here are the refusals of detect="reads" (under "preserve", the
# default, the same undeclared changes are preserved: tests/test_observer_reads.py);
# the marker keeps them at that level whatever TORCH_REPLAY_DETECT says.
pytestmark = pytest.mark.detect("reads")

_PLAIN = re.compile(r"(?<![\w.'\"])(state|engine)=")  # state= / engine= not spelled replay_


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 6, dtype=torch.float64))
        self.register_buffer("e_score_correction_bias", torch.zeros(4, dtype=torch.float64))

    def forward(self, x):
        return torch.softmax(x @ self.weight.t() + self.e_score_correction_bias, -1)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, x):
        return self.gate(x)


class Layer(nn.Module):
    """A decoder layer as Hugging Face writes them: keywords arrive through ``**kwargs``."""

    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, hidden_states, scale=1.0, **kwargs):
        return self.mlp(hidden_states) * scale


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])


def _bias(model):
    return model.layers[1].mlp.gate.e_score_correction_bias


def _refused(fn, x, model, reentrant, **options) -> str:
    """The message of the StateMutationError raised when the router bias changes between
    the forward and the backward; the bias is left as the user set it."""
    y = tr.checkpoint(fn, x, use_reentrant=reentrant, **options)
    with torch.no_grad():
        _bias(model).add_(0.5)
    before = storage_bytes(_bias(model))
    with pytest.raises(tr.StateMutationError) as info:
        y.sum().backward()
    assert storage_bytes(_bias(model)) == before
    with torch.no_grad():
        _bias(model).sub_(0.5)
    return str(info.value)


def _eager_grads(model, x):
    x = x.detach().clone().requires_grad_()
    model.layers[1](x, scale=2.0).sum().backward()
    g = grads(x, *model.parameters())
    model.zero_grad(set_to_none=True)
    return g


def _declared_grads(fn, x, model, reentrant, **options):
    """Gradient with the bias declared as the message says, changed before backward and
    put back after: eager's gradient at the forward's bias."""
    x = x.detach().clone().requires_grad_()
    y = tr.checkpoint(fn, x, use_reentrant=reentrant, **options)
    with torch.no_grad():
        _bias(model).add_(0.5)
    y.sum().backward()
    with torch.no_grad():
        _bias(model).sub_(0.5)
    g = grads(x, *model.parameters())
    model.zero_grad(set_to_none=True)
    return g


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    return model, x


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_partial_as_hugging_face_passes_it(setup, reentrant):
    # GradientCheckpointingLayer: checkpoint(partial(forward, self, **kwargs), *args).
    model, x = setup
    layer = model.layers[1]
    fn = functools.partial(type(layer).forward, layer, scale=2.0)
    msg = _refused(fn, x, model, reentrant)
    assert "[tensor: layers.1.mlp.gate.e_score_correction_bias (buffer of Model)]" in msg
    assert "replay_state=" in msg and not _PLAIN.search(msg), msg
    # The spelling it gives works; the one it replaced is refused before anything runs.
    with pytest.raises(TypeError, match="replay_state"):
        tr.checkpoint(fn, x, use_reentrant=reentrant, state=[_bias(model)])
    got = _declared_grads(fn, x, model, reentrant, replay_state=[_bias(model)])
    assert_bitwise(got, _eager_grads(model, x))


def test_bound_method_of_a_layer_taking_kwargs(setup):
    model, x = setup
    layer = model.layers[1]
    fn = functools.partial(layer.__call__, scale=2.0)
    msg = _refused(fn, x, model, False)
    assert "layers.1.mlp.gate.e_score_correction_bias (buffer of Model)" in msg
    assert "replay_state=" in msg and not _PLAIN.search(msg), msg


def test_closure_names_the_variable_and_keeps_state_spelling(setup):
    model, x = setup

    def make():
        net = model

        def segment(h):  # takes no state= keyword: the plain spelling is right
            return net.layers[1](h, scale=2.0)

        return segment

    fn = make()
    msg = _refused(fn, x, model, False)
    assert "[tensor: net.layers.1.mlp.gate.e_score_correction_bias (buffer)]" in msg
    assert "Declare it in state=" in msg and "replay_state" not in msg
    got = _declared_grads(fn, x, model, False, state=[_bias(model)])
    assert_bitwise(got, _eager_grads(model, x))


def test_captured_tensor_is_named_by_its_variable():
    table = torch.linspace(0.5, 1.5, 5, dtype=torch.float64)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def segment(a, **kwargs):
        return (a * table).exp()

    y = tr.checkpoint(segment, x, use_reentrant=False)
    table[2] = 9.0
    with pytest.raises(tr.StateMutationError) as info:
        y.sum().backward()
    msg = str(info.value)
    assert "[tensor: table (a tensor the checkpointed function holds)]" in msg
    assert "replay_state=" in msg and not _PLAIN.search(msg), msg


def test_engine_advice_is_respelled_too(setup):
    # engine='guard' keeps nothing but the segment writes declared state: the advice
    # names the engines to use, spelled replay_engine= for a **kwargs function.
    buf = torch.zeros(4)
    x = torch.randn(4, requires_grad=True)

    def segment(a, **kwargs):
        buf.add_(1.0)
        return a * 2

    with pytest.raises(tr.StateMutationError) as info:
        tr.checkpoint(segment, x, use_reentrant=False, replay_state=[buf], replay_engine="guard")
    msg = str(info.value)
    assert "replay_engine='journal'" in msg and not _PLAIN.search(msg), msg
    assert torch.equal(buf, torch.zeros(4))


def test_hugging_face_deepseek_v3_router_bias():
    model = tiny_causal_lm(
        "DeepseekV3",
        moe_intermediate_size=8,
        num_key_value_heads=2,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=8,
        q_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=4,
    )
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for m in model.modules():  # transformers' own mechanism, torch_replay's function
        if hasattr(m, "_gradient_checkpointing_func"):
            m._gradient_checkpointing_func = functools.partial(tr.checkpoint, use_reentrant=False)
    ids = torch.randint(0, 32, (2, 6))
    loss = model(input_ids=ids, labels=ids).loss
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    with torch.no_grad():
        bias.add_(0.25)
    with pytest.raises(tr.StateMutationError) as info:
        loss.backward()
    msg = str(info.value)
    name = "model.layers.1.mlp.gate.e_score_correction_bias (buffer of DeepseekV3ForCausalLM)"
    assert f"[tensor: {name}]" in msg
    assert "replay_state=" in msg and not _PLAIN.search(msg), msg
