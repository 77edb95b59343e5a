"""The observer: a TorchDispatchMode that shows every operator of a segment to its
C++ Transaction (see Note [Replay protocol] in csrc/aten/transaction.h).

It runs below autograd, so it sees the operators that really execute, with their
schema: which arguments are written (``Tensor(a!)``), which draw random numbers
(``nondeterministic_seeded``) and from which explicit generator. All decisions are
made in C++; this file only flattens arguments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .errors import OverlapError

__all__ = ["Observer"]


class _Gate:
    """A switch shared by the observers of one segment: while ``paused`` they let
    operators through unseen (a re-run of the segment made inside its own forward,
    which a separate transaction observes; see ``checkpoint._Frame``)."""

    __slots__ = ("paused",)

    def __init__(self) -> None:
        self.paused = False


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
    random: bool
    differentiable: bool


@functools.cache
def _op_info(func) -> _OpInfo:
    schema = func._schema
    metadata_only = func in _NO_BYTE_WRITES or torch.Tag.inplace_view in func.tags
    names, writes = [], []
    for arg in schema.arguments:
        names.append(arg.name)
        info = arg.alias_info
        writes.append(bool(info is not None and info.is_write and not metadata_only))
    return _OpInfo(
        names=tuple(names),
        writes=tuple(writes),
        random=torch.Tag.nondeterministic_seeded in func.tags,
        differentiable=func not in _NOT_DIFFERENTIABLE,
    )


class Observer(TorchDispatchMode):
    """Reports each operator's tensor arguments and outputs to ``txn``."""

    def __init__(self, txn, gate: _Gate | None = None):
        super().__init__()
        self.txn = txn
        self.gate = gate if gate is not None else _Gate()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view or self.gate.paused:
            # A view reads no bytes: the operators that use it will.
            return func(*args, **kwargs)
        info = _op_info(func)
        tensors: list[torch.Tensor] = []
        writes: list[bool] = []
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
            elif isinstance(value, (list, tuple)):
                for v in value:
                    if isinstance(v, torch.Tensor):
                        tensors.append(v)
                        writes.append(info.writes[i])
            elif isinstance(value, torch.Generator):
                generator = value
        self.txn.before_op(tensors, writes, info.random, generator)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            if "refer to a single memory location" in str(exc):
                raise OverlapError(
                    f"{func} writes memory that one of its inputs reads through a "
                    "different view; clone the source first. (torch: "
                    f"{exc})"
                ) from exc
            raise
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.txn.after_op(outputs, info.differentiable)
        return out
