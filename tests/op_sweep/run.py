"""Runs the cases of the operator sweep (tests/op_sweep/cases.py) against eager PyTorch.

For each case the reference is eager PyTorch without checkpoint: the gradient of
``x`` (``y = x * s``), and the values of every pre-existing tensor of the sample after
backward (``state`` changed in place between forward and backward, and whatever the
operator itself wrote). Then ``torch_replay.checkpoint`` runs the same program in every
mode (observer ``"c++"`` / ``"python"`` x ``use_reentrant`` x undeclared / declared
``state=``) and each run is classified. Undeclared runs are at ``tr.config.detect =
"preserve"``, the level that answers without ``state=`` (under ``"reads"``, the default,
an undeclared case is refused by name rather than answered); declared runs are at the
default:

* ``right``: eager's gradient and eager's tensors after backward;
* ``refused``: a ``torch_replay.ReplayError`` (a named refusal);
* ``wrong``: it ran and the gradient or a tensor differs from eager's (silently wrong);
* ``error``: any other exception.

Each run also records the pre-existing storages its forward touched
(``Transaction.touched_storages``) mapped to the sample's tensor names: the two observers
must agree on them (Note [C++ observer] in csrc/aten/op_observer.h says the C++ one sees
what the Python reference sees).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint as tcp

import torch_replay as tr
from torch_replay._ext import require_extension

from .cases import Case, change_state

__all__ = [
    "BASELINE",
    "MODES",
    "CaseResult",
    "Mode",
    "Run",
    "run_case",
]

SEED = 1234


@dataclass(frozen=True, slots=True)
class Mode:
    """One way of checkpointing a case: ``observer`` ``"c++"`` or ``"python"`` for
    torch_replay, ``"torch"`` for torch.utils.checkpoint (the baseline, which ignores
    ``declared``)."""

    observer: str
    reentrant: bool
    declared: bool

    @property
    def label(self) -> str:
        if self.observer == "torch":
            return f"torch.utils.checkpoint reentrant={self.reentrant}"
        return (
            f"{self.observer} reentrant={self.reentrant} "
            f"{'declared' if self.declared else 'undeclared'}"
        )


MODES: tuple[Mode, ...] = tuple(
    Mode(observer=o, reentrant=r, declared=d)
    for o in ("c++", "python")
    for r in (False, True)
    for d in (False, True)
)
# torch.utils.checkpoint on the same cases: how many it gets silently wrong shows that
# the cases can tell a wrong gradient from eager's.
BASELINE: tuple[Mode, ...] = tuple(
    Mode(observer="torch", reentrant=r, declared=False) for r in (False, True)
)


@dataclass(kw_only=True, slots=True)
class Run:
    """The outcome of one case in one mode."""

    mode: Mode
    result: str  # right, refused, wrong, error
    detail: str = ""
    touched: frozenset[str] | None = None  # None: the forward did not finish


@dataclass(kw_only=True, slots=True)
class CaseResult:
    """A case's runs, or why it was skipped."""

    case: Case
    skipped: str = ""
    sensitive: bool = True  # the state change changes eager's gradient
    runs: list[Run] = field(default_factory=list)

    def storage_mismatches(self) -> list[tuple[bool, bool, frozenset, frozenset]]:
        """(reentrant, declared, c++ set, python set) where the two observers' forwards
        touched different storages of the sample."""
        by_mode = {r.mode: r.touched for r in self.runs}
        out = []
        for r in (False, True):
            for d in (False, True):
                a = by_mode.get(Mode(observer="c++", reentrant=r, declared=d))
                b = by_mode.get(Mode(observer="python", reentrant=r, declared=d))
                if a is not None and b is not None and a != b:
                    out.append((r, d, a, b))
        return out


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout != torch.strided else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = _dense(a).detach(), _dense(b).detach()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    return bool(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-9, equal_nan=True))


def _message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _x() -> torch.Tensor:
    return torch.tensor(0.75, dtype=torch.float64, requires_grad=True)


def _eager(case: Case, *, change: bool = True):
    """Eager PyTorch: (gradient of x, the sample's tensors after backward, s)."""
    smp = case.make()
    x = _x()
    torch.manual_seed(SEED)
    y = smp.call(x)
    s = y.detach() / 0.75
    if change:
        change_state(smp.state)
    y.backward()
    return x.grad.clone(), {k: _dense(v).clone() for k, v in smp.named.items()}, s


def _eager_changed_first(case: Case) -> torch.Tensor:
    """s when ``state`` is changed before the forward (does the change show?)."""
    smp = case.make()
    change_state(smp.state)
    torch.manual_seed(SEED)
    with torch.no_grad():
        return smp.call(_x()) / 0.75


def _keys(named: dict[str, torch.Tensor]) -> dict[int, str]:
    C = require_extension()
    out = {}
    for name, t in named.items():
        if t.layout == torch.strided:
            out.setdefault(int(C.storage_key(t)), name)
    return out


def _checkpointed(case: Case, mode: Mode, ref_grad, ref_tensors) -> Run:
    smp = case.make()
    keys = _keys(smp.named)
    x = _x()
    touched = None
    try:
        torch.manual_seed(SEED)
        if mode.observer == "torch":
            y = tcp.checkpoint(smp.call, x, use_reentrant=mode.reentrant)
        else:
            level = "reads" if mode.declared else "preserve"
            kw = {"state": smp.declared} if mode.declared else {}
            # (A segment keeps its forward's settings until its backward.)
            with tr.config.patch(observer=mode.observer, detect=level):
                y = tr.checkpoint(smp.call, x, use_reentrant=mode.reentrant, **kw)
            txn = tr.last_transaction()
            if txn is not None:
                touched = frozenset(keys[k] for k in txn.touched_storages if k in keys)
        change_state(smp.state)
        y.backward()
    except tr.ReplayError as exc:
        return Run(mode=mode, result="refused", detail=_message(exc), touched=touched)
    except Exception as exc:  # noqa: BLE001 (any other class is a failure to report)
        return Run(mode=mode, result="error", detail=_message(exc), touched=touched)
    if x.grad is None or not _same(x.grad, ref_grad):
        got = None if x.grad is None else x.grad.item()
        return Run(
            mode=mode,
            result="wrong",
            detail=f"gradient {got} != eager {ref_grad.item()}",
            touched=touched,
        )
    for name, t in smp.named.items():
        if not _same(t, ref_tensors[name]):
            return Run(
                mode=mode,
                result="wrong",
                detail=f"{name} after backward differs from eager",
                touched=touched,
            )
    return Run(mode=mode, result="right", touched=touched)


def run_case(case: Case, modes: tuple[Mode, ...] = MODES + BASELINE) -> CaseResult:
    """Runs ``case`` in eager PyTorch and in each of ``modes``.

    Args:
        case: the case.
        modes: the checkpoint modes to run.

    Returns:
        The CaseResult: skipped (with the reason) when eager PyTorch cannot give a
        reference (it raises, its output is not deterministic, or holds no tensor)."""
    with _quiet():
        try:
            ref_grad, ref_tensors, s0 = _eager(case)
            _, _, s_again = _eager(case)
        except Exception as exc:  # noqa: BLE001 (the sample is not for this use)
            return CaseResult(case=case, skipped=f"eager raises {_message(exc)}")
        if not _same(s0, s_again):
            return CaseResult(
                case=case, skipped="eager output is not deterministic (uninitialized memory)"
            )
        sensitive = True
        if case.kind == "read":
            try:
                sensitive = not _same(s0, _eager_changed_first(case))
            except Exception:  # noqa: BLE001 (the changed state is outside the op's domain)
                sensitive = True
        result = CaseResult(case=case, sensitive=sensitive)
        for mode in modes:
            result.runs.append(_checkpointed(case, mode, ref_grad, ref_tensors))
    return result
