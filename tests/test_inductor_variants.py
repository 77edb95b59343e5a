"""Program variants (Note [Program variants] in inductor_pass/variants/choose.py): the choice,
the static bound, lazy and deferred kernels, and the forked codegen.

References: plain Inductor's outputs (bitwise) and each Inductor program's peak measured
around the user's call, the variant's own profiled bound, the program Inductor compiles in
this process, and hand-written programs for the choice.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

import inductor_pass
from inductor_pass.observe import CompileObserver, observing
from inductor_pass.report import GraphReport
from inductor_pass.variants import bound, choose, kernels
from inductor_pass.variants import fork as variant_fork
from tests.inductor_support import (
    ConvNet,
    Mixer,
    SegmentNet,
    Summed,
    call_peak,
    mixer_and_input,
    pass_config,
    real_step,
)

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_decision_cache")


def _program(kind):
    def call(args):
        (x,) = args
        args.clear()
        if kind == "default":  # a transient 4 KiB block on top of the results
            w = torch.empty(1024)
            del w
            return (torch.neg(x), torch.neg(x))
        if kind == "same":
            return (torch.neg(x), torch.neg(x))
        if kind == "aliased":  # equal values, but both outputs are one buffer
            y = torch.neg(x)
            return (y, y)
        return (torch.neg(x), torch.mul(x, -2.0))  # "different" values

    return call


@pytest.mark.parametrize("kind", ["same", "aliased", "different"])
def test_variant_choice_needs_identical_outputs_and_a_lower_measured_peak(kind):
    def cand(name, prog, peak):
        rep = GraphReport(byte_exact=True, measured_original_peak=peak, reason="left unchanged")
        return choose.Candidate(
            name=name, report=rep, original=prog, chosen=prog, source="", order=None
        )

    default = cand("default", _program("default"), 4096 + 800)
    other = cand(kind, _program(kind), 800)
    best, why = choose.choose([default, other], [torch.randn(100)], None)
    assert (best is other) == (kind == "same"), why


def test_mixer_inference_is_never_above_the_best_inductor_variant(one_thread):
    from torch._inductor import config as inductor_config

    model, x = mixer_and_input()
    peak_on, out_on = call_peak(model, x, "inductor")
    with inductor_config.patch(reorder_for_peak_memory=False):
        peak_off, out_off = call_peak(model, x, "inductor")
    inductor_pass.clear_reports()
    peak_ours, out_ours = call_peak(model, x, "torch_replay")
    assert torch.equal(out_ours, out_on)
    # Measured around the user's call, independently of the pass's model.
    assert peak_ours <= min(peak_on, peak_off), (peak_ours, peak_on, peak_off)
    (r,) = inductor_pass.reports()
    assert set(r.variants) == {"default", "reorder_for_peak_memory=False"}
    for v in r.variants.values():
        assert v["byte_exact"] is True and v["lower_bound"] is not None
    if peak_off < peak_on:  # the case of the issue: the other program is lower
        assert r.deployed and r.variant == "reorder_for_peak_memory=False"


def test_reorder_variant_is_a_lower_program_than_the_default_on_every_torch(one_thread):
    # Note [Peak-memory planning off, on every torch]: on torch 2.14 the option alone gives
    # the default program back. Both programs are plain Inductor's, measured around the call.
    from torch._inductor import config as inductor_config

    ((name, patch),) = choose.flipped_options(("reorder_for_peak_memory",))
    assert name == "reorder_for_peak_memory=False"
    model, x = mixer_and_input()
    peak_default, out_default = call_peak(model, x, "inductor")
    with inductor_config.patch(patch):
        peak_variant, out_variant = call_peak(model, x, "inductor")
    assert torch.equal(out_variant, out_default)
    assert peak_variant < peak_default, (peak_variant, peak_default, patch)


def _log_module_loads_and_waits(monkeypatch, fail_variant_wait=False):
    """Log ``(event, program, id(module globals))`` for Inductor's module loads and kernel waits."""
    from torch._inductor import codecache
    from torch._inductor import config as inductor_config
    from torch._inductor.async_compile import AsyncCompile

    events: list[tuple[str, str, int]] = []
    variant_scopes: set[int] = set()
    load, wait = codecache.PyCodeCache.load_by_key_path, AsyncCompile._wait_futures

    def load_by_key_path(*args, **kwargs):
        mod = load(*args, **kwargs)
        program = "default" if inductor_config.reorder_for_peak_memory else "variant"
        if program == "variant":
            variant_scopes.add(id(mod.__dict__))
        events.append(("load", program, id(mod.__dict__)))
        return mod

    def wait_futures(self, scope):
        program = "variant" if id(scope) in variant_scopes else "default"
        events.append(("wait", program, id(scope)))
        if fail_variant_wait and program == "variant":
            raise RuntimeError("injected kernel build failure")
        return wait(self, scope)

    monkeypatch.setattr(codecache.PyCodeCache, "load_by_key_path", load_by_key_path)
    monkeypatch.setattr(AsyncCompile, "_wait_futures", wait_futures)
    return events


def test_variant_kernels_build_while_the_default_program_is_generated(monkeypatch):
    # Note [Deferred variant kernels]: the variant's kernel wait comes after the
    # default program's module is loaded, and the variant still takes part
    # (kernels built at compile time: without Note [Lazy variant kernels]).
    from torch._inductor import config as inductor_config

    model, x = mixer_and_input()
    with (
        pass_config(variant_bound=False, fork_variants=False),
        torch.no_grad(),
        inductor_config.patch(compile_threads=2),
    ):
        expected = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        inductor_pass.clear_reports()
        events = _log_module_loads_and_waits(monkeypatch)
        f = torch.compile(model, backend="torch_replay")
        assert torch.equal(f(x), expected)
        assert torch.equal(f(x), expected)
    order = [(e, p) for e, p, _ in events]
    assert order.index(("load", "variant")) < order.index(("load", "default"))
    assert order.index(("wait", "variant")) > order.index(("load", "default")), order
    (r,) = inductor_pass.reports()
    assert set(r.variants) == {"default", "reorder_for_peak_memory=False"}
    assert r.variants["reorder_for_peak_memory=False"]["byte_exact"] is True


def test_variant_whose_kernels_fail_to_build_is_dropped_with_a_note(monkeypatch):
    from torch._inductor import config as inductor_config

    model, x = mixer_and_input()
    with torch.no_grad():  # plain Inductor's output: its caches may serve it
        expected = torch.compile(model, backend="inductor")(x)
    torch._dynamo.reset()
    with (
        pass_config(variant_bound=False, fork_variants=False),  # built at compile time, here
        torch.no_grad(),
        # no cache: the pass's variant is compiled, so its kernel build (failed here) runs
        inductor_config.patch(compile_threads=2, force_disable_caches=True),
    ):
        inductor_pass.clear_reports()
        _log_module_loads_and_waits(monkeypatch, fail_variant_wait=True)
        f = torch.compile(model, backend="torch_replay")
        assert torch.equal(f(x), expected)
        assert torch.equal(f(x), expected)
    (r,) = inductor_pass.reports()
    assert set(r.variants) == {"default"}
    assert any(
        "reorder_for_peak_memory=False not compiled" in n and "injected kernel build" in n
        for n in r.notes
    ), r.notes


# ---------------------------------------------------------------------------
# Note [Variant bound] and Note [Lazy variant kernels]
# ---------------------------------------------------------------------------


def _record_static_bounds(monkeypatch, rule_out: bool):
    """Log every static variant bound; with ``rule_out=False`` every variant still runs."""
    seen: list[tuple[int | None, str]] = []
    real = bound.variant_bound

    def spy(*args, **kwargs):
        lower, why = real(*args, **kwargs)
        seen.append((lower, why))
        return (lower, why) if rule_out else (None, "test: run the variant anyway")

    monkeypatch.setattr(bound, "variant_bound", spy)
    return seen


def _count_lazy_builds(monkeypatch):
    built: list[int] = []
    submit = kernels.LazyKernel.submit

    def counted(self):
        built.append(1)
        return submit(self)

    monkeypatch.setattr(kernels.LazyKernel, "submit", counted)
    return built


_BOUND_CASES = {
    "convnet": lambda: (ConvNet(), (torch.randn(2, 3, 16, 16),)),
    "segments": lambda: (
        SegmentNet(1000, 32, 4096, 16),
        (torch.randint(0, 1000, (512,)), torch.randint(0, 4096, (512,))),
    ),
    "mixer": lambda: _mixer_training(),
}


def _mixer_training():
    # Two blocks: the bound's point (a variant whose order differs) needs no more depth.
    torch.manual_seed(0)
    return Summed(Mixer(depth=2).train()), (torch.randn(16, 64, 48),)


@pytest.mark.parametrize("case", sorted(_BOUND_CASES))
def test_static_variant_bound_is_at_most_the_profiled_bound(case, monkeypatch, one_thread):
    # The independent reference: the pass run on the variant's built kernels
    # (profiled effects and sizes) gives the variant's own lower bound; the
    # static bound, from its source and the default's profile, never exceeds it.
    torch.manual_seed(0)
    model, inputs = _BOUND_CASES[case]()
    seen = _record_static_bounds(monkeypatch, rule_out=False)
    inductor_pass.clear_reports()
    real_step(model, inputs, "torch_replay")
    reps = inductor_pass.reports()
    checked = 0
    for r in reps:
        v = r.variants.get("reorder_for_peak_memory=False")
        if v is None or v["lower_bound"] is None or "same source" in " ".join(r.notes):
            continue
        assert seen, r.notes
        bound, why = seen.pop(0)
        assert bound is not None, why
        assert bound <= v["lower_bound"], (r.kind, bound, v)
        checked += 1
    assert checked >= 1, [r.notes for r in reps]


def test_variant_ruled_out_by_its_bound_is_never_built(monkeypatch, one_thread):
    torch.manual_seed(0)
    model, inputs = _BOUND_CASES["convnet"]()
    peak_on, loss_on, grads_on = real_step(model, inputs, "inductor")
    from torch._inductor import config as inductor_config

    with inductor_config.patch(reorder_for_peak_memory=False):
        peak_off, _, _ = real_step(model, inputs, "inductor")
    built = _count_lazy_builds(monkeypatch)
    inductor_pass.clear_reports()
    peak, loss, grads = real_step(model, inputs, "torch_replay")
    assert torch.equal(loss, loss_on)
    for a, b in zip(grads, grads_on, strict=True):
        assert torch.equal(a, b)
    # Measured around the user's calls: never above either Inductor program.
    assert peak <= min(peak_on, peak_off), (peak, peak_on, peak_off)
    ruled = []
    for r in inductor_pass.reports():
        v = r.variants["reorder_for_peak_memory=False"]
        if v["reason"].startswith("not built or run"):
            deployed = r.measured_permuted_peak if r.deployed else r.measured_original_peak
            assert v["lower_bound"] >= deployed, (v, deployed)
            assert v["measured_original_peak"] is None
            ruled.append(r.kind)
    assert ruled, [r.notes for r in inductor_pass.reports()]
    # Both graphs' variants are ruled out here, so no variant kernel was built.
    assert set(ruled) == {"forward", "backward"} and built == [], (ruled, len(built))


def test_lazy_variant_kernel_builds_itself_when_called():
    from torch._inductor.async_compile import AsyncCompile

    src = textwrap.dedent(
        """
        #include <cstdint>
        extern "C" void kernel(const float* in_ptr0, float* out_ptr0, int64_t n)
        {
            for (int64_t i = 0; i < n; ++i) out_ptr0[i] = 3.0f * in_ptr0[i] + 1.0f;
        }
        """
    )
    with kernels.lazy_kernels():
        k = AsyncCompile().cpp_pybinding(["const float*", "float*", "int64_t"], src)
    assert isinstance(k, kernels.LazyKernel)
    x, out = torch.randn(37), torch.empty(37)
    k(x, out, 37)  # built on demand
    assert torch.equal(out, 3.0 * x + 1.0)
    scope = {"kernel": k, "other": 1}
    assert kernels.force_kernels(scope) == 1 and not isinstance(scope["kernel"], kernels.LazyKernel)


def test_variant_whose_lazy_kernels_fail_to_build_is_dropped_with_a_note(monkeypatch):
    def fail(self):
        raise RuntimeError("injected lazy kernel build failure")

    monkeypatch.setattr(kernels.LazyKernel, "submit", fail)
    r, _ = _mixer_with()  # outputs equal to plain Inductor's, twice
    assert set(r.variants) == {"default"}
    assert any("injected lazy kernel build failure" in n for n in r.notes), r.notes


class _VariantSources(CompileObserver):
    """The variant programs each inner compile made (Note [Compile observers]), split by where
    they were generated: in a forked child, or in this process."""

    def __init__(self) -> None:
        self.forked: list[str] = []
        self.here: list[str] = []

    def variants_compiled(self, source, variants, notes) -> None:
        for v in variants:
            forked = any(f"variant {v.name} generated in a forked child" in n for n in notes)
            (self.forked if forked else self.here).append(v.program.source)


def _mixer_with(**config_changes):
    """The Mixer's inference under the pass with ``config_changes``: its report, and the
    variant sources; outputs checked equal to plain Inductor's, twice."""
    model, x = mixer_and_input()
    with pass_config(**config_changes), observing(_VariantSources()) as seen, torch.no_grad():
        expected = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        inductor_pass.clear_reports()
        f = torch.compile(model, backend="torch_replay")
        assert torch.equal(f(x), expected)
        assert torch.equal(f(x), expected)
    (r,) = inductor_pass.reports()
    return r, seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork() is used on Linux only")
def test_forked_variant_is_the_program_inductor_compiles_in_process():
    r_fork, got_fork = _mixer_with(fork_variants=True)
    torch._dynamo.reset()
    r_here, got_here = _mixer_with(fork_variants=False)
    assert len(got_fork.forked) == 1 and not got_fork.here, vars(got_fork)
    assert len(got_here.here) == 1 and not got_here.forked, vars(got_here)

    def body(src):  # the graph counter in the header differs between compiles
        return [ln for ln in src.splitlines() if not ln.startswith("# AOT ID:")]

    assert body(got_fork.forked[0]) == body(got_here.here[0])  # line for line
    for r in (r_fork, r_here):
        assert r.variants["reorder_for_peak_memory=False"]["byte_exact"] is True
    assert r_fork.variant == r_here.variant
    assert r_fork.measured_permuted_peak == r_here.measured_permuted_peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork() is used on Linux only")
@pytest.mark.parametrize("failure", ["fork-fail", "fork-hang"])
def test_forked_variant_child_that_fails_or_hangs_falls_back(failure, monkeypatch):
    monkeypatch.setattr(variant_fork, "MIN_WAIT_S", 2.0)
    pids: list[int] = []
    start = variant_fork.start

    def spy_start(*args, **kwargs):
        f = start(*args, **kwargs)
        pids.append(f.pid)
        return f

    monkeypatch.setattr(variant_fork, "start", spy_start)
    r, got = _mixer_with(inject_failure=failure)
    # The variant was compiled in this process instead, and still takes part.
    assert len(got.here) == 1 and not got.forked, vars(got)
    assert r.variants["reorder_for_peak_memory=False"]["byte_exact"] is True
    why = "injected failure" if failure == "fork-fail" else "no answer within"
    assert any(why in n and "compiled here" in n for n in r.notes), r.notes
    (pid,) = pids
    with pytest.raises(ChildProcessError):  # killed (when it hung) and reaped
        os.waitpid(pid, os.WNOHANG)
