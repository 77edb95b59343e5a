"""The observer: shows every operator of a segment to its C++ Transaction (see
Note [Replay protocol] in csrc/aten/transaction.h).

Two implementations of one protocol, chosen by ``torch_replay.config.observer``:

* ``"c++"`` (default): a thread-local RecordFunction callback of the dispatcher
  (Note [C++ observer] in csrc/aten/op_observer.h), about a microsecond per operator.
* ``"python"``: a TorchDispatchMode below autograd (this file's
  ``DispatchModeObserver``), about 10 µs per operator; kept as the reference the
  C++ observer is benchmarked and tested against (benchmarks/bench_observer.py).

Both see each operator with its schema: which arguments are written
(``Tensor(a!)``), which draw random numbers (``nondeterministic_seeded``) and from
which explicit generator. All decisions are made in C++.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..errors import OverlapError

__all__ = ["DispatchModeObserver", "Observer", "new_gate", "unobserved"]

_OVERLAP_TEXT = "refer to a single memory location"


def new_gate():
    """A switch shared by the observers of one segment: while ``paused`` they let
    operators through unseen (a re-run of the segment made inside its own forward,
    which a separate transaction observes; see ``_nonreentrant._Frame``)."""
    global _C
    if _C is None:
        from .._ext import require_extension

        _C = require_extension()
    return _C.ObserverGate()


def _overlap_error(exc: BaseException) -> OverlapError:
    return OverlapError(
        "an operation writes memory that one of its inputs reads through a "
        f"different view; clone the source first. (torch: {exc})"
    )


_C = None
_scopes = threading.local()  # .gates: the gates of this thread's open observer scopes


def _open_gates() -> list:
    gates = getattr(_scopes, "gates", None)
    if gates is None:
        gates = _scopes.gates = []
    return gates


@contextlib.contextmanager
def unobserved():
    """Hides the operators run inside from every segment observing this thread
    (Note [FSDP traffic] in torch_replay/_replay/fsdp.py): each open scope's gate is
    paused, then put back as it was."""
    gates = getattr(_scopes, "gates", None)
    if not gates:
        yield
        return
    before = [g.paused for g in gates]
    for g in gates:
        g.paused = True
    try:
        yield
    finally:
        for g, was in zip(gates, before, strict=False):
            g.paused = was


class Observer:
    """Observes the current thread's operators for ``txn`` while active (C++)."""

    __slots__ = ("txn", "gate")

    def __init__(self, txn, gate=None):
        global _C
        if _C is None:
            from .._ext import require_extension

            _C = require_extension()
        self.txn = txn
        self.gate = gate if gate is not None else _C.ObserverGate()

    def __enter__(self):
        _C.observer_push(self.txn, self.gate)
        _open_gates().append(self.gate)
        return self

    def __exit__(self, exc_type, exc, tb):
        _open_gates().pop()
        _C.observer_pop(self.txn)
        if self.txn.has_pending:
            # A refusal made while the operators ran (Note [C++ observer]).
            self.txn.raise_pending()
        if exc_type is RuntimeError and _OVERLAP_TEXT in str(exc):
            raise _overlap_error(exc) from exc
        return False


_aten = torch.ops.aten
# Operators whose "writes" change metadata or identity only, never bytes.
_NO_BYTE_WRITES = {
    _aten.set_.source_Storage,
    _aten.set_.source_Storage_storage_offset,
    _aten.set_.source_Tensor,
    _aten.set_.default,
    _aten.resize_.default,
    _aten.resize_as_.default,
    _aten.detach_.default,
}
# Operators that may change what argument 0 is: its sizes, its storage, the
# storage's size (Note [Storage-changing writes] in csrc/aten/storage_reshape.h).
_RESHAPES = frozenset(
    op
    for packet in (_aten.set_, _aten.resize_, _aten.resize_as_, _aten._resize_output_)
    for op in (getattr(packet, name) for name in packet.overloads())
)
_NOT_DIFFERENTIABLE = {_aten.detach.default}
# Operators whose schema does not declare a write they make: the running
# statistics of batch norm in training mode (argument 5), arguments 3 and 4.
_UNDECLARED_WRITES = {
    _aten.native_batch_norm.default: (5, (3, 4)),
    _aten.cudnn_batch_norm.default: (5, (3, 4)),
    _aten.miopen_batch_norm.default: (5, (3, 4)),
}


@dataclass(frozen=True, slots=True)
class _OpInfo:
    names: tuple[str, ...]
    writes: tuple[bool, ...]
    returned: tuple[bool, ...]  # the operator returns the argument (Note [Integer writes])
    random: bool
    differentiable: bool
    may_resize: bool  # writes arguments and is not an in-place variant


@functools.cache
def _op_info(func) -> _OpInfo:
    schema = func._schema
    metadata_only = func in _NO_BYTE_WRITES or torch.Tag.inplace_view in func.tags
    names, writes, returned = [], [], []
    result_sets = [r.alias_info.before_set for r in schema.returns if r.alias_info is not None]
    for arg in schema.arguments:
        names.append(arg.name)
        info = arg.alias_info
        writes.append(bool(info is not None and info.is_write and not metadata_only))
        returned.append(info is not None and any(info.before_set & s for s in result_sets))
    return _OpInfo(
        names=tuple(names),
        writes=tuple(writes),
        returned=tuple(returned),
        may_resize=any(writes) and not schema.name.endswith("_"),
        random=torch.Tag.nondeterministic_seeded in func.tags,
        differentiable=func not in _NOT_DIFFERENTIABLE,
    )


class DispatchModeObserver(TorchDispatchMode):
    """Reports each operator's tensor arguments and outputs to ``txn`` (Python)."""

    def __init__(self, txn, gate=None):
        super().__init__()
        self.txn = txn
        self.gate = gate if gate is not None else new_gate()

    def __enter__(self):
        _open_gates().append(self.gate)
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        _open_gates().pop()
        return super().__exit__(exc_type, exc, tb)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view or self.gate.paused:
            # A view reads no bytes: the operators that use it will.
            return func(*args, **kwargs)
        info = _op_info(func)
        tensors: list[torch.Tensor] = []
        writes: list[bool] = []
        returned: list[bool] = []
        generator = None
        nargs = len(args)
        extra = _UNDECLARED_WRITES.get(func)
        extra_writes = extra[1] if extra is not None and nargs > extra[0] and args[extra[0]] else ()
        for i, name in enumerate(info.names):
            value = args[i] if i < nargs else kwargs.get(name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                writes.append(info.writes[i] or i in extra_writes)
                returned.append(info.returned[i])
            elif isinstance(value, (list, tuple)):
                for v in value:
                    if isinstance(v, torch.Tensor):
                        tensors.append(v)
                        writes.append(info.writes[i])
                        returned.append(info.returned[i])
            elif isinstance(value, torch.Generator):
                generator = value
        self.txn.before_op(tensors, writes, info.random, generator, False, returned)
        # Note [Storage-changing writes]: resize_ and set_ change argument 0; an
        # operator that is not in-place but writes arguments (out= variants, fused
        # observers) may resize them inside its kernel, which this mode cannot see.
        if func in _RESHAPES or torch.Tag.inplace_view in func.tags:
            reshaped = [args[0]]
        elif info.may_resize:
            reshaped = [t for t, w in zip(tensors, writes, strict=True) if w]
        else:
            reshaped = []
        for t in reshaped:
            self.txn.before_reshape(t)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            if _OVERLAP_TEXT in str(exc):
                raise _overlap_error(exc) from exc
            raise
        if reshaped:
            self.txn.after_reshape()
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.txn.after_op(outputs, info.differentiable)
        return out
