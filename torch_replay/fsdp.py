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

Declared state (``state=[fsdp_module]``, or a DTensor): what a re-run reads is
the unsharded parameter, and FSDP rebuilds it from the local shards (the re-run
all-gathers them again, on every rank). So the **local shard** is preserved,
which is also the only copy that lives from forward to backward; the unsharded
value is FSDP's transient and is never snapshotted. A DTensor buffer likewise
contributes its local tensor.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable

import torch

from ._observe import unobserved

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


def install() -> None:
    """Hide FSDP2's unshard/reshard traffic from segment observers (once per
    process; a no-op until ``torch.distributed.fsdp`` is imported)."""
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
            setattr(FSDPParamGroup, name, _hidden(method))
    _installed = True


def _unsharded_to_local(modules: Iterable[torch.nn.Module]) -> dict[int, torch.Tensor]:
    """id(unsharded or sharded parameter) -> local shard, for the FSDP modules among
    ``modules`` (a parameter read inside the forward is the unsharded one)."""
    out: dict[int, torch.Tensor] = {}
    for m in modules:
        # (Looked up on the class: FSDP2 makes its modules instances of an FSDPModule
        # subclass, and a miss on the instance would go through Module.__getattr__.)
        get_state = getattr(type(m), "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = getattr(get_state(m), "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", ()) if group is not None else ():
            local = fp._sharded_local_tensor
            out[id(fp.sharded_param)] = local
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None:
                out[id(unsharded)] = local
    return out


def local_state(t: torch.Tensor, owner: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """The tensor whose bytes a declared ``t`` is preserved by: its local shard
    when ``t`` is a DTensor or an FSDP-managed parameter, else ``t`` itself."""
    if owner is not None and id(t) in owner:
        return owner[id(t)]
    local = getattr(t, "_local_tensor", None)  # DTensor
    return local if isinstance(local, torch.Tensor) else t


def owners(
    module: torch.nn.Module, modules: Iterable[torch.nn.Module] | None = None
) -> dict[int, torch.Tensor] | None:
    """:func:`_unsharded_to_local` of ``module`` (or of its ``modules``, when the caller
    has walked them already) when FSDP is in use, else None (no cost)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    return _unsharded_to_local(module.modules() if modules is None else modules) or None
