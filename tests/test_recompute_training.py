"""Selective recomputation in training (issue 46, item 5; Note [Recomputation in
training] in ``inductor_pass/stages/train_recompute.py``).

References: plain ``torch.compile`` (Inductor) for outputs and gradients (bitwise,
``torch.equal``) and for the real step peak (the profiler's CPU memory events, as
``benchmarks/bench_inductor.py`` measures a step).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import inductor_pass  # noqa: F401  (registers the torch_replay backend)
from benchmarks.bench_recompute_training import _step, hf_resnet, step_peak
from benchmarks.lib.recompute_models import ReDimNetStyle, init_bn
from inductor_pass import PassConfig, make_backend
from inductor_pass.report import clear_reports, reports
from inductor_pass.stages.train_recompute import EXACT_OPS, step_levels


def _run(model, inputs, backend):
    torch._dynamo.reset()
    clear_reports()
    m = copy.deepcopy(model)
    f = torch.compile(m, backend=backend)
    steps = [_step(f, m, inputs, lambda y: y) for _ in range(2)]
    peak = step_peak(f, m, inputs, lambda y: y)
    return steps, peak, [r for r in reports() if r.kind == "partition"]


def _bitwise(a, b):
    return all(
        len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def _cfg(**kw):
    return PassConfig(decision_cache=False, variants=(), **kw)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_training_recompute_lowers_the_real_step_peak_bitwise(tmp_path, monkeypatch):
    """ReDimNet-style r0 in training (batch norm in training mode): the ReLU and
    normalisation outputs saved for the convolutions' weight gradients are
    recomputed in the backward; the whole step's peak is below plain Inductor's and
    every gradient is bitwise equal to it."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = init_bn(ReDimNetStyle(8, (1, 1, 1))).train()
    inputs = (torch.randn(1, 1, 40, 100),)
    ref, plain_peak, none = _run(model, inputs, "inductor")
    assert none == []
    got, ours_peak, parts = _run(model, inputs, make_backend(_cfg(recompute=True)))
    assert _bitwise(ref, got)
    assert len(parts) == 1 and parts[0].deployed, [p.reason for p in parts]
    rep = parts[0]
    assert rep.recomputed and all(c["extra_macs"] == 0 for c in rep.recomputed)
    assert sum(c["extra_cost"] for c in rep.recomputed) <= 0.01 * rep.recomputed[0]["total_cost"]
    assert rep.modelled_permuted_peak < rep.modelled_original_peak
    assert ours_peak < plain_peak, (ours_peak, plain_peak)


def test_hf_resnet_training_recompute_lowers_the_real_step_peak_bitwise(tmp_path, monkeypatch):
    """A Hugging Face model (transformers' ResNet, bottleneck blocks, batch norm in
    training mode): the ReLU outputs saved for its convolutions' weight gradients are
    recomputed; the real step peak is below plain Inductor's, gradients bitwise."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = _Logits(hf_resnet((64, 128, 256), (1, 2, 2), "bottleneck"))
    inputs = (torch.randn(2, 3, 32, 32),)
    ref, plain_peak, _ = _run(model, inputs, "inductor")
    got, ours_peak, parts = _run(model, inputs, make_backend(_cfg(recompute=True)))
    assert _bitwise(ref, got)
    assert len(parts) == 1 and parts[0].deployed, [p.reason for p in parts]
    assert all(c["extra_macs"] == 0 for c in parts[0].recomputed)
    assert ours_peak < plain_peak, (ours_peak, plain_peak)


class _Logits(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(pixel_values=x).logits


def test_training_recompute_is_off_by_default(tmp_path, monkeypatch):
    """Without ``recompute=True`` the partition is Inductor's: no partition report,
    the same step peak."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = init_bn(ReDimNetStyle(8, (1, 1, 1))).train()
    inputs = (torch.randn(1, 1, 40, 100),)
    ref, plain_peak, _ = _run(model, inputs, "inductor")
    got, peak, parts = _run(model, inputs, make_backend(_cfg()))
    assert parts == [] and _bitwise(ref, got) and peak == plain_peak


class _Gelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x):
        return self.b(nn.functional.gelu(self.a(x), approximate="tanh"))


def test_transcendental_chains_are_not_recomputed(tmp_path, monkeypatch):
    """The GELU(tanh) output saved for the second matmul's weight gradient is computed
    with ``tanh`` (not exactly rounded: a vectorised and a scalar kernel may differ),
    so it is never recomputed; the partition is Inductor's and says why."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = _Gelu()
    inputs = (torch.randn(16, 32),)
    ref, _, _ = _run(model, inputs, "inductor")
    got, _, parts = _run(model, inputs, make_backend(_cfg(recompute=True)))
    assert _bitwise(ref, got)
    assert len(parts) == 1 and not parts[0].deployed
    assert any("not recomputed exactly" in n for n in parts[0].notes), parts[0].notes
    assert torch.ops.aten.tanh not in EXACT_OPS and torch.ops.aten.convolution not in EXACT_OPS


def test_step_levels():
    assert step_levels({"a": (0, 1, 4), "b": (1, 3, 2), "c": (3, 3, 8)}, 4) == [4, 6, 2, 10]
