"""Tiny transformers models built from their configs (no downloads) and one training
step of each under no checkpointing, the stack's own (torch.utils.checkpoint) or
torch_replay's: what ``integrations_stacks``, ``bench_integrations``,
``bench_replay_speed`` and the tests build.
"""

from __future__ import annotations

import torch

from torch_replay._replay.segment import collect_transactions
from torch_replay.integrations import transformers as tr_hf

VOCAB = 64


def build_hf(name: str, layers: int = 4, hidden: int = 32, dropout: float = 0.1):
    """A tiny transformers model of family ``name``, seeded (same weights every call)."""
    import transformers as T

    torch.manual_seed(0)
    small = dict(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
        num_attention_heads=4, num_hidden_layers=layers,
    )  # fmt: skip
    if name == "gpt2":
        cfg = T.GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=4, vocab_size=VOCAB, n_positions=512,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        )  # fmt: skip
        return T.GPT2LMHeadModel(cfg)
    if name == "llama":
        cfg = T.LlamaConfig(num_key_value_heads=2, attention_dropout=dropout, **small)
        return T.LlamaForCausalLM(cfg)
    if name == "bert":
        cfg = T.BertConfig(
            hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **small
        )
        return T.BertForMaskedLM(cfg)
    if name == "mixtral":
        cfg = T.MixtralConfig(
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            attention_dropout=dropout, **small,
        )  # fmt: skip
        return T.MixtralForCausalLM(cfg)
    if name == "deepseek_v3":
        cfg = T.DeepseekV3Config(
            moe_intermediate_size=16, num_key_value_heads=4, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0, n_group=2,
            topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, attention_dropout=dropout, **small,
        )  # fmt: skip
        return T.DeepseekV3ForCausalLM(cfg)
    if name == "conformer":
        cfg = T.Wav2Vec2ConformerConfig(
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_feat_extract_layers=2, conv_depthwise_kernel_size=3,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
            **{**small, "vocab_size": 16},
        )  # fmt: skip
        return T.Wav2Vec2ConformerModel(cfg)
    raise ValueError(name)


def hf_turn_on(model, mode: str, **options) -> None:
    """``mode``: "none", "torch" (transformers' own, torch.utils.checkpoint) or "tr"."""
    if mode == "torch":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": options.get("use_reentrant", False)},
            every_n_layers=options.get("every_n_layers", 1),
            offload=options.get("offload", False),
        )
    elif mode == "tr":
        tr_hf.enable(model, **options)


def hf_loss(model, name: str, batch: int = 2, seq: int = 16):
    gen = torch.Generator().manual_seed(3)
    if name == "conformer":
        out = model(input_values=torch.randn(batch, 400, generator=gen)).last_hidden_state
        return (out * torch.randn(out.shape, generator=gen)).sum()
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    return model(input_ids=ids, labels=ids).loss


def hf_step(name: str, mode: str, between=None, **options):
    """One training step; returns loss, every gradient, every buffer, segments run."""
    model = build_hf(name)
    model.train()
    hf_turn_on(model, mode, **options)
    torch.manual_seed(5)
    with collect_transactions() as txns:
        loss = hf_loss(model, name)
    if between is not None:
        between(model)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    return loss.detach(), grads, [b.clone() for b in model.buffers()], len(txns)


def move_router_bias(model) -> None:
    """Aux-loss-free balancing (DeepSeek-V3): the router bias moves after the forward."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.add_(torch.linspace(-1.0, 1.0, b.numel()))
