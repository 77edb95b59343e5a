"""``inductor_pass.aoti_compile_and_package`` (Note [AOTInductor packages] in
``inductor_pass/runtime/aoti.py``).

The reference is Inductor's own package of the same export
(``torch._inductor.aoti_compile_and_package``), loaded with ``aoti_load_package``:
outputs bitwise, and the peak of a call measured around it by the profiler's CPU
memory events (``benchmarks.bench_inductor.profiled_peak``), not by the pass.
"""

from __future__ import annotations

import pytest
import torch

import inductor_pass
from benchmarks.bench_inductor import profiled_peak
from inductor_pass.runtime import cpp_wrapper
from tests.inductor_support import FrozenBranchy, TwoBranch

pytestmark = pytest.mark.usefixtures("no_decision_cache")


def _packages(model, x, tmp_path, **export_kw):
    """Inductor's package and ours of one export, loaded; with our report."""
    with torch.no_grad():
        ep = torch.export.export(model, (x,), **export_kw)
        ref = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(tmp_path / "inductor.pt2")
        )
        inductor_pass.clear_reports()
        ours = inductor_pass.aoti_compile_and_package(ep, package_path=str(tmp_path / "ours.pt2"))
    assert ours == str(tmp_path / "ours.pt2")
    (rep,) = inductor_pass.reports()
    return torch._inductor.aoti_load_package(ref), torch._inductor.aoti_load_package(ours), rep


@pytest.mark.parametrize("build,shape", [(FrozenBranchy, (2, 3, 32, 32)), (TwoBranch, (256, 64))])
def test_package_runs_a_lower_order_bitwise(build, shape, tmp_path):
    torch.manual_seed(0)
    model, x = build().eval(), torch.randn(shape)
    ref, ours, rep = _packages(model, x, tmp_path)
    assert rep.deployed, rep.reason + "".join(rep.notes)
    assert rep.bitwise_identical is True
    with torch.no_grad():
        for inp in (x, torch.randn(shape)):  # the export's input and another of its sizes
            assert torch.equal(ref(inp), ours(inp))
        peak_ref = profiled_peak(lambda: ref(x))
        peak = profiled_peak(lambda: ours(x))
    assert peak < peak_ref, (peak, peak_ref, rep.summary())


def test_symbolic_sizes_give_inductors_package_with_the_reason(tmp_path):
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(256, 64)
    batch = torch.export.Dim("batch", min=2, max=1024)
    ref, ours, rep = _packages(model, x, tmp_path, dynamic_shapes=({0: batch},))
    assert not rep.deployed and "symbolic sizes" in rep.reason, rep.reason
    with torch.no_grad():
        for n in (256, 17):
            y = torch.randn(n, 64)
            assert torch.equal(ref(y), ours(y))


def test_a_failure_keeps_inductors_package(monkeypatch, tmp_path):
    def broken(nodes, keys):
        raise RuntimeError("injected in order_nodes")

    monkeypatch.setattr(cpp_wrapper, "order_nodes", broken)
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(256, 64)
    ref, ours, rep = _packages(model, x, tmp_path)
    assert not rep.deployed and "injected in order_nodes" in rep.reason, rep.reason
    with torch.no_grad():
        assert torch.equal(ref(x), ours(x))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inductor.pt2", "ours.pt2"]


def test_a_scheduler_pass_of_the_callers_own_is_left_alone(tmp_path):
    calls = []

    def own(nodes):
        calls.append(len(nodes))
        return nodes

    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(256, 64)
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
        inductor_pass.clear_reports()
        path = inductor_pass.aoti_compile_and_package(
            ep,
            package_path=str(tmp_path / "ours.pt2"),
            inductor_configs={"_post_fusion_custom_pass": own},
        )
        out = torch._inductor.aoti_load_package(path)(x)
    (rep,) = inductor_pass.reports()
    assert "_post_fusion_custom_pass of its own" in rep.reason, rep.reason
    assert calls, "the caller's pass was not run"
    assert torch.allclose(out, model(x), atol=1e-5)
