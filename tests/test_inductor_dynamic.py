"""Graphs with symbolic sizes (Note [Per-size orders] in inductor_pass/runtime/per_size.py):
Dynamo's automatic dynamic after a second length, ``dynamic=True`` and ``mark_dynamic``.
Each size gets its order at its first call, certified and guarded like a static graph.

References: plain Inductor (``backend="inductor"``) on the same calls, outputs and gradients
bitwise; eager within tolerance; the peak of each size's second call (or training step)
measured around the user's call by the counting allocator, never above plain Inductor's.

Before: every symbolic graph was "left unchanged: dynamic shapes (symbolic integer
input)".
"""

from __future__ import annotations

import copy

import pytest
import torch

import inductor_pass
from inductor_pass.stages.guard import counting_window
from tests.inductor_support import TwoBranch, logged_sum_op, pass_config

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_dynamo", "no_decision_cache")

LENGTHS = (32, 16, 24, 48)


def _input(n: int) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(n))


def _run(model, backend, lengths=LENGTHS, *, train=False, mark=False, **compile_kw):
    """Per length: ``(peak of the second call, outputs of both calls, grads)``."""
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    f = torch.compile(m, backend=backend, **compile_kw)

    def call(x):
        if not train:
            with torch.no_grad():
                return f(x)
        m.zero_grad(set_to_none=True)
        out = f(x)
        out.sum().backward()
        return out.detach()

    got = []
    for n in lengths:
        x = _input(n)
        if mark:
            torch._dynamo.mark_dynamic(x, 0)
        first = call(x)  # compiles; the pass runs here for a new size
        with counting_window() as stats:
            second = call(x)
            peak = stats()["peak"]
        grads = [p.grad.clone() for p in m.parameters()] if train else []
        got.append((peak, [first, second], grads))
    return got


def _check(model, *, train=False, lengths=LENGTHS, **kw):
    """Ours against plain Inductor and eager at every length; the reports, by size."""
    want = _run(model, "inductor", lengths, train=train, **kw)
    inductor_pass.clear_reports()
    got = _run(model, "torch_replay", lengths, train=train, **kw)
    reps = inductor_pass.reports()
    for n, (peak_w, outs_w, grads_w), (peak_g, outs_g, grads_g) in zip(
        lengths, want, got, strict=True
    ):
        for a, b in zip(outs_w + grads_w, outs_g + grads_g, strict=True):
            assert torch.equal(a, b), n
        eager = model(_input(n))
        torch.testing.assert_close(outs_g[0], eager.detach(), rtol=1e-4, atol=1e-5)
        at = [r for r in reps if _length(r) == n]
        assert peak_g <= peak_w, (n, peak_g, peak_w, [r.summary() for r in at])
        if any(r.deployed for r in at):
            assert peak_g < peak_w, (n, [r.summary() for r in at])
    for r in reps:
        injected = inductor_pass.get_config().inject_failure is not None
        assert injected or "failed" not in r.reason, r.reason + "".join(r.notes)
        if r.deployed:
            assert r.certified and r.byte_exact and r.bitwise_identical, r.summary()
            assert r.modelled_permuted_peak == r.measured_permuted_peak
            assert r.measured_permuted_peak < r.measured_original_peak
        else:
            assert r.reason.startswith("left unchanged: "), r.reason
    return reps


def _length(r) -> int | None:
    """The first size symbol's value in a report (None for a static graph)."""
    return int(r.size.split(",")[0].split("=")[1]) if r.size else None


def test_automatic_dynamic_inference_is_permuted_per_size():
    torch.manual_seed(0)
    reps = _check(TwoBranch().eval())
    # The first length compiles a static graph; the second a symbolic one, handled at
    # each new length's first call.
    assert [r.size for r in reps][0] == ""
    assert [_length(r) for r in reps[1:]] == [16, 24, 48]
    for r in reps[1:]:
        assert r.size.startswith("s") and f"({r.kind}, cpu, {r.size})" in r.summary()
    assert all(r.deployed for r in reps[1:]), [r.summary() for r in reps]


def test_dynamic_true_training_has_an_order_per_size():
    torch.manual_seed(0)
    reps = _check(TwoBranch(), train=True, dynamic=True)
    assert {r.kind for r in reps} == {"forward", "backward"}
    assert sorted({_length(r) for r in reps}) == sorted(LENGTHS)
    assert len(reps) == 2 * len(LENGTHS)  # one per graph and size, at its first call
    assert any(r.deployed and r.kind == "backward" for r in reps), [r.summary() for r in reps]


def test_sizes_beyond_the_cap_run_inductors_program():
    torch.manual_seed(0)
    with pass_config(max_sizes=2):
        reps = _check(TwoBranch().eval(), mark=True)
    assert [_length(r) for r in reps] == [32, 16, 24]  # 48 is not reported again
    capped = reps[-1]
    assert not capped.deployed and "PassConfig.max_sizes=2" in capped.reason
    assert "every later new size run Inductor's program" in capped.reason


def test_a_failure_at_one_size_leaves_that_size_unchanged():
    torch.manual_seed(0)
    with pass_config(inject_failure="search"):
        reps = _check(TwoBranch().eval(), dynamic=True, lengths=(32, 16))
    assert [_length(r) for r in reps] == [32, 16]
    for r in reps:
        assert not r.deployed and "injected failure" in r.reason and r.size


def test_decisions_are_cached_per_size(monkeypatch, tmp_path):
    from inductor_pass.runtime import decision_cache

    monkeypatch.setattr(decision_cache, "cache_dir", lambda: str(tmp_path))
    torch.manual_seed(0)
    model = TwoBranch().eval()
    with pass_config(decision_cache=True):
        cold = _check(model, dynamic=True, lengths=(32, 16))
        warm = _check(model, dynamic=True, lengths=(32, 16))
    assert [r.size for r in warm] == [r.size for r in cold]
    for c, w in zip(cold, warm, strict=True):
        assert "decision from the pass's cache" in w.notes[-1], w.notes
        assert (c.deployed, c.measured_permuted_peak) == (w.deployed, w.measured_permuted_peak)
    assert any(w.deployed for w in warm)


CALLS = logged_sum_op("logged_sum_dyn")


def test_observable_calls_run_once_at_every_size():
    from torch._library.effects import EffectType

    torch.library._register_effectful_op(
        torch.ops.torch_replay_test.logged_sum_dyn.default, EffectType.ORDERED
    )

    def fn(x, w):
        h = torch.relu(x @ w)
        return (h * torch.ops.torch_replay_test.logged_sum_dyn(h)) @ w

    w = torch.randn(64, 64)
    got = {}
    for backend in ("inductor", "torch_replay"):
        torch._dynamo.reset()
        CALLS.clear()
        inductor_pass.clear_reports()
        f = torch.compile(fn, backend=backend, dynamic=True)
        outs = [f(_input(n), w) for n in (32, 16, 16)]
        got[backend] = (outs, list(CALLS))
    assert got["torch_replay"][1] == got["inductor"][1] and len(CALLS) == 3
    for a, b in zip(got["torch_replay"][0], got["inductor"][0], strict=True):
        assert torch.equal(a, b)
    reps = inductor_pass.reports()
    assert [_length(r) for r in reps] == [32, 16]
    assert all(r.reason.startswith("left unchanged: calls torch.ops.") for r in reps)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["GPT2", "Llama"])
def test_tiny_language_models_train_at_every_length(name):
    # Automatic dynamic over lengths 32, 16, 24, 48: the forward and backward at each
    # symbolic length have their own report; loss and gradients are plain Inductor's.
    from tests.hf_tiny import tiny_causal_lm

    if name == "GPT2":  # its causal LM class has another name
        transformers = pytest.importorskip("transformers")
        cfg = transformers.GPT2Config(
            vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=64, use_cache=False
        )
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg).train()
    else:
        model = tiny_causal_lm(name, max_position_embeddings=64, use_cache=False)

    def steps(backend):
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        f = torch.compile(m, backend=backend)
        torch.manual_seed(0)  # GPT-2's dropout draws the same masks under both backends
        out = []
        for n in LENGTHS:
            ids = torch.randint(0, 32, (2, n), generator=torch.Generator().manual_seed(n))
            m.zero_grad(set_to_none=True)
            loss = f(input_ids=ids, labels=ids).loss
            loss.backward()
            out.append([loss.detach(), *(p.grad.clone() for p in m.parameters())])
        return out

    want = steps("inductor")
    inductor_pass.clear_reports()
    got = steps("torch_replay")
    for a, b in zip(want, got, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    reps = inductor_pass.reports()
    assert {_length(r) for r in reps if r.size} == {16, 24, 48}
    for r in reps:
        assert "failed" not in r.reason, r.reason
        assert r.deployed or r.reason.startswith("left unchanged: "), r.reason
        if r.deployed:
            assert r.certified and r.measured_permuted_peak < r.measured_original_peak
