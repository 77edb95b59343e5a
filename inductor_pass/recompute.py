"""Selective recomputation after the certified order (docs/design.md §3.4, issue 14).

Note [Recomputation in the wrapper]
When no permutation lowers the peak, a long-lived storage ``S`` can still be
freed after its last use *before a gap* and rebuilt just before its late use
``q`` by re-emitting the kernels that wrote it. A *candidate* is ``(S, q)``:

- ``p`` is the last unit accessing ``S`` before ``q``; every name of ``S`` is
  deleted right after ``p`` (so ``S`` is freed) and, from ``q`` on, each name
  of ``S`` is renamed to a fresh copy ``S'``.
- The *chain* ``R`` is the closure of units to replay, in program order, into
  fresh storages ``X`` (``S`` among them): every unit that wrote a storage of
  ``X`` before a replayed unit accesses it, every unit writing a storage that
  a replayed unit writes (writes go only to fresh copies), and every storage
  read by a replayed unit that does not hold, at ``q``, the bytes it held
  when that unit first ran (a write in between: Inductor's buffer reuse
  ``bufB = bufA; del bufA  # reuse``, in-place kernels) joins ``X``.
- Storages read by the chain and not copied are *kept*: their bytes are
  unchanged up to ``q``; a name of one deleted before ``q`` has its ``del``
  postponed to just after the replay (for an input the caller holds this
  costs nothing; otherwise the model counts the extra lifetime).
- Allocations and aliases binding names of ``X`` before ``q`` are replayed
  too (renamed); checks are not; names of ``X`` other than ``S``'s are
  deleted after the replay.

Each replayed unit is the same kernel called on the same bytes, written into
a fresh storage of the same size and strides in the same order, so the
rebuilt ``S'`` is bitwise equal to ``S`` at ``q`` and outputs are unchanged.
A candidate is refused (never approximated) when a storage of ``X`` exists
before the run (an input), a unit of the chain is a barrier (unknown effects,
seeded random), a name refers to storages both in and out of ``X``, a name of
``S`` is returned, or a non-``del`` statement between ``p`` and ``q`` names
``S``. The recomputed program is an ordinary wrapper: the byte-exact model
(:func:`inductor_pass.units.simulate`, a replayed statement's transient is its
original's) and the guard apply unchanged, and it is deployed only when its
measured peak equals the model and is strictly lower (``rewrite.py``).

Note [Recomputation choice]
Each candidate alone is emitted and simulated; its effect is a per-position
change ``delta_i`` of the level (live bytes plus transient) of the base
program's statements, and ``E_i``, the level of its replay block at ``q_i``.
For candidates whose chains, kept storages and intervals do not interact
(series-parallel skips: the effects add), the peak of a set is
``max(max_t L(t) + sum_i delta_i(t), max_i E_i + sum_{j != i} delta_j(q_i))``
and choosing the set of least peak under the cost budget is a knapsack; it
is solved exactly by branch and bound (bound: every undecided candidate's
savings taken where they help). Candidates that lower no level are dropped;
when more than 16 remain, the 16 with the largest saving enter the search (a
documented truncation: the choice is then exact over those). The chosen set
is then applied and simulated exactly; while its exact peak is not lower or
its recounted cost exceeds the budget, the last chosen candidate is dropped.
When the effects interact (shared chains, overlapping kept storages) the
additive model is a heuristic and the exact simulation is the authority. Cost: ``MACs`` of convolution/matmul kernels
(torch's FLOP counter, flops/2) plus one per element written by other
kernels; the budget is a fraction of the graph's cost
(``PassConfig.recompute_budget``).

Where a single unit's inputs, outputs and workspace are the peak (the
single-operator bound, as on microcontroller models), nothing can lower it
and the report says so.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inductor_pass.units import ProgramModel, simulate
from inductor_pass.wrapper_ast import Stmt, StmtKind, Wrapper

__all__ = [
    "Candidate",
    "Program",
    "RecomputeResult",
    "returned_names",
    "single_operator_bound",
    "find_candidate",
    "candidates",
    "apply",
    "apply_set",
    "choose",
    "unit_costs",
    "improve",
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


def _region_stmt_storages(model: ProgramModel, k: int) -> frozenset[int]:
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
        held = {s for s in _region_stmt_storages(model, k) - created if model.counted(s)}
        b = sum(model.sizes[s] for s in held) + model.transient[k]
        if b > best:
            best, arg = b, k
    return best, arg


def _levels(model: ProgramModel, order: list[int]) -> list[int]:
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
    acc = {k: _region_stmt_storages(model, k) for k in units}
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
        for s in _region_stmt_storages(model, k):
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


def _core_chooser() -> Callable[..., Any] | None:
    """``choose_recomputation`` of the C++ core, or None when the built extension
    predates it (the Python search below is the same algorithm)."""
    try:
        from torch_replay._ext import require_extension

        return getattr(require_extension().schedule, "choose_recomputation", None)
    except Exception:
        return None


def _branch_and_bound(
    base: list[int],
    deltas: list[list[int]],
    events: list[tuple[int, int]],
    costs: list[int],
    budget: int,
    groups: list[int] | None = None,
    *,
    use_core: bool = True,
) -> tuple[int, list[int]]:
    """Exact minimum of the additive peak model over subsets within the budget.

    Args:
        base: Level per base position.
        deltas: Per candidate, level change per base position.
        events: Per candidate, ``(position q, level of its replay block)``.
        costs: Per candidate.
        budget: Largest total cost.
        groups: Per candidate, a group; at most one candidate per group is chosen
            (the recomputations of one storage for different late uses).
        use_core: Search in the C++ core when the extension has it.

    Returns:
        ``(peak, chosen indices)``; ties broken by least cost.
    """
    import numpy as np

    n = len(deltas)
    if n == 0:
        return (max(base) if base else 0), []
    core = _core_chooser() if use_core else None
    if core is not None:  # csrc/core/recompute_choice.cpp: the same search in C++
        peak, _, chosen, _ = core(
            list(base),
            [list(d) for d in deltas],
            [q for q, _ in events],
            [e for _, e in events],
            list(costs),
            list(groups) if groups is not None else list(range(n)),
            int(budget),
        )
        return int(peak), [int(i) for i in chosen]
    B = np.asarray(base, dtype=np.int64)
    D = np.asarray(deltas, dtype=np.int64).reshape(n, len(base))
    order = sorted(range(n), key=lambda i: int(D[i].min()))
    neg = np.zeros((n + 1, len(base)), dtype=np.int64)
    for m in range(n - 1, -1, -1):
        neg[m] = neg[m + 1] + np.minimum(D[order[m]], 0)

    def level(chosen: list[int], S: np.ndarray, extra: np.ndarray) -> int:
        """Peak of ``chosen`` with ``extra`` added everywhere (a bound when negative)."""
        pk = int((B + S + extra).max())
        for i in chosen:
            q, e = events[i]
            pk = max(pk, e + int(S[q] - D[i, q] + extra[q]))
        return pk

    zero = np.zeros(len(base), dtype=np.int64)
    best = (level([], zero, zero), 0, [])

    def dfs(m: int, chosen: list[int], cost: int, S: np.ndarray) -> None:
        nonlocal best
        if m == n:
            pk = level(chosen, S, zero)
            if (pk, cost) < best[:2]:
                best = (pk, cost, list(chosen))
            return
        if level(chosen, S, neg[m]) > best[0]:  # even every remaining saving is not enough
            return
        i = order[m]
        taken = groups is not None and any(groups[j] == groups[i] for j in chosen)
        if cost + costs[i] <= budget and not taken:
            chosen.append(i)
            dfs(m + 1, chosen, cost + costs[i], S + D[i])
            chosen.pop()
        dfs(m + 1, chosen, cost, S)

    dfs(0, [], 0, zero)
    return best[0], best[2]


def choose(prog: Program, cands: list[Candidate], budget: int) -> tuple[int, list[Candidate]]:
    """Exact choice under the additive model (Note [Recomputation choice]).

    Returns:
        ``(modelled peak of the chosen set in the additive model, chosen)``.
    """
    base_levels = _levels(prog.model, prog.order)
    deltas, events, costs, keep = [], [], [], []
    for c in cands:
        try:
            one = apply(prog, c, "rcx")
        except Refused:
            continue
        lv = _levels(one.model, one.order)
        pos_base = {k: i for i, k in enumerate(prog.order)}
        delta: list[int | None] = [None] * len(base_levels)
        event = 0
        for k, level in zip(one.order, lv, strict=True):
            if k in one.block:
                event = max(event, level)
                continue
            t = pos_base.get(k)
            if t is None:  # a renamed statement after q (early dels after p: no origin)
                t = pos_base.get(one.origin.get(k, -1))
            if t is None:
                continue
            d = level - base_levels[t]
            delta[t] = d if delta[t] is None else min(delta[t], d)
        filled, last = [], 0
        for d in delta:  # statements removed (moved dels) take the previous change
            last = last if d is None else d
            filled.append(last)
        delta = filled
        q = pos_base[c.q_stmt]
        deltas.append(delta)
        events.append((q, event))
        costs.append(c.cost)
        keep.append(c)
    useful = [i for i in range(len(keep)) if min(deltas[i], default=0) < 0]
    deltas = [deltas[i] for i in useful]
    events = [events[i] for i in useful]
    costs = [costs[i] for i in useful]
    keep = [keep[i] for i in useful]
    if len(keep) > 16:  # the exact search is exponential in the worst case
        ranked = sorted(range(len(keep)), key=lambda i: min(deltas[i]))[:16]
        deltas = [deltas[i] for i in ranked]
        events = [events[i] for i in ranked]
        costs = [costs[i] for i in ranked]
        keep = [keep[i] for i in ranked]
    groups = [c.storage for c in keep]
    peak, chosen = _branch_and_bound(base_levels, deltas, events, costs, budget, groups)
    return peak, [keep[i] for i in chosen]


def unit_costs(
    wrapper: Wrapper,
    base_globals: dict[str, Any],
    inputs: Sequence[Any],
    *,
    partitions: Any = None,
    resolve: Callable[[str], object] | None = None,
) -> tuple[dict[int, int], dict[int, int]]:
    """Per unit statement: ``(cost, MACs)`` from one run of the original program.

    MACs: torch's FLOP counter (convolutions, matmuls: flops/2). Cost: MACs plus
    one per element written by kernels the counter does not see (generated
    pointwise and reduction kernels).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from inductor_pass import guard
    from inductor_pass.units import declared_effects

    n = len(wrapper.region)
    flops = [0] * (n + 1)
    elems: dict[int, int] = {}
    counter = FlopCounterMode(display=False)
    written: dict[int, list[str]] = {}
    for st in wrapper.region:
        if st.kind is StmtKind.UNIT:
            names, _ = declared_effects(st, wrapper, resolve)
            written[st.index] = sorted(set(names) | set(st.defines))

    def probe(p: int, values: dict[str, Any]) -> None:
        flops[p] = counter.get_total_flops()
        if p > 0 and (p - 1) in written:
            elems[p - 1] = sum(t.numel() for v in values.values() for t in guard._tensors(v))

    probes = {}
    for p in range(n + 1):
        names = written.get(p - 1, []) if p > 0 else []
        probes[p] = f"{guard._PROBE}({p}, {{{', '.join(f'{x!r}: {x}' for x in names)}}})"
    from inductor_pass.wrapper_ast import render_region

    src = render_region(wrapper, list(range(n)), probes=probes)
    call, _ = guard.build_call(src, base_globals, partitions=partitions, probe=probe)
    args = guard._clone_list(inputs)

    def run():
        with torch.no_grad(), counter:
            return call(list(args))

    out = guard._with_rng(run)
    del out
    macs, cost = {}, {}
    for k in written:
        m = (flops[k + 1] - flops[k]) // 2
        macs[k] = m
        cost[k] = m if m > 0 else elems.get(k, 0)
    return cost, macs


def apply_set(
    prog: Program, cands: Sequence[Candidate], *, max_chain: int = 16
) -> tuple[Program, list[Candidate]]:
    """Apply candidates one after the other, each re-derived on the program so far.

    Returns:
        ``(program, the candidates applied)``; one that no longer applies is skipped.
    """
    done: list[Candidate] = []
    for i, c in enumerate(cands):
        # The late use and the storage as they are now (earlier candidates rename).
        root = prog.origin.get(c.q_stmt, c.q_stmt)
        qs = [k for k in prog.order if prog.origin.get(k, k) == root and k not in prog.block]
        line = prog.lineage.get(c.storage, c.storage)
        try:
            if len(qs) != 1:
                raise Refused("late use not found")
            q = qs[0]
            stor = [
                s for s in _region_stmt_storages(prog.model, q) if prog.lineage.get(s, s) == line
            ]
            if len(stor) != 1:
                raise Refused("storage not found")
            fresh = find_candidate(
                prog, stor[0], q, max_chain=max_chain, rebuild_dead=c.rebuild_dead
            )
            fresh.cost, fresh.macs = c.cost, c.macs
            prog = apply(prog, fresh, f"rc{i}")
            done.append(fresh)
        except Refused:
            continue
    return prog, done


def improve(
    model: ProgramModel,
    order: list[int],
    peak: int,
    *,
    costs: tuple[dict[int, int], dict[int, int]] | Callable[[], tuple[dict, dict]],
    budget: float,
    max_chain: int = 16,
) -> tuple[RecomputeResult | None, str]:
    """Choose and apply recomputations to the emitted program ``order``.

    Args:
        model: The program model (dependences filled).
        order: The statement order (the certified / chosen permutation).
        peak: Its modelled peak.
        costs: ``(cost, MACs)`` per unit (:func:`unit_costs`), or a thunk.
        budget: Largest extra cost, as a fraction of the graph's total cost.

    Returns:
        ``(result or None, note for the report)``.
    """
    bound, unit = single_operator_bound(model)
    if bound >= peak:
        st = model.wrapper.region[unit] if unit is not None else None
        what = f"statement {unit} ({st.callee})" if st is not None else "a unit"
        return None, (
            f"recomputation cannot lower the peak: the single-operator bound ({bound} bytes, "
            f"{what}: its inputs, outputs and workspace) equals the peak"
        )
    prog = Program(
        model=model,
        order=list(order),
        returned=returned_names(model.wrapper),
        origin={k: k for k in range(len(model.wrapper.region))},
    )
    cands = candidates(prog, max_chain=max_chain)
    if not cands:
        return None, "recomputation: no candidate (no storage is reused after a gap)"
    cost, macs = costs() if callable(costs) else costs
    total = sum(cost.values())
    for c in cands:
        c.cost = sum(cost.get(k, 0) for k in c.chain)
        c.macs = sum(macs.get(k, 0) for k in c.chain)
    limit = int(budget * total)
    _, chosen = choose(prog, [c for c in cands if c.cost <= limit], limit)
    if not chosen:
        return (
            None,
            f"recomputation: no candidate lowers the peak within the budget ({budget:.2%} of {total} ops)",
        )

    # Apply exactly; drop candidates that do not help the exact peak.
    def build(cs: list[Candidate]) -> tuple[Program, int, list[Candidate]] | None:
        p, done = apply_set(prog, cs, max_chain=max_chain)
        if not done:
            return None
        for c in done:  # a re-derived chain may replay an earlier chain's kernels
            c.cost = sum(cost.get(p.origin.get(k, k), 0) for k in c.chain)
            c.macs = sum(macs.get(p.origin.get(k, k), 0) for k in c.chain)
        return p, simulate(p.model, p.order)[0], done

    def bad(got: tuple[Program, int, list[Candidate]] | None) -> bool:
        return got is None or got[1] >= peak or sum(c.cost for c in got[2]) > limit

    got = build(chosen)
    while bad(got) and len(chosen) > 1:
        chosen = chosen[:-1]
        got = build(chosen)
    if got is None or bad(got):
        return None, (
            "recomputation: the chosen recomputations do not lower the exact modelled peak "
            "within the budget"
        )
    p, pk, done = got
    return (
        RecomputeResult(
            program=p,
            peak=pk,
            applied=done,
            total_cost=total,
            total_macs=sum(macs.values()),
        ),
        f"recomputation: {len(done)} chain(s), modelled peak {peak} -> {pk} bytes",
    )


def in_pass(
    model: ProgramModel,
    order: list[int],
    peak: int,
    rep: Any,
    *,
    base_globals: dict[str, Any],
    inputs: Sequence[Any],
    partitions: Any,
    resolve: Callable[[str], object] | None,
    config: Any,
    on_cuda: bool,
) -> tuple[Wrapper, list[int], int, ProgramModel]:
    """The pass's recomputation stage (``PassConfig.recompute``); fills the report.

    Returns:
        ``(wrapper, order, modelled peak, model)`` of the program to guard:
        the input program when nothing is recomputed.
    """
    unchanged = (model.wrapper, order, peak, model)
    if on_cuda:
        rep.recompute_note = "recomputation is chosen on CPU only (byte-exact model)"
        return unchanged

    def costs() -> tuple[dict[int, int], dict[int, int]]:
        return unit_costs(
            model.wrapper, base_globals, inputs, partitions=partitions, resolve=resolve
        )

    result, note = improve(
        model,
        order,
        peak,
        costs=costs,
        budget=config.recompute_budget,
        max_chain=config.recompute_max_chain,
    )
    rep.recompute_note = note
    if result is None:
        return unchanged
    region = result.program.model.wrapper.region
    rep.bounds["single_operator"] = single_operator_bound(model)[0]
    for c in result.applied:
        rep.recomputed.append(
            {
                "names": c.names,
                "bytes": c.size,
                "late_use": region[c.q_stmt].callee,
                "kernels": [region[k].callee for k in c.chain],
                "extra_macs": c.macs,
                "extra_cost": c.cost,
                "total_macs": result.total_macs,
                "total_cost": result.total_cost,
            }
        )
    p = result.program
    return p.model.wrapper, p.order, result.peak, p.model
