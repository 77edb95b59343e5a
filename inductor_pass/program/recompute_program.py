"""Recomputation candidates and their rewriting of a wrapper program.

The program side of Note [Recomputation in the wrapper] (``inductor_pass/stages/recompute.py``
chooses among the candidates and runs the stage): :func:`find_candidate` and
:func:`candidates` find ``(S, q)`` pairs and their replay chains, :func:`apply` rewrites a
:class:`Program` so that ``S`` is freed after its last use before ``q`` and rebuilt before ``q``.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from dataclasses import dataclass, field

from inductor_pass.program.units import ProgramModel, simulate
from inductor_pass.program.wrapper_ast import Stmt, StmtKind, Wrapper

__all__ = [
    "Candidate",
    "Program",
    "RecomputeResult",
    "Refused",
    "apply",
    "candidates",
    "find_candidate",
    "levels",
    "returned_names",
    "single_operator_bound",
    "stmt_storages",
]


class Refused(Exception):
    """A candidate cannot be recomputed soundly (the message says why)."""


@dataclass(kw_only=True, slots=True)
class Program:
    """A statement order over a (possibly extended) model."""

    model: ProgramModel
    order: list[int]
    returned: frozenset[str]
    origin: dict[int, int] = field(default_factory=dict)
    """Statement index -> the original region statement it replays (its own index
    for original statements)."""
    block: set[int] = field(default_factory=set)
    """Statements of replay blocks (replayed units, allocations, moved and new ``del``)."""
    lineage: dict[int, int] = field(default_factory=dict)
    """Fresh storage -> the original storage it copies."""


@dataclass(kw_only=True, slots=True)
class Candidate:
    storage: int
    q_stmt: int
    """Statement index of the late use."""
    p_stmt: int
    chain: list[int]
    """Unit statement indices replayed (program order)."""
    copies: frozenset[int]
    postponed: list[str]
    names: list[str]
    """Names of the storage (for the report)."""
    size: int
    rebuild_dead: bool = True
    cost: int = 0
    macs: int = 0


@dataclass(kw_only=True, slots=True)
class RecomputeResult:
    program: Program
    peak: int
    applied: list[Candidate]
    total_cost: int
    total_macs: int
    note: str = ""


def returned_names(wrapper: Wrapper) -> frozenset[str]:
    """Names in the wrapper's ``return`` statement."""
    ret = wrapper.call_node.body[-1]
    out: set[str] = set()
    for n in ast.walk(ret):
        if isinstance(n, ast.Name):
            out.add(n.id)
    return frozenset(out)


def stmt_storages(model: ProgramModel, k: int) -> frozenset[int]:
    """Storages statement ``k`` reads or writes."""
    return model.reads.get(k, frozenset()) | model.writes.get(k, frozenset())


def single_operator_bound(model: ProgramModel) -> tuple[int, int | None]:
    """``max_k`` of a unit's counted accessed storages plus its new bytes (transient).

    Every program computing the same kernels, with or without recomputation,
    runs each unit with its inputs live, so this bounds every peak from below.

    Returns:
        ``(bound, unit)``.
    """
    best, arg = 0, None
    region = model.wrapper.region
    for st in region:
        if st.kind is not StmtKind.UNIT:
            continue
        k = st.index
        created = set(model.storages_of(st.defines))
        held = {s for s in stmt_storages(model, k) - created if model.counted(s)}
        b = sum(model.sizes[s] for s in held) + model.transient[k]
        if b > best:
            best, arg = b, k
    return best, arg


def levels(model: ProgramModel, order: list[int]) -> list[int]:
    """Per position: the most bytes live while the statement runs."""
    _, trace = simulate(model, order)
    out = []
    prev = _initial_live(model)
    for k, after in zip(order, trace, strict=True):
        out.append(max(prev + model.transient[k], after))
        prev = after
    return out


def _initial_live(model: ProgramModel) -> int:
    seen: set[int] = set()
    for n in model.wrapper.input_names:
        for s in model.name_storages.get(n, ()):
            if s in model.owned:
                seen.add(s)
    return sum(model.sizes[s] for s in seen)


def _rename_stmt(st: Stmt, mapping: dict[str, str], index: int) -> Stmt:
    node = copy.deepcopy(st.node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in mapping:
            n.id = mapping[n.id]
    text = ast.unparse(node)
    return Stmt(
        index=index,
        node=node,
        kind=st.kind,
        text=text,
        comments=[],
        defines=[mapping.get(n, n) for n in st.defines],
        deletes=[mapping.get(n, n) for n in st.deletes],
        uses=[mapping.get(n, n) for n in st.uses],
        callee=st.callee,
        alias_of=mapping.get(st.alias_of, st.alias_of) if st.alias_of else None,
    )


def _del_stmt(name: str, index: int) -> Stmt:
    node = ast.parse(f"del {name}").body[0]
    return Stmt(
        index=index,
        node=node,
        kind=StmtKind.DEL,
        text=f"del {name}  # recompute: freed early",
        comments=[],
        defines=[],
        deletes=[name],
        uses=[name],
    )


def _bound_at(model: ProgramModel, order: list[int], pos: int) -> set[str]:
    """Names bound just before position ``pos``."""
    bound = set(model.wrapper.input_names)
    region = model.wrapper.region
    for k in order[:pos]:
        bound.update(region[k].defines)
        bound.difference_update(region[k].deletes)
    return bound


def find_candidate(
    prog: Program, storage: int, q_stmt: int, *, max_chain: int = 16, rebuild_dead: bool = True
) -> Candidate:
    """The recomputation of ``storage`` for its use at statement ``q_stmt``.

    Args:
        rebuild_dead: Recompute, rather than keep alive, an internal storage the
            chain reads that is freed before ``q`` (False: postpone its ``del``).

    Raises:
        Refused: It cannot be done soundly (Note [Recomputation in the wrapper]).
    """
    model, order = prog.model, prog.order
    region = model.wrapper.region
    pos = {k: i for i, k in enumerate(order)}
    if q_stmt not in pos:
        raise Refused("statement gone")
    q_pos = pos[q_stmt]
    units = [k for k in order if region[k].kind is StmtKind.UNIT]
    acc = {k: stmt_storages(model, k) for k in units}
    if storage in model.external or not model.counted(storage):
        raise Refused("the storage exists before the run")
    before = [k for k in units if pos[k] < q_pos and storage in acc[k]]
    if not before:
        raise Refused("no earlier access")
    p_stmt = before[-1]
    p_pos = pos[p_stmt]
    s_names = [n for n, ss in model.name_storages.items() if storage in ss]
    for n in s_names:
        if model.name_storages[n] != frozenset([storage]):
            raise Refused(f"name {n} refers to several storages")
        if n in prog.returned:
            raise Refused(f"name {n} is returned")
    s_set = set(s_names)
    for k in order[p_pos + 1 : q_pos]:
        st = region[k]
        if st.kind is not StmtKind.DEL and s_set & (set(st.uses) | set(st.defines)):
            raise Refused(f"statement {k} names the storage between its uses")
    if q_pos - p_pos < 2:
        raise Refused("no gap")

    writers: dict[int, list[int]] = {}
    for k in units:
        for s in model.writes.get(k, ()):
            writers.setdefault(s, []).append(k)

    bound_q = _bound_at(model, order, q_pos)
    chain: set[int] = set()
    copies: set[int] = {storage}
    changed = True
    while changed:
        changed = False
        # Units writing a copied storage before a replayed unit touches it, or before q.
        for s in list(copies):
            if s in model.external:
                raise Refused("a storage of the chain exists before the run (an input)")
            horizon = [q_pos] if s == storage else []
            horizon += [pos[w] for w in chain if s in acc[w]]
            t = max(horizon) if horizon else -1
            for w in writers.get(s, []):
                if pos[w] < t and w not in chain:
                    chain.add(w)
                    changed = True
        for w in list(chain):
            if w in model.barriers:
                raise Refused(f"unit {w} ({region[w].callee}) is a barrier")
            for s in model.writes.get(w, ()):
                if s not in copies:
                    copies.add(s)
                    changed = True
            for s in model.reads.get(w, ()):
                if s in copies:
                    continue
                if any(pos[w] < pos[u] < q_pos for u in writers.get(s, [])):
                    copies.add(s)  # overwritten before q (buffer reuse, in-place)
                    changed = True
                elif rebuild_dead and model.counted(s) and s not in model.external:
                    if not any(s in model.name_storages.get(n, ()) for n in bound_q):
                        copies.add(s)  # freed before q: rebuild it rather than keep it
                        changed = True
        if len(chain) > max_chain:
            raise Refused(f"chain longer than {max_chain} units")
    chain_list = sorted(chain, key=pos.__getitem__)
    # Names: those of copies are renamed; none may straddle.
    for n, ss in model.name_storages.items():
        if ss & copies and not ss <= copies:
            used = any(n in region[k].uses or n in region[k].defines for k in chain_list)
            if used:
                raise Refused(f"name {n} refers to copied and kept storages")
    postponed: list[str] = []
    for w in chain_list:
        for n in region[w].uses:
            ss = model.name_storages.get(n, frozenset())
            if ss and ss <= copies:
                continue
            if n not in bound_q and n not in postponed:
                postponed.append(n)
    return Candidate(
        storage=storage,
        q_stmt=q_stmt,
        p_stmt=p_stmt,
        chain=chain_list,
        copies=frozenset(copies),
        postponed=postponed,
        names=sorted(s_names),
        size=model.sizes[storage],
        rebuild_dead=rebuild_dead,
    )


def candidates(prog: Program, *, max_chain: int = 16) -> list[Candidate]:
    """One candidate per (counted internal storage, use after a gap), the latest gap first."""
    model, order = prog.model, prog.order
    region = model.wrapper.region
    seen: set[tuple[int, int]] = set()
    out = []
    first: dict[int, int] = {}  # storage -> position of its first access (a stable key)
    for i, k in enumerate(order):
        for s in stmt_storages(model, k):
            first.setdefault(s, i)
    for k in order:
        if region[k].kind is not StmtKind.UNIT:
            continue
        for s in sorted(model.reads.get(k, ()), key=first.__getitem__):
            if (s, k) in seen or s in model.external:
                continue
            seen.add((s, k))
            best = None
            for rebuild in (True, False):
                try:
                    c = find_candidate(prog, s, k, max_chain=max_chain, rebuild_dead=rebuild)
                    one = apply(prog, c, "rcx")
                except Refused:
                    continue
                pk = simulate(one.model, one.order)[0]
                if best is None or pk < best[0]:
                    best = (pk, c)
            if best is not None:
                out.append(best[1])
    return out


def apply(prog: Program, cand: Candidate, tag: str) -> Program:
    """The program with ``cand`` applied (Note [Recomputation in the wrapper]).

    Raises:
        Refused: The candidate no longer applies to ``prog``.
    """
    model, order = prog.model, prog.order
    region = list(model.wrapper.region)
    if cand.q_stmt not in order or cand.p_stmt not in order:
        raise Refused("statement gone")
    pos = {k: i for i, k in enumerate(order)}
    q_pos, p_pos = pos[cand.q_stmt], pos[cand.p_stmt]
    name_storages = dict(model.name_storages)
    sizes = dict(model.sizes)
    transient = list(model.transient)
    reads, writes = dict(model.reads), dict(model.writes)
    origin = dict(prog.origin)
    fresh: dict[int, int] = {}
    lineage = dict(prog.lineage)
    nxt = max([*sizes, -1]) + 1
    for s in sorted(cand.copies):
        fresh[s] = nxt
        lineage[nxt] = lineage.get(s, s)
        sizes[nxt] = sizes[s]
        nxt += 1
    rename = {n: f"{n}_{tag}" for n, ss in model.name_storages.items() if ss and ss <= cand.copies}
    for n, new in rename.items():
        if new in name_storages:
            raise Refused(f"name {new} exists")
        name_storages[new] = frozenset(fresh[s] for s in model.name_storages[n])
    s_names = {n for n, ss in model.name_storages.items() if ss == frozenset([cand.storage])}
    bound_q = _bound_at(model, order, q_pos)
    chain = set(cand.chain)

    only_s = {cand.storage: fresh[cand.storage]}

    def new_stmt(st: Stmt, mapping: dict[str, str], orig: int, smap: dict[int, int]) -> int:
        idx = len(region)
        region.append(_rename_stmt(st, mapping, idx))
        transient.append(model.transient[st.index])
        origin[idx] = origin.get(orig, orig)
        if st.kind is StmtKind.UNIT:
            reads[idx] = frozenset(smap.get(s, s) for s in model.reads.get(st.index, ()))
            writes[idx] = frozenset(smap.get(s, s) for s in model.writes.get(st.index, ()))
        return idx

    def del_of(name: str) -> int:
        idx = len(region)
        region.append(_del_stmt(name, idx))
        transient.append(0)
        return idx

    replay: list[int] = []
    defined_in_replay: set[str] = set()
    for k in order[:q_pos]:
        st = region[k]
        if k in chain:
            for n in st.uses:
                if n in rename and rename[n] not in defined_in_replay:
                    raise Refused(f"name {n} is not bound in the replay")
            replay.append(new_stmt(st, rename, k, fresh))
            defined_in_replay.update(rename[n] for n in st.defines if n in rename)
        elif (
            st.kind in (StmtKind.ALLOC, StmtKind.ALIAS)
            and st.defines
            and all(n in rename for n in st.defines)
        ):
            if st.kind is StmtKind.ALIAS and st.alias_of not in rename:
                raise Refused(f"alias {st.defines} of a kept name")
            replay.append(new_stmt(st, rename, k, fresh))
            defined_in_replay.update(rename[n] for n in st.defines)
    keep_after = {n for n in s_names if n in bound_q}
    after_map = {n: rename[n] for n in s_names}
    postponed = set(cand.postponed)
    new_order: list[int] = []
    dels_at_p = sorted(n for n in s_names if n in _bound_at(model, order, p_pos + 1))
    early = set(dels_at_p)
    block: set[int] = set(prog.block)
    for i, k in enumerate(order):
        st = region[k]
        if i == q_pos:
            start = len(new_order)
            new_order += replay
            new_order += [
                k2
                for k2 in order[:q_pos]
                if region[k2].kind is StmtKind.DEL and set(region[k2].deletes) & postponed
            ]
            for n in sorted(rename):
                if rename[n] in defined_in_replay and not (n in s_names and n in keep_after):
                    new_order.append(del_of(rename[n]))
            block.update(new_order[start:])
        if i < q_pos:
            moved = postponed | (early if i > p_pos else set())
            if st.kind is StmtKind.DEL and set(st.deletes) & moved:
                if set(st.deletes) - moved:
                    raise Refused("a del statement mixes names")
                continue
            new_order.append(k)
            if i == p_pos:
                new_order += [del_of(n) for n in dels_at_p]
        else:
            if set(st.uses) & set(after_map) or set(st.defines) & set(after_map):
                new_order.append(new_stmt(st, after_map, k, only_s))
            else:
                new_order.append(k)
    wrapper = dataclasses.replace(model.wrapper, region=region)
    new_model = dataclasses.replace(
        model,
        wrapper=wrapper,
        name_storages=name_storages,
        sizes=sizes,
        transient=transient,
        reads=reads,
        writes=writes,
        notes=list(model.notes),
    )
    return Program(
        model=new_model,
        order=new_order,
        returned=prog.returned,
        origin=origin,
        block=block,
        lineage=lineage,
    )
