"""Tests of the Inductor post-codegen pass (inductor_pass, design.md §3.1 and 5)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import textwrap
import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import inductor_pass  # registers the torch_replay backend
from inductor_pass.config import SALT, FailurePoint, PassConfig
from inductor_pass.program import units as U
from inductor_pass.program.wrapper_ast import (
    StmtKind,
    UnsupportedWrapper,
    parse_wrapper,
    render_region,
)
from inductor_pass.runtime.salt import TorchReplayPass, salted_fields
from inductor_pass.stages.guard import counting_window
from tests.inductor_support import call_peak, pass_config

torch._inductor.config.compile_threads = 1
pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_decision_cache")

# ---------------------------------------------------------------------------
# Hand-written wrapper snippets
# ---------------------------------------------------------------------------

_HEADER = """
import torch
k_rw = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
''')
k_rrw = async_compile.cpp_pybinding(['const float*', 'const float*', 'float*'], r'''
extern "C" void kernel(const float* in_ptr0, const float* in_ptr1, float* out_ptr0) {}
''')
k_inout = async_compile.cpp_pybinding(['float*', 'const float*'], r'''
extern "C" void kernel(float* in_out_ptr0, const float* in_ptr0) {}
''')
"""


def _wrapper(body: str) -> str:
    return (
        _HEADER
        + "\nclass Runner:\n    def __init__(self, partitions):\n"
        + "        self.partitions = partitions\n\n    def call(self, args):\n"
        + textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8)
        + "\n"
    )


SNIPPET = _wrapper(
    """
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (4, ), (1, ), 'input')
    buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
    k_rw(arg0_1, buf0)
    buf1 = empty_strided_cpu((4, ), (1, ), torch.float32)
    k_rw(arg0_1, buf1)
    buf2 = empty_strided_cpu((4, ), (1, ), torch.float32)
    k_rrw(buf0, buf1, buf2)
    del buf0
    buf3 = buf1; del buf1  # reuse
    k_inout(buf3, buf2)
    buf4 = reinterpret_tensor(buf2, (2, 2), (2, 1), 0)
    # a comment above the mm
    buf5 = extern_kernels.mm(buf4, buf4)
    del buf2
    return (buf3, buf5, )
    """
)


def test_parse_classifies_statements():
    w = parse_wrapper(SNIPPET)
    kinds = [s.kind for s in w.region]
    assert kinds.count(StmtKind.UNIT) == 5
    assert kinds.count(StmtKind.ALLOC) == 3
    assert kinds.count(StmtKind.DEL) == 3
    assert kinds.count(StmtKind.ALIAS) == 2
    assert kinds.count(StmtKind.CHECK) == 1
    assert w.input_names == ["arg0_1"]
    assert w.kernels["k_rrw"].writes == [False, False, True]
    assert w.kernels["k_inout"].writes == [True, False]
    alias = next(s for s in w.region if s.defines == ["buf3"])
    assert alias.alias_of == "buf1"
    mm = next(s for s in w.region if s.defines == ["buf5"])
    assert mm.comments == ["# a comment above the mm"]
    # Identity emission keeps every statement (comments and reuse markers included).
    src = render_region(w, list(range(len(w.region))))
    assert "# reuse" in src and "# a comment above the mm" in src
    compile(src, "<test>", "exec")


def test_parse_rejects_non_ssa():
    bad = _wrapper(
        """
        arg0_1, = args
        buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
        buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
        return (buf0, )
        """
    )
    with pytest.raises(UnsupportedWrapper, match="bound twice"):
        parse_wrapper(bad)


def _unit_of(w, name):
    return next(s.index for s in w.region if s.kind is StmtKind.UNIT and name in s.uses)


def test_dependences_raw_war_waw():
    w = parse_wrapper(SNIPPET)
    model = U.static_storages(w)
    units, edges, attached, tail = U.build_dependences(model)
    u_a, u_b, u_c, u_d, u_mm = units
    # RAW: the k_rrw unit reads buf0 and buf1 written by the first two units.
    assert (u_a, u_c) in edges and (u_b, u_c) in edges
    # WAR: k_inout writes buf1's storage (as buf3) after k_rrw read it.
    assert (u_c, u_d) in edges
    # The two producers only read arg0_1 (one generation): no order between them.
    assert (u_a, u_b) not in edges and (u_b, u_a) not in edges
    # Allocations attach to the unit that first touches their storage.
    assert [w.region[a].defines for a in attached[u_a]] == [["buf0"]]
    assert tail == []
    # The ablation: every access is a write, so the two readers of arg0_1 get ordered.
    _, edges_w, _, _ = U.build_dependences(U.static_storages(w), all_writes=True)
    assert (u_a, u_b) in edges_w


def test_emission_swaps_independent_units_and_frees_early():
    w = parse_wrapper(SNIPPET)
    model = U.static_storages(w, sizes={"buf0": 100, "buf1": 10, "buf2": 1, "buf5": 1})
    units, edges, attached, tail = U.build_dependences(model)
    u_a, u_b, *rest = units
    order = U.emit(model, [u_b, u_a, *rest], attached, tail)
    assert sorted(order) == list(range(len(w.region)))
    texts = [w.region[k].text for k in order]
    # buf1's allocation moved with its unit, before buf0's.
    assert texts.index("buf1 = empty_strided_cpu((4, ), (1, ), torch.float32)") < texts.index(
        "buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)"
    )
    # `del buf0` comes right after its last use.
    assert texts[texts.index("del buf0") - 1].startswith("k_rrw")
    peak, trace = U.simulate(model, order)
    assert peak == 111 and trace[-1] == 12  # buf3 (10) + buf2 (1) + buf5 (1) at the end


def test_emission_rejects_order_that_breaks_names():
    w = parse_wrapper(SNIPPET)
    model = U.static_storages(w)
    units, edges, attached, tail = U.build_dependences(model)
    u_a, u_b, u_c, u_d, u_mm = units
    with pytest.raises(U.EmissionError):
        U.emit(model, [u_a, u_b, u_c, u_mm, u_d][::-1], attached, tail)


# ---------------------------------------------------------------------------
# Property test: emitted programs are permutations respecting RAW/WAR/WAW
# ---------------------------------------------------------------------------


@st.composite
def _programs(draw):
    """Random straight-line wrappers over a few buffers with read/write kernels."""
    n_inputs = draw(st.integers(1, 2))
    names = [f"arg{i}_1" for i in range(n_inputs)]
    lines = [f"{', '.join(names)}, = args", "args.clear()"]
    live: list[str] = list(names)
    allocated: list[str] = []
    n = draw(st.integers(1, 8))
    nb = 0
    for _ in range(n):
        op = draw(st.sampled_from(["new", "new", "inout", "reuse", "free"]))
        if op == "new" or not allocated:
            buf = f"buf{nb}"
            nb += 1
            src = draw(st.sampled_from(live))
            lines.append(f"{buf} = empty_strided_cpu((4, ), (1, ), torch.float32)")
            lines.append(f"k_rw({src}, {buf})")
            live.append(buf)
            allocated.append(buf)
        elif op == "inout":
            dst = draw(st.sampled_from(allocated))
            src = draw(st.sampled_from(live))
            lines.append(f"k_inout({dst}, {src})")
        elif op == "reuse":
            old = draw(st.sampled_from(allocated))
            buf = f"buf{nb}"
            nb += 1
            lines.append(f"{buf} = {old}; del {old}  # reuse")
            live.remove(old)
            allocated.remove(old)
            live.append(buf)
            allocated.append(buf)
            src = draw(st.sampled_from(live))
            lines.append(f"k_inout({buf}, {src})")
        elif op == "free" and len(allocated) > 1:
            old = draw(st.sampled_from(allocated))
            lines.append(f"del {old}")
            live.remove(old)
            allocated.remove(old)
    lines.append(f"return ({', '.join(allocated)}, )")
    return _wrapper("\n".join(lines)), draw(st.randoms(use_true_random=False))


def _accesses(model, order):
    """Per storage: the sequence of (unit, is_write) in a statement order."""
    seq: dict[int, list[tuple[int, bool]]] = {}
    for k in order:
        if k in model.writes:
            for s in model.reads[k]:
                seq.setdefault(s, []).append((k, False))
            for s in model.writes[k]:
                seq.setdefault(s, []).append((k, True))
    return seq


def _last_writer_seen(seq):
    out, last = {}, None
    for u, w in seq:
        if w:
            last = u
        else:
            out[u] = last
    return out


@settings(max_examples=60, deadline=None)
@given(_programs())
def test_emitted_programs_respect_dependences(prog):
    source, rnd = prog
    w = parse_wrapper(source)
    model = U.static_storages(w)
    units, edges, attached, tail = U.build_dependences(model)
    # A random topological order of the units.
    indeg = {u: 0 for u in units}
    succ: dict[int, list[int]] = {u: [] for u in units}
    for a, b in edges:
        indeg[b] += 1
        succ[a].append(b)
    ready = [u for u in units if indeg[u] == 0]
    unit_order = []
    while ready:
        u = ready.pop(rnd.randrange(len(ready)))
        unit_order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    assert sorted(unit_order) == units
    order = U.emit(model, unit_order, attached, tail)
    # Every statement exactly once.
    assert sorted(order) == list(range(len(w.region)))
    # Names are bound before use and never used after del.
    bound = set(w.input_names)
    defined = {n for s in w.region for n in s.defines}
    for k in order:
        s = w.region[k]
        for n in s.uses:
            if n in defined or n in w.input_names:
                assert n in bound, (n, s.text)
        bound |= set(s.defines)
        bound -= set(s.deletes)
    # RAW: every read sees the same writer; WAW: writers keep their order; WAR: a
    # write never moves before a read of the previous generation.
    orig = _accesses(model, list(range(len(w.region))))
    new = _accesses(model, order)
    for s, seq in orig.items():
        assert _last_writer_seen(seq) == _last_writer_seen(new[s])
        assert [u for u, wr in seq if wr] == [u for u, wr in new[s] if wr]


# ---------------------------------------------------------------------------
# The counting allocator
# ---------------------------------------------------------------------------


def test_counting_window_is_byte_exact():
    keep = torch.empty(7)
    with counting_window() as stats:
        a = torch.empty(1000, dtype=torch.uint8)
        b = torch.empty_strided((3, 5), (5, 1), dtype=torch.float64)
        del a
        mid = stats()
        del keep  # allocated before the window: not counted
        end = stats()
    assert mid["peak"] == 1000 + 120 and mid["live"] == 120
    assert end["live"] == 120 and end["num_allocs"] == 2
    del b


# ---------------------------------------------------------------------------
# torch.compile(backend="torch_replay") against plain Inductor
# ---------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)
        )

    def forward(self, x):
        return self.net(x)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y)) + y
        return self.fc(y.mean((2, 3)))


class Branchy(torch.nn.Module):
    """Three branches sharing a head: the backward graph has a lower order."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 512)
        self.b = torch.nn.Linear(64, 512)
        self.c = torch.nn.Linear(64, 512)
        self.h = torch.nn.Linear(512, 8)

    def forward(self, x):
        ya = self.h(torch.relu(self.a(x)))
        yb = self.h(torch.tanh(self.b(x)))
        yc = self.h(torch.sigmoid(self.c(x)))
        return ya + yb * yc


def _train_step(model, x, backend):
    """Two training steps; the second (the permuted program's, when one was deployed) is
    returned: its output, gradients, buffers, and its peak bytes measured around the
    user's calls by the counting allocator (CPU; None elsewhere)."""
    m = copy.deepcopy(model)
    f = torch.compile(m, backend=backend)
    f(x).float().pow(2).sum().backward()
    m.zero_grad(set_to_none=True)
    window = counting_window() if x.device.type == "cpu" else contextlib.nullcontext()
    with window as stats:
        out = f(x)
        out.float().pow(2).sum().backward()
        peak = stats()["peak"] if stats is not None else None
    grads = [p.grad.clone() for p in m.parameters()]
    buffers = [b.clone() for b in m.buffers()]
    return out.detach(), grads, buffers, peak


def _check_reports(reps, peak_ref, peak_got):
    """The pass's model against its own measurement, and the step's peak measured around
    the user's calls against plain Inductor's (the independent reference)."""
    assert reps, "no graph went through the pass"
    for r in reps:
        assert "failed" not in r.reason, r.reason + "".join(r.notes)
        assert r.byte_exact is True, r
        assert r.modelled_original_peak == r.measured_original_peak
        assert r.modelled_permuted_peak == r.measured_permuted_peak
        if r.lower_bound is not None:
            assert r.lower_bound <= r.modelled_permuted_peak
    assert peak_got <= peak_ref, (peak_got, peak_ref, [r.summary() for r in reps])
    if any(r.deployed for r in reps):
        assert peak_got < peak_ref, "a graph was deployed but the measured peak is not lower"


def _check_training(ref, got):
    """Plain Inductor's step ``ref`` against the pass's ``got`` (from :func:`_train_step`):
    a forward and a backward report, bitwise outputs, gradients and buffers; the reports."""
    reps = inductor_pass.reports()
    assert {r.kind for r in reps} == {"forward", "backward"}
    _check_reports(reps, ref[3], got[3])
    for a, b in zip([ref[0], *ref[1], *ref[2]], [got[0], *got[1], *got[2]], strict=True):
        assert torch.equal(a, b)
    return reps


@pytest.mark.parametrize(
    "make, shape",
    [(MLP, (8, 32)), (ConvNet, (2, 3, 8, 8)), (Branchy, (256, 64))],
    ids=["mlp", "convnet", "branchy"],
)
def test_training_step_bitwise_equal_to_inductor(make, shape):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(*shape)
    inductor_pass.clear_reports()
    ref = _train_step(model, x, "inductor")
    got = _train_step(model, x, "torch_replay")
    reps = _check_training(ref, got)
    if make is Branchy:
        # The backward graph of the branchy net has a certified lower order, and the
        # step measured around the user's calls is lower than plain Inductor's.
        bw = [r for r in reps if r.kind == "backward"][0]
        assert bw.deployed and bw.certified
        assert got[3] < ref[3]


class PoolNet(torch.nn.Module):
    """Max-pool with padding: the backward graph takes int8 window offsets as an input."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.p = torch.nn.MaxPool2d(3, 2, 1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.p(torch.relu(self.c(x))).mean((2, 3)))


def test_integer_inputs_are_profiled_on_the_first_real_call():
    # Fabricated offsets/indices could index out of bounds; the real ones cannot.
    torch.manual_seed(0)
    model = PoolNet()
    x = torch.randn(2, 3, 16, 16)
    inductor_pass.clear_reports()
    ref = _train_step(model, x, "inductor")
    got = _train_step(model, x, "torch_replay")
    reps = _check_training(ref, got)
    for r in reps:
        assert "profiled on a copy of the first call's real inputs" in r.notes


def test_inference_graph_and_reports_fields():
    torch.manual_seed(0)
    model = Branchy().eval()
    x = torch.randn(64, 64)
    peak_ref, ref = call_peak(copy.deepcopy(model), x, "inductor")
    inductor_pass.clear_reports()
    peak_got, got = call_peak(copy.deepcopy(model), x, "torch_replay")
    assert torch.equal(ref, got)
    (r,) = inductor_pass.reports()
    assert r.kind == "inference"
    _check_reports([r], peak_ref, peak_got)
    d = r.as_dict()
    for key in (
        "kind",
        "modelled_original_peak",
        "modelled_permuted_peak",
        "measured_original_peak",
        "measured_permuted_peak",
        "lower_bound",
        "certified",
        "deployed",
        "reason",
    ):
        assert key in d


def test_dynamic_shapes_without_sizes_are_left_unchanged():
    # Symbolic graphs get an order per size (tests/test_inductor_dynamic.py), at most
    # PassConfig.max_sizes of them: with none, the first size says so.
    torch.manual_seed(0)
    model = MLP()
    inductor_pass.clear_reports()
    with torch.no_grad(), pass_config(max_sizes=0):
        f = torch.compile(copy.deepcopy(model), backend="torch_replay", dynamic=True)
        assert f(torch.ones(4, 32)).shape == (4, 16)
    (r,) = inductor_pass.reports()
    assert not r.deployed and "PassConfig.max_sizes=0" in r.reason
    assert r.size.endswith("=4") and "(inference, cpu, s" in r.summary()


def test_injected_failure_falls_back():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 32)
    with pass_config(inject_failure="search"), torch.no_grad():
        inductor_pass.clear_reports()
        got = torch.compile(copy.deepcopy(model), backend="torch_replay")(x)
        ref = torch.compile(copy.deepcopy(model))(x)
    assert torch.equal(ref, got)
    (r,) = inductor_pass.reports()
    assert not r.deployed
    assert "injected failure" in r.reason and r.reason.startswith("left unchanged")


def test_uuid_hashes_sources_and_config():
    a = TorchReplayPass(PassConfig()).uuid()
    assert a == TorchReplayPass(PassConfig()).uuid()
    assert a != TorchReplayPass(PassConfig(all_writes=True)).uuid()
    # Printing/dumping options do not change the program.
    assert a == TorchReplayPass(PassConfig(report=True)).uuid()


# A value other than the default for each PassConfig field.
_OTHER_VALUE = {
    "enabled": False,
    "deploy": False,
    "use_core": False,
    "time_limit_s": 2.0,
    "check_effects": False,
    "all_writes": True,
    "ablation": True,
    "report": True,
    "dump_dir": "/nonexistent/dump",
    "variants": (),
    "variant_bound": False,
    "fork_variants": False,
    "decision_cache": False,
    "recompute": True,
    "recompute_budget": 0.5,
    "recompute_max_chain": 4,
    "max_sizes": 2,
    "inject_failure": "search",
}


def test_every_config_field_says_whether_it_changes_programs():
    # A new field must choose: metadata {SALT: True} (salts the caches) or {SALT: False}.
    fields = dataclasses.fields(PassConfig)
    for f in fields:
        assert isinstance(f.metadata.get(SALT), bool), f"PassConfig.{f.name}: no {SALT!r}"
    assert salted_fields() == tuple(f.name for f in fields if f.metadata[SALT])
    assert set(_OTHER_VALUE) == {f.name for f in fields}  # a new field needs a value here


@pytest.mark.parametrize("name", sorted(_OTHER_VALUE))
def test_uuid_changes_with_exactly_the_salted_fields(name):
    (f,) = [f for f in dataclasses.fields(PassConfig) if f.name == name]
    base = PassConfig(report=False, dump_dir=None)  # not the environment's
    other = dataclasses.replace(base, **{name: _OTHER_VALUE[name]})
    assert getattr(other, name) != getattr(base, name)
    changed = TorchReplayPass(base).uuid() != TorchReplayPass(other).uuid()
    assert changed == f.metadata[SALT], name


def test_choice_fields_are_literals():
    hints = typing.get_type_hints(PassConfig)
    assert hints["inject_failure"] == FailurePoint | None
    # Each failure point is one the pass checks for: a stage, or the forked child.
    from inductor_pass.stages import rewrite
    from inductor_pass.variants import fork

    checked = inspect.getsource(rewrite) + inspect.getsource(fork)
    for point in typing.get_args(FailurePoint):
        assert f'stage("{point}")' in checked or f'inject == "{point}"' in checked, point


def test_backend_is_registered():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "torch_replay" in list_backends(exclude_tags=())
    assert lookup_backend("torch_replay") is inductor_pass.torch_replay_backend


@pytest.mark.cuda
def test_cuda_guard_deploys_only_measured_improvements():  # pragma: no cover - needs a GPU
    torch.manual_seed(0)
    model = Branchy().cuda()
    x = torch.randn(256, 64, device="cuda")
    inductor_pass.clear_reports()
    ref = _train_step(model, x, "inductor")
    got = _train_step(model, x, "torch_replay")
    assert torch.equal(ref[0], got[0])
    for a, b in zip(ref[1], got[1], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ref[2], got[2], strict=True):
        assert torch.equal(a, b)
    for r in inductor_pass.reports():
        assert r.device == "cuda"
