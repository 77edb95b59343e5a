"""``tr.checkpoint`` with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Note [FSDP traffic]
FSDP2 keeps each parameter as a sharded ``DTensor`` (the local shard is the
state) and, around a module's forward and backward, all-gathers the shards into
an unsharded parameter tensor, then frees it again (``FSDPParamGroup.unshard``,
``wait_for_unshard``, ``reshard``; the unsharded storage is resized to 0 between
uses, ``FSDPParam.free_unsharded_param``). Seen by a segment's observer, that
copy-out is a write of pre-existing state, so the re-run (which gathers again)
would look like it changed the parameter: a false ``StateMutationError`` from the
second step on. The unshard/reshard traffic is FSDP's, not the segment's:
:func:`install` wraps FSDP's parameter-group methods so that the operators they
run are hidden from every observing segment (``_observe.unobserved``). The
segment still sees, and checks, its reads of the unsharded parameters (FSDP
keeps their version counters across the copy-out).

Declared state (``state=[module]``, or a DTensor): what a re-run reads is the
unsharded parameter, and FSDP rebuilds it from the local shards (the re-run
all-gathers them again, on every rank). So the **local shard** is preserved,
which is also the only copy that lives from forward to backward; the unsharded
value is FSDP's transient and is never declared. A DTensor buffer likewise
contributes its local tensor.

Which FSDP parameter an unsharded tensor belongs to is looked up by the tensor
itself (``_owner_of``, filled whenever a parameter group unshards), not in the
declared module's subtree: the FSDP state that manages a module's parameters is
often on an ancestor. ``tr.apply_activation_checkpointing`` then ``fully_shard``
per block (the README's recipe) puts it on the ``CheckpointWrapper`` around the
declared module, and ``fully_shard`` on a group of layers puts it higher still.
Declared by its own storage, an unsharded parameter is state that FSDP frees
after the forward (``reshard_after_forward``, every non-root module) and
all-gathers into a new allocation before the backward; the journal keeps that
copy-out's "old bytes" (whatever the new allocation held) and puts them back as
the re-run's start state, so the re-run computes with garbage: a silently wrong
gradient for a block that writes no state, a false ``StateMutationError`` for one
that does (its end state, a BatchNorm statistic, differs from the forward's).
Blocks called one at a time are each their own FSDP root, which never reshards
after forward, so only root calls showed it. (FSDP resizes the storage outside
the dispatcher, one of the writes only ``tr.config.verify = "bytes"`` sees.)
Undeclared, at ``detect="preserve"``, the same storage would be preserved by its
own bytes for the same wrong re-run (NaN gradients in the root-call test), so each
unsharded parameter is registered as a transient storage (Note [Transient
storages] in csrc/aten/tensor_bytes.h): its reads are watched by version counter,
as at ``detect="reads"``, and never preserved.
"""

from __future__ import annotations

import functools
import sys
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._ext import require_extension
from .observe import unobserved

__all__ = ["install", "local_state"]

_METHODS = (
    "pre_forward",
    "post_forward",
    "pre_backward",
    "post_backward",
    "unshard",
    "wait_for_unshard",
    "reshard",
    "finalize_backward",
)
_installed = False


def _hidden(method):
    @functools.wraps(method)
    def run(*args, **kwargs):
        with unobserved():
            return method(*args, **kwargs)

    run.__torch_replay_hidden__ = True
    return run


def _hidden_unshard(method):
    """``_hidden(wait_for_unshard)`` that also remembers whose the unsharded
    parameters are (Note [FSDP traffic])."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with unobserved():
            out = method(self, *args, **kwargs)
        _remember_unsharded(self)
        return out

    run.__torch_replay_hidden__ = True
    return run


def install() -> None:
    """Hide FSDP2's unshard/reshard traffic from segment observers and remember
    whose its unsharded parameters are (once per process; a no-op until
    ``torch.distributed.fsdp`` is imported)."""
    global _installed
    if _installed or "torch.distributed.fsdp" not in sys.modules:
        return
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # pragma: no cover - another torch layout: nothing to hide
        _installed = True
        return
    for name in _METHODS:
        method = getattr(FSDPParamGroup, name, None)
        if method is not None and not getattr(method, "__torch_replay_hidden__", False):
            wrap = _hidden_unshard if name == "wait_for_unshard" else _hidden
            setattr(FSDPParamGroup, name, wrap(method))
    _remember_existing()
    _installed = True


_owner_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""unsharded parameter -> weak reference to its ``FSDPParam`` (Note [FSDP traffic])."""


def _remember_unsharded(group) -> None:
    """Enters the unsharded parameters of FSDP parameter group ``group`` in
    ``_owner_of`` (each is made once, at its first all-gather, and reused)."""
    for fp in getattr(group, "fsdp_params", ()):
        unsharded = fp.__dict__.get("_unsharded_param")
        if unsharded is not None and unsharded not in _owner_of:
            _owner_of[unsharded] = weakref.ref(fp)
            # Never preserved by its own bytes (Note [Transient storages]).
            require_extension().mark_transient_storage(unsharded)


def _remember_existing() -> None:
    """``_remember_unsharded`` for every FSDP2 state alive now (groups that
    unsharded before :func:`install` wrapped ``wait_for_unshard``)."""
    from torch.distributed import _composable_state

    mapping = getattr(_composable_state, "_module_state_mapping", {})
    for ref in list(mapping.values()):
        state = ref()
        for group in getattr(state, "_fsdp_param_groups", ()):
            _remember_unsharded(group)


def local_state(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes a declared ``t`` is preserved by: its local shard
    when ``t`` is an FSDP-managed parameter (unsharded or sharded) or a DTensor,
    else ``t`` itself."""
    if _owner_of:
        ref = _owner_of.get(t)
        fp = ref() if ref is not None else None
        if fp is not None and fp.__dict__.get("_unsharded_param") is t:
            return fp._sharded_local_tensor
    local = getattr(t, "_local_tensor", None)  # DTensor (a sharded parameter among them)
    return local if isinstance(local, torch.Tensor) else t
