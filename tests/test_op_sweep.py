"""The differential operator sweep (tests/op_sweep): torch's OpInfo database against eager.

For each operator sample a segment reads (or writes, in-place and ``out=``) a pre-existing
tensor that is changed before backward; eager PyTorch without checkpoint is the
reference. Undeclared, torch_replay must give eager's result or a ``tr.ReplayError``;
declared (``state=[...]``), eager's result; both observers, reentrant and not; and the
C++ observer must record the same pre-existing storages as the Python reference. The
quick subset (tests/op_sweep/quick.py) runs by default, the whole database with
``TORCH_REPLAY_SLOW=1`` (``python -m benchmarks.bench_op_sweep`` writes its table).
"""

from __future__ import annotations

import functools

import pytest
import torch

import torch_replay as tr
from torch_replay._ext import require_extension

from .op_sweep.cases import load_op_db, make_cases, op_id
from .op_sweep.extra import EXTRA_OPS
from .op_sweep.quick import QUICK_OPS
from .op_sweep.report import sweep
from .op_sweep.run import CaseResult, run_case


@functools.cache
def _ops() -> dict:
    return {op_id(op): op for op in load_op_db() + list(EXTRA_OPS)}


def _failures(res: CaseResult) -> list[str]:
    """What the rules of the sweep forbid in one case's runs: a wrong result or another
    exception than a ReplayError in any mode, a refusal of declared strided state, and
    storages the two observers' forwards touched differently. (Declaring a sparse
    tensor may be a named refusal.)"""
    out = []
    for run in res.runs:
        if run.mode.observer == "torch":
            continue  # the baseline (test_cases_can_fail)
        if run.result == "wrong" or run.result == "error":
            out.append(f"{run.mode.label}: {run.result}: {run.detail}")
        elif run.result == "refused" and run.mode.declared and res.case.strided_state:
            out.append(f"{run.mode.label}: refused although declared: {run.detail}")
    for reentrant, declared, a, b in res.storage_mismatches():
        out.append(
            f"reentrant={reentrant} declared={declared}: the C++ observer touched "
            f"{sorted(a)}, the Python one {sorted(b)}"
        )
    return out


# aten::type_as(self, other) has no alias annotation: the C++ observer records `other`
# as read (and refuses when only its values changed), the Python one, below autograd,
# sees only the decomposition `self.to(other.dtype)`.
_TYPE_AS = "the C++ observer records type_as's `other` as read (a false refusal)"
_KNOWN = {"Tensor.type_as": _TYPE_AS}
_QUICK = [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=_KNOWN[name]))
    if name in _KNOWN
    else name
    for name in QUICK_OPS
]


@pytest.mark.parametrize("name", _QUICK)
def test_quick_subset(name):
    assert name in _ops(), f"{name} is not in op_db nor tests/op_sweep/extra.py"
    problems = []
    ran = 0
    for case, _, _, _ in make_cases([_ops()[name]]):
        if case is None:
            continue
        res = run_case(case)
        if res.skipped:
            continue
        ran += 1
        problems += [f"{case.label} {p}" for p in _failures(res)]
    assert ran, f"{name}: no case ran"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("observer", ["c++", "python"])
def test_touched_storages_names_what_the_forward_read(observer):
    """Transaction.touched_storages: the pre-existing storages the forward read (a
    buffer read through a dtype conversion, a view of a parameter), not one it did not."""
    C = require_extension()
    buf = torch.linspace(0.5, 1.5, 6)
    weight = torch.randn(3, 2, dtype=torch.float64)
    unused = torch.ones(6, dtype=torch.float64)
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    with tr.config.patch(observer=observer):
        y = tr.checkpoint(
            lambda x: x * buf.double() + weight.t().reshape(-1), x, use_reentrant=False
        )
        touched = set(tr.last_transaction().touched_storages)
        del y
    assert C.storage_key(buf) in touched
    assert C.storage_key(weight) in touched
    assert C.storage_key(x) in touched
    assert C.storage_key(unused) not in touched


def test_cases_can_fail():
    """The cases tell a wrong gradient from eager's: torch.utils.checkpoint, which
    re-runs the segment on the changed state, is wrong on every sensitive read."""
    for name in ("exp", "matmul", "native_batch_norm", "to"):
        for case, _, _, _ in make_cases([_ops()[name]], kinds=("read",)):
            res = run_case(case)
            if res.skipped or not res.sensitive:
                continue
            for run in res.runs:
                if run.mode.observer == "torch":
                    assert run.result == "wrong", (case.label, run.mode.label, run.detail)


@pytest.mark.slow
def test_whole_op_db():
    s = sweep()
    problems = []
    for res in s.ran():
        problems += [f"{res.case.label} {p}" for p in _failures(res)]
    assert len(s.ops_covered) > 600
    assert not problems, f"{len(problems)} failures:\n" + "\n".join(problems[:200])
