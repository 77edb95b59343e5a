"""Units, storages, dependences, emission and the byte-exact peak model (design.md §3.1).

Note [Wrapper memory model]
A *storage* is one allocation (keyed by its data pointer in the profiled run).
Every name of the wrapper refers to a set of storages (a tensor: its storage;
a tuple of fallback outputs: all of theirs). Storages that exist before the
run (inputs, constants) are *external*. An external storage the caller holds
(parameters, user inputs, constants) is never freed during the run and is not
counted. An external storage the call *owns* (an input referenced only by the
argument list that the wrapper clears, see Note [Input ownership] in
``inductor_pass/stages/guard.py``: a backward graph's saved activations) is live
from the start and freed by the ``del`` that removes the last name referring
to it. An internal storage is live while at least one bound name refers to
it: it is allocated when the first such name is bound and freed by the
``del`` that removes the last one. Each statement ``k`` also has a *transient* ``t[k]``: the
largest number of bytes above the live count seen while it runs (profiled
once; it includes the statement's own results and any workspace). The
modelled peak of a statement sequence is ``max_k(live_before(k) + t[k])``.
The model is checked against the profile: every statement's live-byte delta
must equal the modelled one (ownership and completion records), otherwise the
graph keeps its order.

Units are the kernel-call statements (``StmtKind.UNIT``), size queries and
``if`` statements (Note [Data-dependent sizes] in
``inductor_pass/program/unbacked.py``). Dependences are
per storage in original order: read-after-write, write-after-read and
write-after-write; reads of one generation may reorder among themselves.
Every name a unit (or an allocation attached to it) uses follows the unit
that binds it, so a symbol bound by a size query precedes its uses. A
runtime check (``if not (u0 <= 128): raise ...``) precedes the later units
that use a name it tests, and keeps its place among the units that write a
storage the caller holds (what a raise would leave visible). Calls with
unknown effects, ``if`` statements that are not runtime checks and
seeded-random ops are barriers (ordered with
every unit). Emission (:func:`emit`) writes every statement once: an
allocation immediately before the unit that first touches its storage, then
aliases, checks and ``del`` statements as early as their names allow.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from inductor_pass.program.wrapper_ast import QUERY_CALLEES, Stmt, StmtKind, Wrapper

__all__ = [
    "ProgramModel",
    "EmissionError",
    "declared_effects",
    "static_storages",
    "build_dependences",
    "emit",
    "simulate",
]


class EmissionError(Exception):
    """A unit order cannot be emitted (a name would be used before it is bound)."""


@dataclass(kw_only=True, slots=True)
class ProgramModel:
    """Everything the permutation needs about one wrapper (see Note [Wrapper memory model])."""

    wrapper: Wrapper
    name_storages: dict[str, frozenset[int]]
    """Storages each name refers to (names absent here refer to no tensor)."""
    sizes: dict[int, int]
    """Bytes of each storage."""
    external: frozenset[int]
    """Storages that exist before the run."""
    transient: list[int]
    """Per region statement: peak bytes above the live count while it runs."""
    reads: dict[int, frozenset[int]] = field(default_factory=dict)
    """Per unit statement index: storages read."""
    writes: dict[int, frozenset[int]] = field(default_factory=dict)
    """Per unit statement index: storages written (new results included)."""
    barriers: frozenset[int] = frozenset()
    """Unit statement indices ordered with every other unit."""
    owned: frozenset[int] = frozenset()
    """External storages the call owns: live from the start, freed at the last ``del``
    (the others are held by the caller and never counted)."""
    notes: list[str] = field(default_factory=list)

    def counted(self, s: int) -> bool:
        """Whether storage ``s`` is allocated or freed during the run."""
        return s not in self.external or s in self.owned

    @property
    def units(self) -> list[int]:
        return [s.index for s in self.wrapper.region if s.kind is StmtKind.UNIT]

    def storages_of(self, names: list[str]) -> set[int]:
        out: set[int] = set()
        for n in names:
            out |= self.name_storages.get(n, frozenset())
        return out


def declared_effects(
    st: Stmt, wrapper: Wrapper, resolve: Callable[[str], object] | None
) -> tuple[set[str], bool]:
    """Names a unit statement may write, and whether it is a barrier.

    Args:
        st: A ``UNIT`` statement.
        wrapper: Its wrapper (for kernel signatures).
        resolve: Maps a dotted callee to its object (``torch.ops`` overloads
            carry schemas), or None.

    Returns:
        ``(written_names, barrier)``. Names bound by the statement are new
        results and are not listed. Unknown callees write every argument and
        are barriers; so do ``if`` statements other than runtime checks. Size
        queries and runtime checks write nothing.
    """
    import ast

    from inductor_pass.program.kernel_sigs import names_in

    if st.callee in QUERY_CALLEES or st.check_if:  # reads its names, writes nothing
        return set(), False
    if isinstance(st.node, ast.If):  # an `if` that is no runtime check: unknown effects
        return set(st.uses) | set(st.defines), True
    call = st.node.value  # type: ignore[attr-defined]
    assert isinstance(call, ast.Call)
    callee = st.callee or ""
    base = callee[: -len(".run")] if callee.endswith(".run") else callee
    sig = wrapper.kernels.get(base)
    if sig is not None:
        written: set[str] = set()
        for i, arg in enumerate(call.args):
            if i >= len(sig.writes) or sig.writes[i]:
                written.update(names_in(arg))
        return written, False
    if callee.startswith("extern_kernels."):
        written = set()
        for kw in call.keywords:
            if kw.arg == "out":
                written.update(names_in(kw.value))
        return written, False
    obj = None
    if resolve is not None:
        try:
            obj = resolve(callee)
        except Exception:
            obj = None
    schema = getattr(obj, "_schema", None)
    if schema is None and hasattr(obj, "default"):
        schema = getattr(getattr(obj, "default", None), "_schema", None)
    if schema is not None:
        import torch

        tags = getattr(obj, "tags", ()) or ()
        barrier = torch.Tag.nondeterministic_seeded in tags
        written = set()
        by_name = {a.name: a for a in schema.arguments}
        for i, arg in enumerate(call.args):
            if i < len(schema.arguments):
                ai = schema.arguments[i].alias_info
                if ai is not None and ai.is_write:
                    written.update(names_in(arg))
            else:
                written.update(names_in(arg))
        for kw in call.keywords:
            a = by_name.get(kw.arg or "")
            if a is None or (a.alias_info is not None and a.alias_info.is_write):
                written.update(names_in(kw.value))
        return written, barrier
    return set(st.uses), True


def static_storages(wrapper: Wrapper, sizes: dict[str, int] | None = None) -> ProgramModel:
    """A :class:`ProgramModel` from the source alone (no profile), for tests and dry runs.

    Each input and each ``ALLOC`` / unit result is its own storage; an
    ``ALIAS`` shares its source's storages; a size query binds no storage. Sizes default to 1 byte; the
    transient of an ``ALLOC`` or result-binding unit is its result size.
    """
    sizes = sizes or {}
    name_storages: dict[str, frozenset[int]] = {}
    size_of: dict[int, int] = {}
    nxt = 0
    external = set()
    for n in wrapper.input_names:
        name_storages[n] = frozenset([nxt])
        size_of[nxt] = sizes.get(n, 1)
        external.add(nxt)
        nxt += 1
    transient = []
    for st in wrapper.region:
        t = 0
        if st.kind is StmtKind.ALIAS:
            name_storages[st.defines[0]] = name_storages.get(st.alias_of or "", frozenset())
        elif st.kind is StmtKind.ALLOC or (
            st.kind is StmtKind.UNIT and st.callee not in QUERY_CALLEES
        ):
            for n in st.defines:
                name_storages[n] = frozenset([nxt])
                size_of[nxt] = sizes.get(n, 1)
                t += size_of[nxt]
                nxt += 1
        transient.append(t)
    return ProgramModel(
        wrapper=wrapper,
        name_storages=name_storages,
        sizes=size_of,
        external=frozenset(external),
        transient=transient,
    )


def build_dependences(
    model: ProgramModel,
    resolve: Callable[[str], object] | None = None,
    *,
    all_writes: bool = False,
) -> tuple[list[int], set[tuple[int, int]], dict[int, list[int]], list[int]]:
    """Fill ``model.reads/writes/barriers`` and compute the unit precedences.

    Args:
        model: The program model (its ``name_storages`` must be filled).
        resolve: Callee resolver for :func:`declared_effects`.
        all_writes: The ablation that treats every access as a write.

    Returns:
        ``(units, edges, attached, tail)``: unit statement indices in
        original order; precedences ``(a, b)`` between unit statement indices
        (RAW/WAR/WAW per storage, name bindings, barriers, first touch);
        ``attached[u]``: ``ALLOC`` statements emitted right before unit ``u``;
        ``tail``: allocations no unit touches (emitted at the end).
    """
    w = model.wrapper
    units = model.units
    reads: dict[int, frozenset[int]] = {}
    writes: dict[int, frozenset[int]] = {}
    barriers: set[int] = set()
    for u in units:
        st = w.region[u]
        written_names, barrier = declared_effects(st, w, resolve)
        acc = model.storages_of(st.uses) | model.storages_of(st.defines)
        wr = model.storages_of(sorted(written_names)) | model.storages_of(st.defines)
        if all_writes:
            wr = set(acc)
        reads[u] = frozenset(acc - wr)
        writes[u] = frozenset(wr)
        if barrier:
            barriers.add(u)
    model.reads, model.writes, model.barriers = reads, writes, frozenset(barriers)

    edges: set[tuple[int, int]] = set()
    accesses: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for u in units:
        for s in reads[u]:
            accesses[s].append((u, False))
        for s in writes[u]:
            accesses[s].append((u, True))
    for stor, acc in accesses.items():
        acc.sort()
        last_writer: int | None = None
        readers: list[int] = []
        for u, is_write in acc:
            if last_writer is not None and last_writer != u:
                edges.add((last_writer, u))
            if is_write:
                edges.update((r, u) for r in readers if r != u)
                last_writer, readers = u, []
            else:
                readers.append(u)
        # First touch: every access to an internal storage follows the unit its
        # allocation is attached to.
        if stor not in model.external:
            first = acc[0][0]
            edges.update((first, u) for u, _ in acc if u != first)
    for b in barriers:
        edges.update((u, b) for u in units if u < b)
        edges.update((b, u) for u in units if u > b)

    # Allocation attachment.
    attached: dict[int, list[int]] = defaultdict(list)
    tail: list[int] = []
    alloc_unit: dict[int, int] = {}
    for st in w.region:
        if st.kind is not StmtKind.ALLOC:
            continue
        stor = model.storages_of(st.defines)
        touchers = [u for u in units if stor & (reads[u] | writes[u])]
        later = [u for u in units if u > st.index]
        target = touchers[0] if touchers else (later[0] if later else None)
        if target is None:
            tail.append(st.index)
        else:
            attached[target].append(st.index)
            alloc_unit[st.index] = target
    # Name bindings: a unit needs the statement chain that binds each of its names.
    definer: dict[str, Stmt] = {}
    for st in w.region:
        for n in st.defines:
            definer[n] = st

    def root_unit(name: str, depth: int = 0) -> int | None:
        st = definer.get(name)
        if st is None or depth > len(w.region):
            return None
        if st.kind is StmtKind.UNIT:
            return st.index
        if st.kind is StmtKind.ALLOC:
            return alloc_unit.get(st.index)
        if st.kind is StmtKind.ALIAS and st.alias_of is not None:
            return root_unit(st.alias_of, depth + 1)
        return None

    def unit_uses(u: int) -> set[str]:
        """Names unit ``u`` and the allocations emitted right before it use."""
        names = set(w.region[u].uses)
        for a in attached.get(u, []):
            names.update(w.region[a].uses)
        return names

    for u in units:
        for n in unit_uses(u):
            r = root_unit(n)
            if r is not None and r != u:
                edges.add((r, u))
    # Runtime checks (Note [Data-dependent sizes] in inductor_pass/program/unbacked.py).
    bound_here = {n for st in w.region for n in st.defines}
    visible = model.external - model.owned
    for c in units:
        if not w.region[c].check_if:
            continue
        tested = set(w.region[c].uses) & bound_here
        for u in units:
            if u > c and tested & unit_uses(u):
                edges.add((c, u))
            if u != c and writes[u] & visible:
                edges.add((min(u, c), max(u, c)))
    return units, edges, dict(attached), tail


def emit(
    model: ProgramModel, unit_order: list[int], attached: dict[int, list[int]], tail: list[int]
) -> list[int]:
    """Statement order for a unit order (design.md §3.1 emission rules).

    Args:
        model: The program model.
        unit_order: A permutation of the unit statement indices.
        attached: From :func:`build_dependences`.
        tail: From :func:`build_dependences`.

    Returns:
        A permutation of all region statement indices.

    Raises:
        EmissionError: A unit would use a name that is not bound yet, or a
            statement could not be placed.
    """
    w = model.wrapper
    region = w.region
    defined_in_region = {n for st in region for n in st.defines}
    bound: set[str] = set(w.input_names)
    emitted = [False] * len(region)
    out: list[int] = []
    pending_uses: Counter[str] = Counter()
    for st in region:
        if st.kind is not StmtKind.DEL:
            for n in set(st.uses):
                pending_uses[n] += 1
    floating = [st for st in region if st.kind in (StmtKind.ALIAS, StmtKind.CHECK, StmtKind.DEL)]

    def needs_bound(names: list[str]) -> bool:
        return all(n in bound for n in names if n in defined_in_region)

    def put(st: Stmt) -> None:
        emitted[st.index] = True
        out.append(st.index)
        if st.kind is not StmtKind.DEL:
            for n in set(st.uses):
                pending_uses[n] -= 1
        bound.update(st.defines)
        bound.difference_update(st.deletes)

    def flush() -> None:
        changed = True
        while changed:
            changed = False
            for st in floating:
                if emitted[st.index]:
                    continue
                if st.kind is StmtKind.DEL:
                    ok = all(
                        (n in bound or n not in defined_in_region) and pending_uses[n] == 0
                        for n in st.deletes
                    )
                else:
                    ok = needs_bound(st.uses)
                if ok:
                    put(st)
                    changed = True

    flush()
    for u in unit_order:
        for a in attached.get(u, []):
            if not needs_bound(region[a].uses):
                raise EmissionError(f"allocation {a} uses names not bound before unit {u}")
            put(region[a])
        flush()
        if not needs_bound(region[u].uses):
            missing = [n for n in region[u].uses if n in defined_in_region and n not in bound]
            raise EmissionError(f"unit {u} uses {missing} before they are bound")
        put(region[u])
        flush()
    for a in tail:
        put(region[a])
        flush()
    if not all(emitted):
        left = [st.index for st in region if not emitted[st.index]]
        raise EmissionError(f"statements {left} could not be placed")
    return out


def simulate(model: ProgramModel, order: list[int]) -> tuple[int, list[int]]:
    """Modelled peak of a statement order (see Note [Wrapper memory model]).

    Returns:
        ``(peak, live_after)``: the peak bytes and the live bytes after each
        statement of ``order``.
    """
    ref: Counter[int] = Counter()
    for n in model.wrapper.input_names:
        for s in model.name_storages.get(n, ()):
            if s in model.owned:
                ref[s] += 1
    live = sum(model.sizes[s] for s in ref)
    peak = live
    trace: list[int] = []
    region = model.wrapper.region
    for k in order:
        st = region[k]
        peak = max(peak, live + model.transient[k])
        for n in st.defines:
            for s in model.name_storages.get(n, ()):
                if not model.counted(s):
                    continue
                if ref[s] == 0:
                    live += model.sizes[s]
                ref[s] += 1
        for n in st.deletes:
            for s in model.name_storages.get(n, ()):
                if not model.counted(s):
                    continue
                ref[s] -= 1
                if ref[s] == 0:
                    live -= model.sizes[s]
        peak = max(peak, live)
        trace.append(live)
    return peak, trace
