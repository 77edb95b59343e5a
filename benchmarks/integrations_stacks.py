"""Where torch's checkpointing is wrong in each stack and torch_replay is right: one
training step per stack with no checkpointing (eager), the stack's own checkpointing
(torch.utils.checkpoint) and torch_replay turned on in that stack, on tiny models built
from their configs (no downloads). Prints a markdown table: the largest gradient
difference from eager and whether every buffer equals eager's, for torch and for
torch_replay. The models and steps are benchmarks/lib/hf_stacks.py's.

    python -m benchmarks.integrations_stacks          # a minute or so on a small CPU

Nothing is written; docs/integrations.md quotes the table with this command.
"""

from __future__ import annotations

import torch
import torch.nn as nn

import torch_replay as tr
from benchmarks.lib.cli import make_parser
from benchmarks.lib.hf_stacks import hf_step, move_router_bias

# ------------------------------------------------------------------ the table


class _NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.lin(x)))


def _wrapper_step(mode: str):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    model = nn.Sequential(_NormBlock(), _NormBlock())
    pick = dict(check_fn=lambda m: isinstance(m, _NormBlock))
    if mode == "torch":
        apply_activation_checkpointing(model, **pick)
    elif mode == "tr":
        tr.apply_activation_checkpointing(model, **pick)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    model(x).pow(2).mean().backward()
    return None, [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()], 0


def _compare(ref, got):
    diff = max(
        ((a - b).abs().max().item() for a, b in zip(ref[1], got[1], strict=True) if a is not None),
        default=0.0,
    )
    buffers = all(torch.equal(a, b) for a, b in zip(ref[2], got[2], strict=True))
    return diff, buffers


STACKS = [
    ("torch.distributed wrapper, BatchNorm blocks", "tr.apply_activation_checkpointing(model)",
     _wrapper_step),
    ("transformers DeepSeek-V3, router bias moved before backward", "tr_hf.enable(model)",
     lambda mode: hf_step("deepseek_v3", mode, between=move_router_bias)),
    ("transformers Wav2Vec2-Conformer (BatchNorm)", "tr_hf.enable(model)",
     lambda mode: hf_step("conformer", mode)),
    ("transformers Llama (pure, dropout 0.1)", "tr_hf.enable(model)",
     lambda mode: hf_step("llama", mode)),
]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    make_parser(__doc__, whole_doc=True).parse_args(argv)  # (no options: --help)
    print("| stack | one line | torch: max grad diff, buffers == eager | torch_replay |")
    print("| --- | --- | --- | --- |")
    for label, line, step in STACKS:
        eager = step("none")
        t = _compare(eager, step("torch"))
        r = _compare(eager, step("tr"))
        print(f"| {label} | `{line}` | {t[0]:.2e}, {t[1]} | {r[0]:.2e}, {r[1]} |")


if __name__ == "__main__":
    main()
