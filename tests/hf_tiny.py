"""Tiny Hugging Face causal language models for the tests (``transformers`` is pinned in
requirements-dev.txt; a test that asks for one is skipped, with the reason, without it)."""

from __future__ import annotations

import functools

import pytest
import torch

_TINY = {
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 16,
}


def tiny_causal_lm(name: str, **config):
    """``transformers.<name>ForCausalLM`` with a tiny config (``config`` added), made
    with seed 0, in train mode."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers (requirements-dev.txt) is not installed"
    )
    cfg = getattr(transformers, f"{name}Config")(**{**_TINY, **config})
    torch.manual_seed(0)
    return getattr(transformers, f"{name}ForCausalLM")(cfg).train()


@functools.cache
def _stateful_classes():
    """A tiny ``PreTrainedModel`` whose ``GradientCheckpointingLayer`` s write state in
    their forward that the forward then reads: a running mean the input is centred by
    (the output, and so the gradients, depend on it) and a BatchNorm; dropout on. torch's
    re-run updates both a second time and recomputes with the moved mean."""
    import transformers
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

    class StatefulConfig(transformers.PretrainedConfig):
        model_type = "torch_replay_stateful"

        def __init__(self, vocab_size=32, hidden_size=16, num_hidden_layers=2, **kwargs):
            self.vocab_size, self.hidden_size = vocab_size, hidden_size
            self.num_hidden_layers = num_hidden_layers
            super().__init__(**kwargs)

    class StatefulLayer(GradientCheckpointingLayer):
        def __init__(self, config):
            super().__init__()
            h = config.hidden_size
            self.lin = torch.nn.Linear(h, h)
            self.norm = torch.nn.BatchNorm1d(h)
            self.drop = torch.nn.Dropout(0.1)
            self.register_buffer("running", torch.zeros(h))

        def forward(self, hidden_states, **kwargs):
            if self.training:
                with torch.no_grad():
                    self.running.lerp_(hidden_states.mean(dim=(0, 1)), 0.5)
            y = self.lin(hidden_states - self.running)
            y = self.norm(y.transpose(1, 2)).transpose(1, 2)
            return hidden_states + self.drop(torch.tanh(y))

    class StatefulPreTrained(transformers.PreTrainedModel):
        config_class = StatefulConfig
        base_model_prefix = "model"
        supports_gradient_checkpointing = True
        main_input_name = "input_ids"

    class StatefulModel(StatefulPreTrained):
        def __init__(self, config):
            super().__init__(config)
            self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = torch.nn.ModuleList(
                StatefulLayer(config) for _ in range(config.num_hidden_layers)
            )
            self.post_init()

        def get_input_embeddings(self):
            return self.embed

        def forward(self, input_ids, **kwargs):
            h = self.embed(input_ids)
            for layer in self.layers:
                h = layer(h)
            return BaseModelOutput(last_hidden_state=h)

    class StatefulLM(StatefulPreTrained, transformers.GenerationMixin):
        def __init__(self, config):
            super().__init__(config)
            self.model = StatefulModel(config)
            self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size)
            self.post_init()

        def get_input_embeddings(self):
            return self.model.embed

        def get_output_embeddings(self):
            return self.lm_head

        def forward(self, input_ids, labels=None, **kwargs):
            logits = self.lm_head(self.model(input_ids).last_hidden_state)
            loss = None
            if labels is not None:  # next-token loss, as transformers' causal LMs
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
                )
            return CausalLMOutput(loss=loss, logits=logits)

    return StatefulConfig, StatefulLM


def tiny_stateful_lm(**config):
    """The model of :func:`_stateful_classes` (``config`` added), seed 0, train mode."""
    pytest.importorskip(
        "transformers", reason="transformers (requirements-dev.txt) is not installed"
    )
    config_class, model_class = _stateful_classes()
    torch.manual_seed(0)
    return model_class(config_class(**config)).train()
