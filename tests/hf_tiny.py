"""Tiny Hugging Face causal language models for the tests (``transformers`` is pinned in
requirements-dev.txt; a test that asks for one is skipped, with the reason, without it)."""

from __future__ import annotations

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
