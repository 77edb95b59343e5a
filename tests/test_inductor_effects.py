"""What the pass's own runs of a program may not do (Note [Observable calls] in
inductor_pass/stages/observable.py): call an operator registered with side effects once
more, or advance the random generator. References: plain Inductor's call count, outputs
and generator state. Collectives across two ranks: tests/test_inductor_collectives.py.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch._library.effects import EffectType

import inductor_pass
from inductor_pass.stages.observable import observable_call
from inductor_pass.stages.rewrite import resolver
from tests.inductor_support import logged_sum_op

CALLS = logged_sum_op("logged_sum")
"""What the effectful operator saw, one entry per call."""


torch.library._register_effectful_op(
    torch.ops.torch_replay_test.logged_sum.default, EffectType.ORDERED
)


def _logged(x, w):
    h = torch.relu(x @ w)
    s = torch.ops.torch_replay_test.logged_sum(h)
    return (h * s) @ w, h.sin() @ w


def _random(x, w):
    h = torch.relu(x @ w)
    noise = torch.rand_like(h)
    dropped = torch.nn.functional.dropout(h, 0.5, training=True)
    return (dropped * noise) @ w, h.sin() @ w


def _run(fn, backend: str, calls: int = 3) -> tuple[list, list, list[float]]:
    """Outputs and generator state after each call of ``fn`` compiled with ``backend``."""
    torch._dynamo.reset()
    CALLS.clear()
    compiled = torch.compile(fn, backend=backend)
    torch.manual_seed(0)
    w, x = torch.randn(64, 64), torch.randn(32, 64)
    outs, states = [], []
    for _ in range(calls):
        outs.append(compiled(x, w))
        states.append(torch.get_rng_state())
    return outs, states, list(CALLS)


def _equal(a, b) -> bool:
    return all(
        torch.equal(p, q) for x, y in zip(a, b, strict=True) for p, q in zip(x, y, strict=True)
    )


def test_effectful_operator_runs_once_per_call(one_thread, fresh_dynamo, no_decision_cache):
    # Before: the pass's profile and guard runs called it 4 more times at the first call.
    want_out, _, want_calls = _run(_logged, "inductor")
    inductor_pass.clear_reports()
    got_out, _, got_calls = _run(_logged, "torch_replay")
    assert len(want_calls) == 3
    assert got_calls == want_calls
    assert _equal(got_out, want_out)
    (rep,) = inductor_pass.reports()
    assert not rep.deployed
    assert rep.reason.startswith("left unchanged: calls torch.ops.torch_replay_test.logged_sum")
    assert "side effects" in rep.reason


def test_random_draws_leave_the_generator_as_inductor_does(
    one_thread, fresh_dynamo, no_decision_cache
):
    # The pass runs this program (profiles, measures) from the generator state of the
    # first call and restores it after each run, so it is not left unchanged; outputs and
    # the generator state after every call are plain Inductor's.
    want_out, want_states, _ = _run(_random, "inductor")
    inductor_pass.clear_reports()
    got_out, got_states, _ = _run(_random, "torch_replay")
    assert _equal(got_out, want_out)
    for a, b in zip(got_states, want_states, strict=True):
        assert torch.equal(a, b)
    (rep,) = inductor_pass.reports()
    assert rep.modelled_original_peak is not None, rep.reason  # profiled: it ran
    assert "pass failed" not in rep.reason and "calls " not in rep.reason, rep.reason


_WRAPPER = textwrap.dedent(
    """
    def call(args):
        buf0, = args
        cpp_fused_0(buf0)
        {op}(buf0)
        return (buf0, )

    def benchmark_compiled_module(args):
        torch.ops._c10d_functional.wait_tensor.default(args[0])
    """
)


@pytest.mark.parametrize(
    "op, why",
    [
        ("torch.ops._c10d_functional.all_reduce_.default", "a collective"),
        ("torch.ops._c10d_functional.wait_tensor.default", "a collective"),
        ("torch.ops.c10d.allreduce_", "a collective"),  # non-functional, by name
        ("torch.ops.aten._print.default", "side effects (aten::_print)"),
        ("torch.ops.torch_replay_test.logged_sum.default", "side effects"),
        ("torch.ops.aten._linalg_check_errors.default", None),  # only raises
        ("torch.ops.aten.relu_.default", None),
        ("extern_kernels.mm", None),
    ],
)
def test_observable_call_reads_the_source(op, why):
    glob = {"torch": torch, "extern_kernels": torch._C._nn, "cpp_fused_0": lambda x: None}
    got = observable_call(_WRAPPER.format(op=op), resolver(glob))
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(f"calls {op}, ") and why in got, got
