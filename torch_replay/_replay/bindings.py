"""Which tensor each module attribute a segment read was bound to in its forward, and the
check, before the re-run, that it still is.

Note [Re-bound state]
A re-run reads module state by name: ``self.weight``, ``self.queue``. Every engine and
every check of the transaction works on the tensors (and storages) the forward read; none
of them sees that the name now stands for another tensor. Three ways a training step
re-binds a name between forward and backward:

- a new tensor assigned (``model.queue = torch.cat([new, model.queue[:-k]])``, the
  non-in-place MoCo enqueue; ``module.weight = nn.Parameter(...)``);
- a parameter's storage replaced through ``p.data = ...`` (old-style EMA / SGD): the
  same tensor object, another storage, and no version bump;
- ``torch.func.functional_call(model, fast_weights, x)`` with backward after the call
  returned (meta-learning): the forward read the fast weights, the module's own tensors
  are back.

The re-run would compute with the new tensor, as torch's checkpoint does, silently:
a gradient neither eager's nor explainable. So at the end of a forward the segment keeps,
for the modules it runs (the function itself or the module of a bound method, through
``functools.partial``) and the modules declared in ``state=``, each parameter and buffer
whose storage the forward touched as pre-existing (``Transaction.touched_key``; a
declared storage only if accessed): the table it sits in, its name, a weak reference to
the tensor and its storage key. Before the re-run starts (before any byte or generator
is put back) every kept binding must still hold the same tensor over the same storage;
else ``StateMutationError`` names the attribute and says how to update it in place.
Nothing is held strongly, and a name the forward did not read may be re-bound freely.
Not covered: modules reached only through a closure (``checkpoint(lambda x: block(x))``)
and plain tensor attributes that are neither parameters nor buffers.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..errors import StateMutationError
from .call import SegmentCall
from .naming import module_of

_TABLES = (("parameter", "_parameters"), ("buffer", "_buffers"))


def watched_modules(call: SegmentCall) -> list[torch.nn.Module]:
    """The modules whose bindings a segment keeps: the one it runs and those declared."""
    function = call.function
    while isinstance(function, functools.partial):
        function = function.func
    found = []
    module = module_of(function)
    if module is not None:
        found.append(module)
    if call.state is not None:
        found += [m for m in tree_leaves(call.state) if isinstance(m, torch.nn.Module)]
    return found


class Bindings:
    """The module attributes a forward read, by table, name, tensor and storage."""

    __slots__ = ("entries",)

    def __init__(self, entries: list[tuple[Any, ...]]) -> None:
        self.entries = entries

    @classmethod
    def of(cls, call: SegmentCall, txn) -> Bindings | None:
        """What ``txn``'s finished forward read of ``call``'s modules (None: nothing)."""
        roots = watched_modules(call)
        if not roots:
            return None
        entries = []
        seen: set[int] = set()
        for root in roots:
            for module in root.modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                for kind, attr in _TABLES:
                    table = getattr(module, attr)
                    for name, t in table.items():
                        if t is None:
                            continue
                        key = txn.touched_key(t)
                        if key:
                            entries.append((root, module, kind, table, name, weakref.ref(t), key))
        return cls(entries) if entries else None

    def check(self, key_of) -> None:
        """Raises StateMutationError if a binding the forward read now holds another
        tensor, or the same tensor over another storage (``key_of``: a tensor's key)."""
        for root, module, kind, table, name, ref, key in self.entries:
            now = table.get(name)
            if now is not None and now is ref() and key_of(now) == key:
                continue
            raise StateMutationError(_message(root, module, kind, name, now, ref() is now))


def _message(root, module, kind, name, now, same_object: bool) -> str:
    path = next((p for p, m in root.named_modules() if m is module), "")
    where = ".".join(filter(None, (type(root).__name__, path, name)))
    if now is None:
        how = "it was removed"
    elif same_object:
        how = "its storage was replaced (`.data = ...` or `set_`)"
    else:
        how = (
            "another tensor was assigned to it (`module.x = ...`), or a "
            "torch.func.functional_call that bound it for the forward has returned"
        )
    return (
        f"the re-run would read {kind} {where!r}, which is no longer the tensor the "
        f"forward read: {how} between the forward and the backward. The re-run would "
        "compute with the new tensor (torch.utils.checkpoint does, silently), so the "
        "gradient would be neither eager's nor the forward's. Update it in place instead "
        "(`with torch.no_grad(): x.copy_(new)`), or keep the forward's tensor bound until "
        "backward (with functional_call: call backward inside it). Nothing was re-run; "
        f"tensors, buffers and generators are as they were. [tensor: {name} ({kind} of "
        f"{'.'.join(filter(None, (type(root).__name__, path)))})]"
    )
