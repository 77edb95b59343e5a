"""Copies of FX graphs for another compile, and what a graph's sizes depend on.

Shared by the rooms that compile a graph more than once: program variants
(``variant_compile``), C++ wrappers' Python twins (``cpp_wrapper``) and AOTInductor
packages (``aoti``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from inductor_pass.stages import guard

__all__ = ["binds_unbacked_symbols", "copy_graph"]


def copy_graph(gm: Any) -> Any:
    """A deep copy of ``gm`` for another compile (Inductor's passes rewrite a graph in place).

    Taken outside the tracing's fake mode: a graph can hold real tensors (a
    constant such as ``torch.tensor([1.0, 2.0])`` in the user's code is a
    ``_tensor_constant`` attribute), and copying one under the fake mode fails
    in ``aten.set_`` (its storage is not on the ``meta`` device), after
    ``FakeTensorMode`` has logged the failure at ERROR level. A frozen graph's
    mkldnn constants are shared, not copied (``deepcopy`` cannot copy them).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Opaque constants (a frozen graph's prepacked weights) cannot be copied, and need not
    # be: the copy shares them, read only, as the default program does (Note [Opaque tensors]).
    memo: dict[int, Any] = {}
    for module in gm.modules():
        for value in (*vars(module).values(), *module._buffers.values()):
            if isinstance(value, torch.Tensor) and guard.is_opaque(value):
                memo[id(value)] = value
    with unset_fake_temporarily():
        return copy.deepcopy(gm, memo)


def binds_unbacked_symbols(gm: Any) -> bool:
    """Whether a node of ``gm`` has a size decided by data (an unbacked symbol).

    Such a graph's program is never chosen among variants by its peak at one size
    (Note [Data-dependent sizes] in ``inductor_pass/program/unbacked.py``), so its
    variants are not compiled at all. Unsure (no metadata, an unknown value): False,
    and the first call drops them as before.
    """
    try:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        return any(
            free_unbacked_symbols(node.meta["val"]) for node in gm.graph.nodes if "val" in node.meta
        )
    except Exception:
        return False
