"""The backend's seams and manners (inductor_pass/runtime/backend.py, inductor_pass/observe.py):
compile observers see what the backend sees, a graph with a tensor constant is copied for
its variants, and a compile through the pass logs no error and warns no more than plain
Inductor's.

References: plain Inductor's outputs and gradients (bitwise), the reports the pass
records, and a fresh interpreter's warnings under plain Inductor.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import inductor_pass
from inductor_pass.observe import CompileObserver, observing
from tests.inductor_support import pass_config, subprocess_env
from tests.reference import ConstantScaled

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_decision_cache")


def _two_steps(model, x, backend):
    """Outputs of two training steps and the gradients after them."""
    m = copy.deepcopy(model)
    f = torch.compile(m, backend=backend)
    outs = []
    for _ in range(2):
        y = f(x)
        y.sum().backward()
        outs.append(y.detach())
    return outs, [p.grad.clone() for p in m.parameters()]


class _Log(logging.Handler):
    """Records at WARNING and above of any logger (torch's own do not propagate to the root)."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def seen(self) -> set[tuple[str, str, str]]:
        return {(r.name, r.levelname, r.getMessage()) for r in self.records}


@contextlib.contextmanager
def _all_logs():
    """Every logger that exists (torch registers its loggers at import) records into one."""
    log = _Log()
    names = [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in names)]
    for logger in loggers:
        logger.addHandler(log)
    try:
        yield log
    finally:
        for logger in loggers:
            logger.removeHandler(log)


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "in-process"])
def test_graph_with_a_tensor_constant_gets_its_variant_and_logs_no_error(fork, one_thread):
    torch.manual_seed(0)
    model, x = ConstantScaled(), torch.randn(3, 4)
    with _all_logs() as plain:
        ref = _two_steps(model, x, "inductor")
    torch._dynamo.reset()
    inductor_pass.clear_reports()
    with _all_logs() as log, pass_config(fork_variants=fork):
        got = _two_steps(model, x, "torch_replay")
    for a, b in zip(ref[0] + ref[1], got[0] + got[1], strict=True):
        assert torch.equal(a, b)
    # Nothing logged at WARNING or above that plain Inductor's compile did not log.
    assert log.seen() - plain.seen() == set()
    reps = inductor_pass.reports()
    assert {r.kind for r in reps} == {"forward", "backward"}
    for r in reps:
        notes = " ".join(r.notes)
        assert "no copy of the graph" not in notes and "not compiled" not in notes, r.notes
        assert "reorder_for_peak_memory=False" in r.variants, r.notes


class _Recorder(CompileObserver):
    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def before_inner_compile(self, gm, example_inputs, kwargs):
        self.events.append(("before", id(gm)))

    def after_inner_compile(self, gm, example_inputs, kwargs, compiled):
        self.events.append(("after", id(gm)))
        self.sources = getattr(self, "sources", []) + [compiled.source_code]

    def variants_compiled(self, source, variants, notes):
        self.events.append(("variants", source))

    def profiled(self, source, profiled):
        self.events.append(("profiled", source))

    def first_call(self, source, args, owned, original_call, report, seconds):
        assert len(args) == len(owned) and seconds >= 0
        self.events.append(("first_call", (source, report)))


def test_observer_sees_each_compile_and_first_call(one_thread):
    torch.manual_seed(0)
    model, x = ConstantScaled(), torch.randn(3, 4)
    inductor_pass.clear_reports()
    with observing(_Recorder()) as rec:
        _two_steps(model, x, "torch_replay")
    kinds = [k for k, _ in rec.events]
    # forward, then backward (compiled lazily at the first backward)
    assert kinds[:3] == ["before", "variants", "after"], kinds
    assert kinds.count("before") == kinds.count("after") == 2
    reps = inductor_pass.reports()
    firsts = [v for k, v in rec.events if k == "first_call"]
    assert [rep for _, rep in firsts] == reps  # the recorded reports, in order
    assert [src for src, _ in firsts] == rec.sources == [r.original_source for r in reps]
    profiled = [v for k, v in rec.events if k == "profiled"]
    assert set(profiled) >= set(rec.sources)  # each default program (and its variants)
    with observing(_Recorder()) as idle:  # an observer outside any compile sees nothing
        pass
    assert idle.events == []


def test_inner_compiles_get_the_backend_calls_hook_state(monkeypatch, one_thread):
    # Note [Hook state]: one HookState per backend call, carrying the config; the
    # forward's inner compile and the backward's (lazily, after the backend call) get
    # that object and make it current; nothing the inner compiles armed stays in it.
    from inductor_pass.runtime import backend, state, variant_compile

    made, seen = [], []

    def recording(**kwargs):
        made.append(state.HookState(**kwargs))
        return made[-1]

    def spy(gm, example_inputs, kw, hook_state):
        seen.append((hook_state, state.current()))
        return compile_with_variants(gm, example_inputs, kw, hook_state)

    compile_with_variants = variant_compile.compile_with_variants
    monkeypatch.setattr(backend, "HookState", recording)
    monkeypatch.setattr(variant_compile, "compile_with_variants", spy)
    cfg = inductor_pass.PassConfig(decision_cache=False, variants=())
    torch.manual_seed(0)
    _two_steps(ConstantScaled(), torch.randn(3, 4), inductor_pass.make_backend(cfg))
    assert len(made) == 1 and made[0].config is cfg
    assert len(seen) == 2  # forward, then backward at the first backward
    assert all(given is made[0] and now is made[0] for given, now in seen)
    assert made[0].armed == [] and state.current() is None


_WARNINGS = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    from tests.reference import ConstantScaled

    backend = sys.argv[1]
    if backend == "torch_replay":
        import inductor_pass  # noqa: F401  (only where the pass is used)

    f = torch.compile(ConstantScaled(), backend=backend)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):  # the forward and backward compiles, then a warm step
            f(torch.randn(3, 4)).sum().backward()
    print(json.dumps(sorted(f"{w.category.__name__}: {w.message}" for w in seen)))
    """
)


def test_compile_warns_no_more_than_plain_inductor(tmp_path):
    env = subprocess_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    seen = {}
    for backend in ("inductor", "torch_replay"):
        p = subprocess.run(
            [sys.executable, "-c", _WARNINGS, backend],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,  # a hang guard, not a time box
        )
        assert p.returncode == 0, p.stderr[-3000:]
        seen[backend] = collections.Counter(json.loads(p.stdout.strip().splitlines()[-1]))
    # Each warning the pass's compile raises, as often as plain Inductor's compile raises it.
    extra = seen["torch_replay"] - seen["inductor"]
    assert not extra, extra
