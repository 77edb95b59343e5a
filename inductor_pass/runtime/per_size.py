"""A certified order per size for graphs with symbolic sizes (Note [Per-size orders])."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from inductor_pass.config import PassConfig
from inductor_pass.report import GraphReport, record
from inductor_pass.runtime.first_call import FirstCallPass
from inductor_pass.variants.choose import Program, Variant

__all__ = ["SizeDispatch", "size_key"]

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _symbols(value: Any) -> set[Any] | None:
    """The free symbols of a symbolic scalar (empty for a plain one); None when unknown."""
    if not isinstance(value, _SYM):
        return set()
    try:
        return set(value.node.expr.free_symbols)
    except Exception:
        return None


def _expr(value: Any) -> str | None:
    """A symbolic scalar's expression (``s77``, ``2*s77``), else None."""
    try:
        return str(value.node.expr)
    except Exception:
        return None


def size_key(
    example_inputs: Sequence[Any],
) -> tuple[Callable[[list[Any]], Any], Callable[[list[Any]], str]]:
    """The per-size key of a call's inputs, and a description of the sizes for reports.

    The key is the tuple of the inputs that are symbolic scalars in
    ``example_inputs`` (the size symbols: the wrapper's ``call`` receives them as
    Python ints), plus the shape, strides and offset of each tensor whose symbolic
    metadata uses a symbol no scalar input carries. Neither holds a tensor, so a
    call's input ownership is untouched (Note [Input ownership] in
    ``inductor_pass/stages/guard.py``).

    Returns:
        ``(key, describe)``: ``key(args)`` is hashable; ``describe(args)`` reads
        ``s77=16, 2*s77=32`` (``input 2 shape (16, 64)`` for a tensor in the key).
    """
    scalars = [i for i, x in enumerate(example_inputs) if isinstance(x, _SYM)]
    covered: set[Any] = set()
    for i in scalars:
        covered |= _symbols(example_inputs[i]) or set()
    tensors = []
    for j, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        meta = (*x.shape, *x.stride(), x.storage_offset())
        used = [_symbols(s) for s in meta]
        if any(u is None or not u <= covered for u in used):
            tensors.append(j)
    names = [_expr(example_inputs[i]) or f"input {i}" for i in scalars]

    if not tensors and len(scalars) == 1:
        key: Callable[[list[Any]], Any] = operator.itemgetter(scalars[0])
    elif not tensors:
        key = operator.itemgetter(*scalars)
    else:

        def key(args: list[Any]) -> Any:
            metas = tuple(_meta(args[j]) for j in tensors)
            return (*(args[i] for i in scalars), metas)

    def describe(args: list[Any]) -> str:
        parts = [f"{n}={args[i]}" for n, i in zip(names, scalars, strict=True)]
        parts += [f"input {j} shape {tuple(args[j].shape)}" for j in tensors]
        return ", ".join(parts)

    return key, describe


def _meta(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    return (tuple(x.shape), x.stride(), x.storage_offset())


class SizeDispatch:
    """The program of a graph with symbolic sizes: one certified order per size.

    Note [Per-size orders]
    A modelled peak, a lower bound and the guard's byte-exact measurement hold
    for one size: buffer sizes are polynomials in the size symbols, so the
    order with the lowest peak can change with the size, and a symbolic bound
    over a range of sizes would need the profile (effects, transient bytes of
    extern kernels, input ownership) at every size. The wrapper's ``call``
    receives concrete Python ints for the symbols, so each size is treated as a
    static graph at its own first call: a :class:`FirstCallPass` profiles the
    program on copies of that call's real inputs (Note [Profiling on real
    inputs]), searches, proves bounds and runs the guard, and the first call of
    the size runs Inductor's program afterwards. The chosen callable (the
    permuted program when the guard deployed it, else Inductor's) is kept in a
    dict keyed by the call's sizes (:func:`size_key`): a call at a size already
    seen costs a key of a few ints and a dict lookup. Each size gets its own
    report (``GraphReport.size``); the decision cache is keyed per size already
    (its call signature holds the ints and shapes). At most
    ``PassConfig.max_sizes`` sizes are handled; the next new size is reported
    once as left unchanged, and it and every later new size run Inductor's
    program. Variant programs are not compiled for symbolic graphs (each would
    be compiled once and profiled per size); the default program is permuted.
    Any exception inside the pass leaves Inductor's program for that size
    (the report says why); programs with observable calls are left unchanged at
    every size without running (Note [Observable calls]).
    """

    def __init__(
        self, program: Program, kind: str, config: PassConfig, example_inputs: Sequence[Any]
    ) -> None:
        self.original = program.call
        self.program = program
        self.kind = kind
        self.config = config
        self.key, self.describe = size_key(example_inputs)
        self.impls: dict[Any, Callable[[list[Any]], Any]] = {}
        """Per size key: the callable that runs it."""
        self.sizes: list[str] = []
        """The sizes handled by the pass, in the order first seen."""
        self.capped = False
        self.variants: list[Variant] = []
        """Always empty (:func:`inductor_pass.runtime.variant_compile` compiles none)."""
        self.variant_notes: list[str] = []

    def __call__(self, args: list[Any]) -> Any:
        impl = self.impls.get(self.key(args))
        if impl is not None:
            return impl(args)
        return self._new_size(args)

    def _new_size(self, args: list[Any]) -> Any:
        config = self.config
        try:
            key, size = self.key(args), self.describe(args)
        except Exception:  # pragma: no cover - a key of ints and shapes
            return self.original(args)
        if len(self.sizes) >= config.max_sizes:
            self.impls[key] = self.original
            if not self.capped:
                self.capped = True
                why = (
                    f"left unchanged: {len(self.sizes)} sizes of this graph have their "
                    f"order (PassConfig.max_sizes={config.max_sizes}); this and every later "
                    "new size run Inductor's program"
                )
                rep = GraphReport(kind=self.kind, size=size, reason=why)
                rep.original_source = self.program.source
                record(rep, print_it=config.report, dump_dir=config.dump_dir)
            return self.original(args)
        self.sizes.append(size)
        first = FirstCallPass(self.program, self.kind, config, size=size)
        first.variant_notes.append(
            "no variant programs for a graph with symbolic sizes (Note [Per-size orders])"
        )
        self.impls[key] = self.original  # until the pass below has chosen
        out = first(args)  # the pass, on copies; then Inductor's program on ``args``
        self.impls[key] = first.impl
        return out
