"""torchtitan with torch_replay: the one-line route for its config-driven trainer, and
MoE load balancing equal to eager.

torchtitan's MoE load balancing halves the token counts of every block whose wrapper
says ``checkpoint_impl is CheckpointImpl.NO_REENTRANT`` (torch's re-run counts the
tokens twice); torch_replay's re-run counts them once, so its wrapper must not say that
(Note [Wrapper identity] in torch_replay/wrapper.py). The first tests need no torchtitan:
they run a copy of torchtitan 0.3's hook (``register_moe_load_balancing_hook``) on a
small MoE block."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

import torch_replay as tr

# --- torchtitan 0.3's hook, faithfully copied (components/optimizer/optimizer.py) -----


def _is_recomputation_enabled(module):
    return getattr(module, "checkpoint_impl", None) is CheckpointImpl.NO_REENTRANT


def _update_expert_bias(blocks, load_balance_coeff=1e-3):
    counts = []
    for block in blocks:
        tokens_per_expert_E = block.moe.tokens_per_expert_E
        if _is_recomputation_enabled(block):
            tokens_per_expert_E = tokens_per_expert_E // 2
        counts.append(tokens_per_expert_E)
    by_layer = torch.vstack(counts)
    with torch.no_grad():
        for i, block in enumerate(blocks):
            tokens_per_expert_E = by_layer[i].float()
            delta = load_balance_coeff * torch.sign(
                tokens_per_expert_E.mean() - tokens_per_expert_E
            )
            delta = delta - delta.mean()
            block.moe.expert_bias_E.add_(delta)
            block.moe.tokens_per_expert_E.zero_()


class _MoE(torch.nn.Module):
    """torchtitan's MoE forward in small: top-k routing on scores plus the expert bias,
    the token counts accumulated in the forward under no_grad."""

    def __init__(self, dim=8, experts=4, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(experts, dim, dim) * 0.3)
        self.register_buffer("expert_bias_E", torch.zeros(experts))
        self.register_buffer("tokens_per_expert_E", torch.zeros(experts))

    def forward(self, x):
        scores = self.gate(x).softmax(-1)
        _, ids = torch.topk(scores + self.expert_bias_E, self.top_k, dim=-1)
        routing = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert_E.add_(routing.sum(dim=0))
        weights = scores.gather(-1, ids)
        out = torch.einsum("nd,nkde->nke", x, self.experts[ids])
        return (out * weights[..., None]).sum(1)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.moe = _MoE()

    def forward(self, x):
        return x + self.moe(x)


def _train_moe(wrap) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block() for _ in range(2)])
    if wrap is not None:
        wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.register_step_pre_hook(lambda *a, **k: _update_expert_bias(list(model)))
    gen = torch.Generator().manual_seed(1)
    losses, grads = [], []
    for _ in range(3):
        x = torch.randn(64, 8, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return (
        losses,
        grads,
        [p.detach().clone() for p in model.parameters()],
        [b.clone() for b in model.buffers()],
    )


def _equal(run, reference) -> None:
    for what, a, b in zip(("loss", "grads", "params", "buffers"), run, reference, strict=True):
        flat_a = [t for step in a for t in step] if what == "grads" else a
        flat_b = [t for step in b for t in step] if what == "grads" else b
        for i, (x, y) in enumerate(zip(flat_a, flat_b, strict=True)):
            assert torch.equal(x, y), (what, i, (x.float() - y.float()).abs().max().item())


_IS_BLOCK = lambda m: isinstance(m, _Block)  # noqa: E731


def test_moe_hook_copy_sees_torch_replay_count_once():
    """With torchtitan's hook, torch_replay's wrapper trains as eager (loss, every
    gradient, parameters, expert bias and counts, three steps): its ``checkpoint_impl``
    is not torch's ``NO_REENTRANT``, so the hook does not halve counts that were never
    doubled. torch's wrapper is eager's too (its re-run doubles, the hook halves): the
    same seam, read as torchtitan reads it."""
    eager = _train_moe(None)
    ours = _train_moe(
        lambda m: tr.apply_activation_checkpointing(m, check_fn=_IS_BLOCK, use_reentrant=False)
    )
    torch_full = _train_moe(lambda m: apply_activation_checkpointing(m, check_fn=_IS_BLOCK))
    _equal(ours, eager)
    _equal(torch_full, eager)


def test_moe_hook_copy_would_have_moved_the_bias():
    """The test above can fail: a torch_replay wrapper that said torch's
    ``NO_REENTRANT`` (as before) makes the hook halve the counts, and the expert bias
    leaves eager's from the second step on."""

    def wrap_saying_torch(m):
        tr.apply_activation_checkpointing(m, check_fn=_IS_BLOCK)
        for block in m:
            block.checkpoint_impl = CheckpointImpl.NO_REENTRANT

    eager = _train_moe(None)
    with pytest.raises(AssertionError):
        _equal(_train_moe(wrap_saying_torch), eager)


def test_wrapper_checkpoint_impl_is_its_own_and_reentrant_keywords_still_packed():
    """``checkpoint_impl`` is a ``ReplayCheckpointImpl`` (never torch's member), torch's
    wrapper keeps torch's, and the reentrant wrapper still packs keyword arguments as
    torch's does (gradients equal torch's reentrant wrapper's)."""

    class KW(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, *, scale):
            return self.lin(x) * scale

    for reentrant in (False, True):
        torch.manual_seed(0)
        ours = tr.checkpoint_wrapper(KW(), use_reentrant=reentrant)
        torch.manual_seed(0)
        impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
        theirs = checkpoint_wrapper(KW(), checkpoint_impl=impl)
        assert theirs.checkpoint_impl is impl
        assert not isinstance(ours.checkpoint_impl, CheckpointImpl)
        assert ours.checkpoint_impl.name == impl.name
        x = torch.randn(3, 4, requires_grad=True)
        ours(x, scale=2.0).sum().backward()
        g_ours = [x.grad.clone()] + [p.grad.clone() for p in ours.parameters()]
        x.grad = None
        theirs(x, scale=2.0).sum().backward()
        g_theirs = [x.grad.clone()] + [p.grad.clone() for p in theirs.parameters()]
        for a, b in zip(g_ours, g_theirs, strict=True):
            assert torch.equal(a, b)
