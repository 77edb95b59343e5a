"""Graphs whose data decides sizes (unbacked symbols: ``nonzero``, boolean masks,
``unique``, ``.item()``): Note [Data-dependent sizes] in inductor_pass/program/unbacked.py.

References: plain Inductor (``backend="inductor"``) on the same calls, outputs and
gradients bitwise, over inputs whose routing differs (so the sizes differ from call to
call); the peak of each call measured around the user's call by the counting allocator,
never above plain Inductor's; and, for the dominance rule, the modelled peak of both
orders at brute-forced sizes.

Before: every such graph was "pass failed (UnsupportedWrapper: statement of type If ...
is not permuted)" (or "unrecognised assignment" for ``bufN = None``).
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import inductor_pass
from inductor_pass.program import units as U
from inductor_pass.program.unbacked import (
    Varying,
    no_higher_at_every_size,
    segment_edges,
    size_terms,
    unbacked_symbols,
)
from inductor_pass.program.wrapper_ast import StmtKind, parse_wrapper
from inductor_pass.stages.guard import counting_window
from tests.inductor_support import RoutedTwoBranch, unbacked_config

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_dynamo", "no_decision_cache")

# Inductor's shape of a data-dependent program (torch 2.13, CPU), cut down.
WRAPPER = """
import torch
cpp_fused_0 = async_compile.cpp_pybinding(['const float*', 'bool*'], r'''
extern "C" void kernel(const float* in_ptr0, bool* out_ptr0) {}
''')
cpp_fused_1 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
''')
cpp_fused_2 = async_compile.cpp_pybinding(
    ['const int64_t*', 'const float*', 'float*', 'const int64_t'], r'''
extern "C" void kernel(const int64_t* in_ptr0, const float* in_ptr1, float* out_ptr0,
                       const int64_t ks0) {}
''')


def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    buf0 = empty_strided_cpu((128, ), (1, ), torch.bool)
    cpp_fused_0(arg0_1, buf0)
    buf1 = torch.ops.aten.nonzero.default(buf0)
    u0 = buf1.size(0)
    del buf0
    buf2 = buf1
    assert_size_stride(buf2, (u0, 1), (1, u0), 'torch.ops.aten.nonzero.default')
    if not (u0 <= 128):
        raise RuntimeError('u0 <= 128')
    buf3 = None
    buf4 = empty_strided_cpu((128, 512), (512, 1), torch.float32)
    cpp_fused_1(arg1_1, buf4)
    buf5 = empty_strided_cpu((u0, 8), (8, 1), torch.float32)
    cpp_fused_2(buf2, buf4, buf5, u0)
    del buf4
    if u0 > 64:
        buf6 = buf5
    return (buf5, buf2)
"""


def _stmt(w, text):
    return next(st for st in w.region if st.text.startswith(text))


def test_parse_makes_data_dependent_statements_units():
    w = parse_wrapper(WRAPPER)
    query = _stmt(w, "u0 =")
    assert (query.kind, query.callee, query.defines, query.uses) == (
        StmtKind.UNIT,
        "Tensor.size",
        ["u0"],
        ["buf1"],
    )
    check = _stmt(w, "if not")
    assert check.kind is StmtKind.UNIT and check.check_if and "u0" in check.uses
    assert check.defines == [] and "raise" in check.text  # one unit, never split
    other = _stmt(w, "if u0 > 64")
    assert other.kind is StmtKind.UNIT and not other.check_if
    assert other.defines == ["buf6"] and set(other.uses) >= {"u0", "buf5"}
    none = _stmt(w, "buf3 = None")
    assert none.kind is StmtKind.ALIAS and none.alias_of is None
    assert unbacked_symbols(w) == ["u0", "buf6"]


def test_symbols_and_checks_order_their_users():
    w = parse_wrapper(WRAPPER)
    idx = {k: _stmt(w, k).index for k in ("u0 =", "if not", "cpp_fused_1", "cpp_fused_2", "if u0")}
    _, edges, attached, _ = U.build_dependences(U.static_storages(w))
    # The symbol's binding precedes its users, the allocation ``buf5`` (attached to
    # cpp_fused_2) included, and the runtime check precedes the later users it tests.
    assert (idx["u0 ="], idx["cpp_fused_2"]) in edges
    assert (idx["if not"], idx["cpp_fused_2"]) in edges
    assert (idx["u0 ="], idx["if not"]) in edges
    assert any("u0" in w.region[a].uses for a in attached[idx["cpp_fused_2"]])
    # A unit using neither may move across the check; an ``if`` that is no check is a
    # barrier (its effects are unknown).
    assert (idx["if not"], idx["cpp_fused_1"]) not in edges
    assert (idx["cpp_fused_1"], idx["if not"]) not in edges
    assert (idx["cpp_fused_2"], idx["if u0"]) in edges
    assert (idx["cpp_fused_1"], idx["if u0"]) in edges


def _sized(model, vary, values):
    """``model`` with each unknown of ``vary`` at the given bytes (storages, then transients)."""
    sizes = dict(model.sizes)
    transient = list(model.transient)
    it = iter(values)
    for s in sorted(vary.storages):
        sizes[s] = next(it)
    for k in sorted(vary.statements):
        transient[k] = next(it)
    return U.ProgramModel(
        wrapper=model.wrapper,
        name_storages=model.name_storages,
        sizes=sizes,
        external=model.external,
        transient=transient,
    )


def test_dominance_is_sound_against_brute_forced_sizes():
    """Every order of the units of a small data-dependent program: when the rule admits
    it, its modelled peak is at most the original's at every size tried; and some order
    is admitted while lower at one size, so the rule is not vacuous."""
    w = parse_wrapper(WRAPPER.replace("    if u0 > 64:\n        buf6 = buf5\n", ""))
    names = {"buf1": 64, "buf4": 2048, "buf5": 32}
    model = U.static_storages(w, names)
    for st in w.region:  # transients: each statement's new results, as measured
        model.transient[st.index] = sum(model.sizes[s] for s in model.storages_of(st.defines))
    vary = Varying(
        symbols=("u0",),
        storages=frozenset(model.storages_of(["buf1", "buf5"])),
        statements=frozenset(_stmt(w, t).index for t in ("buf1 =", "buf5 =", "cpp_fused_2")),
    )
    units, edges, attached, tail = U.build_dependences(model)
    original = list(range(len(w.region)))
    grid = [0, 1, 40, 5000]
    admitted = 0
    for perm in itertools.permutations(units):
        pos = {u: i for i, u in enumerate(perm)}
        if any(pos[a] > pos[b] for a, b in edges):
            continue
        order = U.emit(model, list(perm), attached, tail)
        if no_higher_at_every_size(model, vary, order) is not None:
            continue
        admitted += 1
        n = len(vary.storages) + len(vary.statements)
        for values in itertools.product(grid, repeat=n):
            sized = _sized(model, vary, values)
            assert U.simulate(sized, order)[0] <= U.simulate(sized, original)[0], values
    assert admitted >= 2
    # The terms' largest is the modelled peak once the unknowns have values.
    values = [7, 11, 13, 17, 19]
    sized = _sized(model, vary, values)
    at = dict(zip([("s", s) for s in sorted(vary.storages)], values, strict=False))
    at.update(zip([("t", k) for k in sorted(vary.statements)], values[2:], strict=False))
    terms = size_terms(model, vary, original)
    assert max(c + sum(at[v] for v in vs) for c, vs in terms) == U.simulate(sized, original)[0]
    # Every unit keeps its side of each data-dependent unit under the segment edges.
    seg = segment_edges(model, vary, units)
    assert (_stmt(w, "cpp_fused_1").index, _stmt(w, "cpp_fused_2").index) in seg


def _inputs(seeds):
    return [torch.randn(128, 64, generator=torch.Generator().manual_seed(s)) for s in seeds]


def _run(model, backend, xs):
    """Per input: ``(peak of the call, output)``; the first call compiles."""
    torch._dynamo.reset()
    f = torch.compile(copy.deepcopy(model), backend=backend)
    got = []
    with torch.no_grad(), unbacked_config():
        for x in xs:
            f(x)
            with counting_window() as stats:
                out = f(x)
                peak = stats()["peak"]
            got.append((peak, out))
    return got


def _check(model, xs):
    want = _run(model, "inductor", xs)
    inductor_pass.clear_reports()
    got = _run(model, "torch_replay", xs)
    for x, (peak_w, out_w), (peak_g, out_g) in zip(xs, want, got, strict=True):
        assert torch.equal(out_w, out_g)
        torch.testing.assert_close(out_g, model(x), rtol=1e-4, atol=1e-5)
        assert peak_g <= peak_w, (model.routing(x), peak_g, peak_w)
    return inductor_pass.reports(), want, got


def test_routed_experts_are_permuted_no_higher_at_every_routing():
    torch.manual_seed(0)
    model = RoutedTwoBranch().eval()
    xs = _inputs(range(5))
    assert len({tuple(model.routing(x)) for x in xs}) == len(xs)  # sizes differ per call
    (rep,), want, got = _check(model, xs)
    assert rep.deployed, rep.summary()
    assert rep.byte_exact and rep.bitwise_identical
    assert rep.modelled_permuted_peak == rep.measured_permuted_peak
    assert any("data-dependent sizes (u0, u1)" in n for n in rep.notes), rep.notes
    # Variants are never chosen for such a graph: none is compiled (no forked child, no
    # lookup in the pass's cache), and the report says so.
    assert any("variants not compiled: data-dependent sizes" in n for n in rep.notes), rep.notes
    assert not any(n.startswith("variant ") for n in rep.notes), rep.notes
    assert got[0][0] < want[0][0]  # the profiled call's sizes
    assert all(g < w for (w, _), (g, _) in zip(want, got, strict=True))


def test_an_empty_expert_at_the_first_call_keeps_the_order():
    """At the first call every row goes to expert 0: expert 1's buffers are empty and
    their dependences cannot be seen, so Inductor's program runs at every call."""
    torch.manual_seed(0)
    model = RoutedTwoBranch().eval()
    with torch.no_grad():
        toward_0 = model.gate.weight[0] - model.gate.weight[1]
    xs = _inputs(range(3))
    xs[0] = xs[0] + 100.0 * toward_0 / toward_0.norm() ** 2
    assert model.routing(xs[0])[1] == 0
    assert all(0 < model.routing(x)[1] < 128 for x in xs[1:])
    (rep,), _, _ = _check(model, xs)
    assert not rep.deployed and "was empty at the profiled call" in rep.reason, rep.reason


def _item_sizes(x):
    n = (x[:, 0] > 0).sum().item()
    torch._check(n <= 128)
    w = torch.ones(64, 32) / 8
    return (torch.zeros(n, 64) + x[:n]) @ w


def _mask_sizes(x):
    rows = x[x[:, 0] > 0]
    return torch.tanh(rows @ torch.ones(64, 256)).sum(0) + x.sum()


def _unique_sizes(x):
    ids = torch.unique((x[:, 0] * 4).long().clamp(-8, 8))
    return ids.float().sum() + torch.relu(x @ torch.ones(64, 128)).sum()


@pytest.mark.parametrize("fn", [_item_sizes, _mask_sizes, _unique_sizes], ids=lambda f: f.__name__)
def test_item_mask_and_unique_sizes_are_handled(fn):
    xs = _inputs(range(3))
    want = _run(fn, "inductor", xs)
    inductor_pass.clear_reports()
    got = _run(fn, "torch_replay", xs)
    for (peak_w, out_w), (peak_g, out_g) in zip(want, got, strict=True):
        assert torch.equal(out_w, out_g)
        assert peak_g <= peak_w
    (rep,) = inductor_pass.reports()
    assert "failed" not in rep.reason, rep.reason + "".join(rep.notes)
    assert rep.reason.startswith("left unchanged: ") or rep.deployed, rep.reason
    assert rep.byte_exact, rep.summary()


def test_routed_experts_training_is_bitwise_equal_to_inductor():
    """The forward binds the symbols from data; the backward receives them as integer
    inputs and gets its order per size (Note [Per-size orders])."""
    torch.manual_seed(0)
    model = RoutedTwoBranch()
    xs = _inputs(range(3))

    def steps(backend):
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        f = torch.compile(m, backend=backend)
        out = []
        with unbacked_config():
            for x in xs:
                m.zero_grad(set_to_none=True)
                loss = f(x).square().sum()
                loss.backward()
                grads = [p.grad.clone() for n, p in m.named_parameters() if "gate" not in n]
                out.append([loss.detach(), *grads])  # the argmax gate gets no gradient
        return out

    want = steps("inductor")
    inductor_pass.clear_reports()
    got = steps("torch_replay")
    for a, b in zip(want, got, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    reps = inductor_pass.reports()
    assert {r.kind for r in reps} == {"forward", "backward"}
    for r in reps:
        assert "failed" not in r.reason, r.reason + "".join(r.notes)
