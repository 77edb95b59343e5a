"""The pass on ``cpp_wrapper=True`` programs (Note [C++ wrapper] in
``inductor_pass/runtime/cpp_wrapper.py``).

References are independent of the pass: plain Inductor with the same options (outputs,
gradients, parameters bitwise) and the profiler's CPU memory events around a real call
(``benchmarks.bench_inductor.profiled_peak``), not the pass's own counting window.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

import inductor_pass
from benchmarks.bench_inductor import profiled_peak
from inductor_pass.runtime import cpp_wrapper
from tests.inductor_support import TwoBranch, pass_config

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_decision_cache")
CPP = {"cpp_wrapper": True}


def _inference(model, x, backend):
    """Outputs of two calls and the profiled peak of a third."""
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(model, backend=backend, options=CPP)
        outs = [f(x), f(x)]
        peak = profiled_peak(lambda: f(x))
    return outs, peak


def _against_inductor():
    """TwoBranch inference under plain Inductor and under the backend, both with the C++
    wrapper: ``(ref outputs, ref peak, our outputs, our peak, our one report)``."""
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(256, 64)
    ref, ref_peak = _inference(model, x, "inductor")
    inductor_pass.clear_reports()
    got, peak = _inference(model, x, "torch_replay")
    (rep,) = inductor_pass.reports()
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    return ref_peak, peak, rep


def test_inference_runs_the_cpp_program_in_a_lower_order_bitwise():
    ref_peak, peak, rep = _against_inductor()
    assert rep.deployed, rep.reason + "".join(rep.notes)
    assert any("Python twin" in n for n in rep.notes), rep.notes
    assert rep.bitwise_identical is True
    # Measured around the user's call, by the profiler: below plain Inductor's C++ program.
    assert peak < ref_peak, (peak, ref_peak, rep.summary())
    assert rep.measured_permuted_peak < rep.measured_original_peak


def test_a_warm_process_deploys_the_cached_order(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(256, 64)
    ref, ref_peak = _inference(model, x, "inductor")
    with pass_config(decision_cache=True):
        inductor_pass.clear_reports()
        _inference(model, x, "torch_replay")  # cold: the pass runs and stores its decision
        (cold,) = inductor_pass.reports()
        inductor_pass.clear_reports()
        got, peak = _inference(model, x, "torch_replay")  # warm: from the decision cache
        (warm,) = inductor_pass.reports()
    assert cold.deployed and not any("pass's cache" in n for n in cold.notes), cold.notes
    assert warm.deployed and any("pass's cache" in n for n in warm.notes), warm.notes
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    assert peak < ref_peak, (peak, ref_peak)


def _train(model, x, backend):
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    f = torch.compile(m, backend=backend, options=CPP)
    seen = []
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = f(x).pow(2).sum()
        loss.backward()
        seen += [loss.detach()] + [p.grad.clone() for p in m.parameters()]
        opt.step()
    return seen + [p.detach().clone() for p in m.parameters()] + list(m.buffers())


def test_training_two_steps_equal_plain_inductor_bitwise():
    torch.manual_seed(0)
    model, x = TwoBranch(), torch.randn(256, 64)
    ref = _train(model, x, "inductor")
    inductor_pass.clear_reports()
    got = _train(model, x, "torch_replay")
    reps = inductor_pass.reports()
    assert sorted(r.kind for r in reps) == ["backward", "forward"]
    for r in reps:
        assert "failed" not in r.reason, r.reason + "".join(r.notes)
        assert any("Python twin" in n for n in r.notes), r.notes
    assert len(ref) == len(got)
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)


def test_symbolic_sizes_are_left_unchanged_with_the_reason():
    torch.manual_seed(0)
    model = TwoBranch().eval()
    inductor_pass.clear_reports()
    with torch.no_grad():
        ref = torch.compile(model, backend="inductor", dynamic=True, options=CPP)
        got = torch.compile(model, backend="torch_replay", dynamic=True, options=CPP)
        for n in (32, 16):
            x = torch.randn(n, 64)
            assert torch.equal(ref(x), got(x))
    reasons = [r.reason for r in inductor_pass.reports()]
    assert reasons and all("symbolic sizes" in r for r in reasons), reasons


def test_a_failure_in_the_recompile_keeps_the_cpp_program(monkeypatch):
    def broken(nodes, keys):
        raise RuntimeError("injected in order_nodes")

    monkeypatch.setattr(cpp_wrapper, "order_nodes", broken)
    _, _, rep = _against_inductor()  # outputs bitwise plain Inductor's
    assert not rep.deployed and "injected in order_nodes" in rep.reason, rep.reason


class _Node:
    """A stand-in for a scheduler node: its names and what it depends on."""

    def __init__(self, i: int, deps: set[int]):
        self.name = f"op{i}"
        self.buf = f"buf{i}"
        self.ancestors = {f"op{d}" for d in deps}
        self.unmet_dependencies = []

    def get_operation_names(self):
        return {self.name}

    def get_buffer_names(self):
        return {self.buf}


def _closure(deps: list[set[int]]) -> list[set[int]]:
    out: list[set[int]] = []
    for d in deps:
        full = set(d)
        for j in d:
            full |= out[j]
        out.append(full)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_order_nodes_is_a_topological_order_following_the_keys(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    deps = _closure([{j for j in range(i) if rng.random() < 0.3} for i in range(n)])
    nodes = [_Node(i, deps[i]) for i in range(n)]
    keys = {f"buf{i}": rng.randint(0, 20) for i in range(n) if rng.random() < 0.8}
    keys.setdefault("buf0", 0)
    ordered, keyed = cpp_wrapper.order_nodes(nodes, keys)
    assert keyed == len(keys)
    pos = {node.name: k for k, node in enumerate(ordered)}
    assert sorted(pos.values()) == list(range(n))
    for node in nodes:  # brute force: every dependence is placed before its user
        for a in node.ancestors:
            assert pos[a] < pos[node.name], (seed, a, node.name)
    # A key order that is itself topological is followed exactly.
    perm = [nd.name for nd in ordered]
    exact = {f"buf{int(name[2:])}": k for k, name in enumerate(perm)}
    again, _ = cpp_wrapper.order_nodes(nodes, exact)
    assert [nd.name for nd in again] == perm


def test_order_nodes_refuses_when_nothing_is_named():
    with pytest.raises(cpp_wrapper.OrderRefused, match="no scheduler node"):
        cpp_wrapper.order_nodes([_Node(0, set())], {"buf7": 0})
