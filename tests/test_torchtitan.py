"""torchtitan with torch_replay: the one-line route for its config-driven trainer, and
MoE load balancing equal to eager.

torchtitan's MoE load balancing halves the token counts of every block whose wrapper
says ``checkpoint_impl is CheckpointImpl.NO_REENTRANT`` (torch's re-run counts the
tokens twice); torch_replay's re-run counts them once, so its wrapper must not say that
(Note [Wrapper identity] in torch_replay/wrapper.py). The first tests need no torchtitan:
they run a copy of torchtitan 0.3's hook (``register_moe_load_balancing_hook``) on a
small MoE block. The others run torchtitan itself, as its Trainer builds a model from
the config registry (tests/torchtitan_jobs.py), in two spawned processes under
torchtitan's FSDP2 (gloo), where scripts/setup.sh installed it (beside .venv, so that the
rest of the suite never imports it, nor the triton it needs).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

import torch_replay as tr
from benchmarks.lib import torchtitan_models

from . import torchtitan_jobs

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


# --- torchtitan itself -------------------------------------------------------------


@pytest.fixture(scope="module")
def titan_runs() -> list:
    """Every run of tests/torchtitan_jobs.py on two ranks (one pair of spawned workers
    for the whole file: each imports torchtitan and triton)."""
    reason = torchtitan_models.missing()
    if reason:
        pytest.skip(reason)
    from .test_distributed import _spawn

    return _spawn(torchtitan_jobs.every_run)


def _run(ranks: list, name: str) -> list:
    out = [r[name] for r in ranks]
    for r in out:
        assert "error" not in r, r["error"]
    return out


def _titan_equal(run: dict, reference: dict) -> None:
    for step, (a, b) in enumerate(zip(run["loss"], reference["loss"], strict=True)):
        assert torch.equal(a, b), ("loss", step, (a - b).abs().item())
    for step, (ga, gb) in enumerate(zip(run["grads"], reference["grads"], strict=True)):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert torch.equal(ga[name], gb[name]), ("grad", step, name)
    for kind in ("params", "buffers"):
        assert run[kind].keys() == reference[kind].keys()
        for name in run[kind]:
            x, y = run[kind][name], reference[kind][name]
            assert torch.equal(x, y), (kind, name, (x.float() - y.float()).abs().max().item())


_OURS = "torch_replay"
_THEIRS = "torch"


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_torchtitan_deepseek_v3_moe_one_line_trains_like_eager(titan_runs, policy):
    """DeepSeek-V3 (torchtitan's debug model: a dense layer, two MoE layers with
    load balancing) built as torchtitan's Trainer builds it, FSDP2 over two ranks, its
    ``register_moe_load_balancing_hook`` on the optimizer: with the override line, every
    block is torch_replay's wrapper and two AdamW steps give eager's loss, every
    gradient, parameter and buffer (``expert_bias_E``, ``tokens_per_expert_E``)
    bitwise, with full and with selective activation checkpointing."""
    for rank in range(2):
        eager = _run(titan_runs, "dsv3-eager")[rank]
        ours = _run(titan_runs, f"dsv3-tr-{policy}")[rank]
        assert ours["wrappers"] == [_OURS] * 3
        _titan_equal(ours, eager)
        assert any(".moe.expert_bias_E" in n for n in ours["buffers"])


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_torchtitan_own_checkpointing_stays_torch(titan_runs, policy):
    """torchtitan's own activation checkpointing, untouched by torch_replay being
    installed: torch's wrapper with torch's ``CheckpointImpl.NO_REENTRANT``, whose
    doubled token counts the hook halves (eager's result, the reference the test
    above is held to, is reached by torch too on this model)."""
    for rank in range(2):
        theirs = _run(titan_runs, f"dsv3-{policy}")[rank]
        assert theirs["wrappers"] == [_THEIRS] * 3
        assert theirs["impl"] == [str(CheckpointImpl.NO_REENTRANT)] * 3
        _titan_equal(theirs, _run(titan_runs, "dsv3-eager")[rank])


def test_torchtitan_enable_wraps_with_torch_replay(titan_runs):
    """``enable()`` around the model's ``parallelize_fn`` (code that builds torchtitan's
    policies itself): torchtitan's own ``FullAC`` config builds torch_replay's wrapper,
    and the MoE model trains as eager."""
    for rank in range(2):
        ours = _run(titan_runs, "dsv3-enable-full")[rank]
        assert ours["wrappers"] == [_OURS] * 3
        _titan_equal(ours, _run(titan_runs, "dsv3-eager")[rank])


def test_torchtitan_llama3_dense_one_line_equals_torch_and_eager(titan_runs):
    """Llama 3 (dense, no state in its blocks): with the override line, torch_replay's
    wrapper gives torchtitan's own full checkpointing's result and eager's, bitwise."""
    for rank in range(2):
        ours = _run(titan_runs, "llama3-tr-full")[rank]
        assert ours["wrappers"] == [_OURS] * 3
        _titan_equal(ours, _run(titan_runs, "llama3-full")[rank])
        _titan_equal(ours, _run(titan_runs, "llama3-eager")[rank])


def test_torchtitan_override_refuses_what_it_cannot_replace(titan_runs):
    """``replay_ac`` on memory-budget checkpointing (no wrapper) or on a subclass with a
    policy of its own raises, naming it, instead of leaving torch's checkpoint or
    dropping the subclass's code; ``enable()`` blocks nest and put torchtitan's function
    back."""
    for result in _run(titan_runs, "refusals"):
        assert result["memory"].startswith("ValueError") and "MemoryBudgetAC" in result["memory"]
        assert result["subclass"].startswith("ValueError") and "enable()" in result["subclass"]
        assert result["engine"].startswith("ValueError")
        assert result["full"] == "ReplayFullAC.Config journal True"
        assert result["restored"] is True


def test_torchtitan_documented_names_resolve(titan_runs):
    """The names docs/integrations.md gives for the torchtitan route resolve where
    torchtitan imports (tests/test_documented_imports.py leaves them to this test)."""
    for result in _run(titan_runs, "documented"):
        assert "torch_replay.integrations.torchtitan.replay_ac" in result["names"]
        assert result["failed"] == {}
