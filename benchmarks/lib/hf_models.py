"""Tiny Hugging Face models built from their configs (no downloads), as plain modules of tensors.

``HF_MODELS`` names ten families: BERT, GPT-2, Llama, T5, ViT, Whisper, Mixtral, ResNet,
ConvNeXt and Mamba. :func:`build_hf_model` returns one, seeded (the same weights every
call), wrapped so that it takes tensors and returns its logits, with example inputs.
``transformers`` is pinned in requirements-dev.txt.

Import as ``from benchmarks.lib.hf_models import build_hf_model`` (the repository root on the
path: ``python -m benchmarks.NAME``, or pytest from the root).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["HF_MODELS", "HFLogits", "build_hf_model"]

HF_MODELS = (
    "bert",
    "gpt2",
    "llama",
    "t5",
    "vit",
    "whisper",
    "mixtral",
    "resnet",
    "convnext",
    "mamba",
)
"""The families :func:`build_hf_model` knows."""

_VOCAB, _SEQ, _BATCH, _HIDDEN, _LAYERS, _HEADS = 64, 16, 2, 32, 2, 4


class HFLogits(nn.Module):
    """A transformers model called with keyword tensors, returning ``.logits``.

    Args:
        model: The transformers model.
        names: The keyword of each positional input, in order.
    """

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True))).logits


def build_hf_model(name: str) -> tuple[HFLogits, tuple[torch.Tensor, ...]]:
    """The tiny model of family ``name`` (seed 0, train mode) and its example inputs.

    Args:
        name: One of :data:`HF_MODELS`.

    Returns:
        ``(module, inputs)``: ``module(*inputs)`` is the logits tensor.

    Raises:
        ValueError: ``name`` is not one of :data:`HF_MODELS`.
    """
    import transformers as T

    if name not in HF_MODELS:
        raise ValueError(f"unknown Hugging Face model {name!r}; choose from {', '.join(HF_MODELS)}")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, _VOCAB, (_BATCH, _SEQ), generator=gen)
    image = torch.randn(_BATCH, 3, 32, 32, generator=gen)
    small = dict(
        vocab_size=_VOCAB, hidden_size=_HIDDEN, intermediate_size=2 * _HIDDEN,
        num_attention_heads=_HEADS, num_hidden_layers=_LAYERS,
    )  # fmt: skip
    if name == "bert":
        model = T.BertForMaskedLM(T.BertConfig(max_position_embeddings=64, **small))
        names, inputs = ("input_ids",), (ids,)
    elif name == "gpt2":
        cfg = T.GPT2Config(
            n_layer=_LAYERS, n_embd=_HIDDEN, n_head=_HEADS, vocab_size=_VOCAB, n_positions=64,
            bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        model, names, inputs = T.GPT2LMHeadModel(cfg), ("input_ids",), (ids,)
    elif name == "llama":
        cfg = T.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **small)
        model, names, inputs = T.LlamaForCausalLM(cfg), ("input_ids",), (ids,)
    elif name == "mixtral":
        cfg = T.MixtralConfig(
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, **small,
        )  # fmt: skip
        model, names, inputs = T.MixtralForCausalLM(cfg), ("input_ids",), (ids,)
    elif name == "t5":
        cfg = T.T5Config(
            vocab_size=_VOCAB, d_model=_HIDDEN, d_kv=8, d_ff=2 * _HIDDEN, num_layers=_LAYERS,
            num_heads=_HEADS, decoder_start_token_id=0,
        )  # fmt: skip
        model = T.T5ForConditionalGeneration(cfg)
        names, inputs = ("input_ids", "decoder_input_ids"), (ids, ids[:, : _SEQ // 2])
    elif name == "whisper":
        cfg = T.WhisperConfig(
            vocab_size=_VOCAB, num_mel_bins=8, d_model=_HIDDEN, encoder_layers=_LAYERS,
            decoder_layers=_LAYERS, encoder_attention_heads=_HEADS,
            decoder_attention_heads=_HEADS, encoder_ffn_dim=2 * _HIDDEN,
            decoder_ffn_dim=2 * _HIDDEN, max_source_positions=16, max_target_positions=32,
            decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            begin_suppress_tokens=None, suppress_tokens=None,
        )  # fmt: skip
        model = T.WhisperForConditionalGeneration(cfg)
        feats = torch.randn(_BATCH, 8, 32, generator=gen)  # 2 * max_source_positions frames
        names, inputs = ("input_features", "decoder_input_ids"), (feats, ids[:, : _SEQ // 2])
    elif name == "vit":
        cfg = T.ViTConfig(
            hidden_size=_HIDDEN, num_hidden_layers=_LAYERS, num_attention_heads=_HEADS,
            intermediate_size=2 * _HIDDEN, image_size=32, patch_size=8, num_labels=10,
        )  # fmt: skip
        model, names, inputs = T.ViTForImageClassification(cfg), ("pixel_values",), (image,)
    elif name == "resnet":
        cfg = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
        model, names, inputs = T.ResNetForImageClassification(cfg), ("pixel_values",), (image,)
    elif name == "convnext":
        cfg = T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10)
        model, names, inputs = T.ConvNextForImageClassification(cfg), ("pixel_values",), (image,)
    else:  # mamba
        cfg = T.MambaConfig(
            vocab_size=_VOCAB, hidden_size=_HIDDEN, state_size=8, num_hidden_layers=_LAYERS,
            expand=2, conv_kernel=4, time_step_rank=4,
        )  # fmt: skip
        model, names, inputs = T.MambaForCausalLM(cfg), ("input_ids",), (ids,)
    return HFLogits(model.train(), names), inputs
