"""Data-dependent sizes: which bytes of a program change from call to call, and orders
that are no higher than the original one at every size.

Note [Data-dependent sizes]
A graph whose routing decides sizes (``torch.nonzero``, boolean-mask indexing,
``torch.unique``, ``.item()`` with ``capture_scalar_outputs``) has *unbacked*
symbols: Inductor's wrapper binds each from data right after the operator that
decides it (a size query, ``u0 = buf2.size(0)`` or ``u0 = buf0.item()``), checks
what the kernels assume of it (``if not (u0 <= 128): raise RuntimeError(...)``,
a runtime check) and passes it to every kernel and allocation that depends on
it (``empty_strided_cpu((u0, 64), ...)``). The wrapper parser
(``inductor_pass/program/wrapper_ast.py``) makes each such statement one unit; the
dependences (``inductor_pass/program/units.py``) keep a size query before every
use of its symbol, and a runtime check before the later units that use what it
tests and in place among the units that write a storage the caller holds, so a
failing check raises before anything it guards runs, and leaves the caller's
tensors as Inductor's program would.

The profile, the byte-exact model and the guard hold for the first call's sizes
only; the program the pass deploys runs at every later call, whose routing
differs. So the pass admits an order only when it is provably no higher than
the original order at *every* size (:func:`no_higher_at_every_size`):

- :func:`varying` splits the program's bytes into *static* ones, whose sizes
  do not depend on the data (inputs, constants, buffers of fixed shape, and the
  transient bytes of statements that touch nothing data-dependent: measured
  once, exact at every call), and *varying* ones, each an unknown number
  ``>= 0`` of its own: a storage allocated with a symbol in its size, the result
  of an operator whose output shape depends on data (``Tag.dynamic_output_shape``,
  ``Tag.data_dependent_output``), of a callee with unknown effects, or of a unit
  that reads a varying storage or a symbol, a storage whose size a size query
  reads; and the transient bytes of every unit that touches one of them.
- The modelled peak of an order is the largest of its terms (Note [Wrapper
  memory model]: before each statement plus its transient, after each
  statement), each term a static byte count plus a set of unknowns.
  :func:`size_terms` lists them.
- An order is no higher at every size when each of its terms is *dominated*
  by a term of the original order: no more static bytes and a subset of its
  unknowns. Then for any sizes (any values of the unknowns, and the real ones
  are such values) each term is at most the original order's peak. The
  unknowns being independent, this is sufficient, not necessary: an order the
  rule rejects may still be lower at every size, and it is not deployed.
  The orders best at the profiled sizes often move a data-dependent unit
  (the bytes of a ``nonzero`` are small at that call), and are not admitted;
  so the search adds the best order that keeps every other unit between the
  same two data-dependent units (:func:`segment_edges`).

A varying buffer that is empty at the profiled call has no storage the profile
can see, so its dependences could be missed at a call where it is not empty:
such a graph keeps its order (:func:`varying` returns the reason). So does the
program's choice among Inductor's variants (``inductor_pass/runtime/first_call.py``)
and selective recomputation (``inductor_pass/stages/search.py``), both decided by
peaks at one size.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from inductor_pass.program.units import ProgramModel
from inductor_pass.program.wrapper_ast import QUERY_CALLEES, Stmt, StmtKind, Wrapper

__all__ = [
    "Varying",
    "no_higher_at_every_size",
    "segment_edges",
    "size_terms",
    "unbacked_symbols",
    "varying",
]

_SHAPE_QUERIES = frozenset(
    {"Tensor.size", "Tensor.stride", "Tensor.numel", "Tensor.storage_offset"}
)
"""Size queries whose tensor's size is data-dependent (``.item()`` reads a value instead)."""


@dataclass(kw_only=True, slots=True)
class Varying:
    """What changes with the data in a program (Note [Data-dependent sizes])."""

    symbols: tuple[str, ...]
    """The unbacked symbols, in the order the program binds them."""
    storages: frozenset[int]
    """Storages whose bytes may differ from call to call."""
    statements: frozenset[int]
    """Region statements whose transient bytes may differ from call to call."""


def unbacked_symbols(wrapper: Wrapper) -> list[str]:
    """Names bound from data: by a size query, or inside an ``if`` statement."""
    out: list[str] = []
    for st in wrapper.region:
        if st.kind is StmtKind.UNIT and (st.callee in QUERY_CALLEES or isinstance(st.node, ast.If)):
            out += [n for n in st.defines if n not in out]
    return out


def _shape_from_data(st: Stmt, wrapper: Wrapper, resolve: Callable[[str], object] | None) -> bool:
    """Whether a unit's results may have a size decided by data or unknown."""
    callee = st.callee or ""
    if isinstance(st.node, ast.If):
        return True
    if callee.removesuffix(".run") in wrapper.kernels or callee.startswith("extern_kernels."):
        return False  # generated kernels bind nothing; extern kernels: sizes from their inputs
    obj = None
    if resolve is not None and callee:
        try:
            obj = resolve(callee)
        except Exception:
            obj = None
    if obj is not None and getattr(obj, "_schema", None) is None and hasattr(obj, "default"):
        obj = obj.default  # an OpOverloadPacket: the default overload's tags
    if obj is None or getattr(obj, "_schema", None) is None:
        return True  # unknown callee: anything
    import torch

    tags = getattr(obj, "tags", ()) or ()
    return torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags


def varying(model: ProgramModel, resolve: Callable[[str], object] | None) -> Varying | str | None:
    """The varying bytes of a profiled program (Note [Data-dependent sizes]).

    Args:
        model: The profiled program's model (its ``name_storages`` filled).
        resolve: Callee resolver (operator tags).

    Returns:
        None when the program binds no unbacked symbol (every size is static);
        a reason string when its data-dependent buffers cannot be modelled (the
        graph keeps its order); else a :class:`Varying`.
    """
    w = model.wrapper
    symbols = unbacked_symbols(w)
    if not symbols:
        return None
    syms = set(symbols)
    queried: set[int] = set()
    for st in w.region:
        if st.callee in _SHAPE_QUERIES:
            queried |= model.storages_of(st.uses)
    storages: set[int] = set()
    statements: set[int] = set()
    vnames: set[str] = set(syms)
    for st in w.region:
        if st.kind is StmtKind.ALIAS and st.alias_of in vnames:
            vnames.update(st.defines)
        if st.kind not in (StmtKind.UNIT, StmtKind.ALLOC):
            continue
        if st.callee in QUERY_CALLEES or st.check_if:
            continue  # they read names and allocate nothing
        results = model.storages_of(st.defines) - model.external
        touches = bool(set(st.uses) & vnames) or bool(model.storages_of(st.uses) & storages)
        if st.kind is StmtKind.UNIT:
            vary = touches or bool(results & queried) or _shape_from_data(st, w, resolve)
        else:
            vary = touches or bool(results & queried)
        if not vary:
            continue
        statements.add(st.index)
        storages |= results
        vnames.update(st.defines)
    nothing = {
        n
        for st in w.region
        if st.kind is StmtKind.ALIAS and st.alias_of is None
        for n in st.defines
    }
    for n in sorted(vnames - syms - nothing):
        if not model.name_storages.get(n):
            return (
                f"data-dependent buffer {n} was empty at the profiled call, so its "
                "dependences are not seen (Note [Data-dependent sizes])"
            )
    return Varying(
        symbols=tuple(symbols), storages=frozenset(storages), statements=frozenset(statements)
    )


Term = tuple[int, frozenset[tuple[str, int]]]
"""Static bytes, and the unknowns added to them (``("s", storage)``, ``("t", statement)``)."""


def size_terms(model: ProgramModel, vary: Varying, order: list[int]) -> list[Term]:
    """The terms whose largest is an order's modelled peak at any size (see the Note).

    Mirrors :func:`inductor_pass.program.units.simulate`, with every varying storage
    and every varying statement's transient an unknown.
    """
    ref: Counter[int] = Counter()
    for n in model.wrapper.input_names:
        for s in model.name_storages.get(n, ()):
            if s in model.owned:
                ref[s] += 1
    static = sum(model.sizes[s] for s in ref if s not in vary.storages)
    unknown: set[tuple[str, int]] = {("s", s) for s in ref if s in vary.storages}
    terms: list[Term] = [(static, frozenset(unknown))]
    region = model.wrapper.region
    for k in order:
        st = region[k]
        if k in vary.statements:
            terms.append((static, frozenset(unknown | {("t", k)})))
        else:
            terms.append((static + model.transient[k], frozenset(unknown)))
        for n in st.defines:
            for s in model.name_storages.get(n, ()):
                if model.counted(s):
                    if ref[s] == 0:
                        static, unknown = _add(model, vary, s, 1, static, unknown)
                    ref[s] += 1
        for n in st.deletes:
            for s in model.name_storages.get(n, ()):
                if model.counted(s):
                    ref[s] -= 1
                    if ref[s] == 0:
                        static, unknown = _add(model, vary, s, -1, static, unknown)
        terms.append((static, frozenset(unknown)))
    return terms


def _add(
    model: ProgramModel, vary: Varying, s: int, step: int, static: int, unknown: set
) -> tuple[int, set]:
    """Storage ``s`` becomes live (``step`` 1) or is freed (-1)."""
    if s not in vary.storages:
        return static + step * model.sizes[s], unknown
    (unknown.add if step > 0 else unknown.discard)(("s", s))
    return static, unknown


def segment_edges(model: ProgramModel, vary: Varying, units: list[int]) -> set[tuple[int, int]]:
    """Precedences that keep every unit on its side of each data-dependent unit.

    The data-dependent units (size queries, runtime checks, ``if`` statements
    and the units whose transient varies) keep their original order, and the
    other units are permuted only between two of them: so the data-dependent
    bytes live at each point are those of the original order, which is what
    :func:`no_higher_at_every_size` asks. Orders searched under these edges
    are candidates, scored and admitted on the real model like the others.
    """
    region = model.wrapper.region
    pinned = [
        u
        for u in units
        if u in vary.statements
        or region[u].callee in QUERY_CALLEES
        or isinstance(region[u].node, ast.If)
    ]
    pinned_set = set(pinned)
    edges = set(zip(pinned, pinned[1:], strict=False))
    for u in units:
        if u not in pinned_set:
            edges.update((u, p) if u < p else (p, u) for p in pinned)
    return edges


def no_higher_at_every_size(
    model: ProgramModel, vary: Varying, order: list[int], original: list[int] | None = None
) -> str | None:
    """None when every term of ``order`` is dominated by one of ``original`` (the
    region's own order when None), else why not (see the Note)."""
    if original is None:
        original = list(range(len(model.wrapper.region)))
    best: dict[frozenset[tuple[str, int]], int] = {}
    for c, v in size_terms(model, vary, original):
        best[v] = max(best.get(v, c), c)
    mine: dict[frozenset[tuple[str, int]], int] = {}
    for c, v in size_terms(model, vary, order):
        mine[v] = max(mine.get(v, c), c)
    for v, c in mine.items():
        if not any(v <= v2 and c <= c2 for v2, c2 in best.items()):
            return (
                f"not provably no higher at every data-dependent size ({c} static bytes "
                f"with {len(v)} data-dependent term(s) dominated by no term of the original)"
            )
    return None
