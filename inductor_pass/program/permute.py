"""Search for a unit order with a lower modelled peak, with certified bounds.

Candidates: the original unit order, a memory-greedy order, two depth-first
topological orders (as Inductor's ``reorder_for_peak_memory`` tries several
sorts) and the order of :func:`torch_replay.schedule.plan_unit_order` (exact
capacity search with min-cut bounds). Every candidate is emitted
(:func:`inductor_pass.program.units.emit`) and scored with the byte-exact model
(:func:`inductor_pass.program.units.simulate`); the model is the authority.

Note [Mapping to the scheduling core]
``torch_replay.schedule.Problem`` frees a buffer right after its last consumer
and keeps a unit's inputs and outputs live while it runs. The wrapper maps
onto it as follows: unit ``i`` is the ``i``-th kernel call; each internal
storage is a buffer produced by the unit that first binds it (its own result,
or the allocation attached to it), consumed by the other units that use one
of its names, and an output when a name of it is never deleted; a unit whose
profiled transient exceeds its own new results gets a workspace buffer of
the difference with no consumer; all precedences (RAW/WAR/WAW, name
bindings, barriers) are ``extra_edges``. An input the call owns (Note [Input
ownership] in ``inductor_pass/stages/guard.py``) is a graph input (producer -1)
consumed by the units that use it, so the core frees it after its last use
as the wrapper does. The core does not count an owned input no unit uses
(the wrapper deletes it before the first unit), but every owned input is live
when the call starts: the modelled peak is ``max(owned bytes, core peak)``
and so are the bounds. Under the emission rules (allocation
right before its unit, ``del`` as early as legal) the core's peak then equals
the modelled peak of the emitted program. This is checked on every graph for
the original and the chosen order; only when both agree are the core's
bounds reported as lower bounds of the modelled peak (``mapping_exact``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inductor_pass.program.units import EmissionError, ProgramModel, emit, simulate

__all__ = ["SearchResult", "search_order", "core_problem"]


@dataclass(kw_only=True, slots=True)
class SearchResult:
    """Best emitted statement order found."""

    stmt_order: list[int]
    unit_order: list[int]
    peak: int
    """Modelled peak of ``stmt_order``."""
    candidate: str
    """Which heuristic found it."""
    candidates: dict[str, int] = field(default_factory=dict)
    """Modelled peak of each candidate."""
    bounds: dict[str, int] = field(default_factory=dict)
    lower_bound: int | None = None
    certified: bool = False
    mapping_exact: bool = False
    core_seconds: float = 0.0
    note: str = ""


def _topo_orders(units: list[int], edges: set[tuple[int, int]]) -> dict[str, list[int]]:
    succ: dict[int, list[int]] = {u: [] for u in units}
    indeg = {u: 0 for u in units}
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    out: dict[str, list[int]] = {}
    # DFS order following successors eagerly (consume what was just produced).
    deg = dict(indeg)
    ready = sorted(u for u in units if deg[u] == 0)
    order: list[int] = []
    stack = list(reversed(ready))
    while stack:
        u = stack.pop()
        order.append(u)
        newly = []
        for v in succ[u]:
            deg[v] -= 1
            if deg[v] == 0:
                newly.append(v)
        stack.extend(sorted(newly, reverse=True))
    out["dfs"] = order
    # Reverse-DFS: latest-first producers (schedule consumers as late as possible).
    deg = dict(indeg)
    heap = [-u for u in units if deg[u] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        u = -heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            deg[v] -= 1
            if deg[v] == 0:
                heapq.heappush(heap, -v)
    out["latest_first"] = order
    return out


def _greedy(
    model: ProgramModel,
    units: list[int],
    edges: set[tuple[int, int]],
    attached: dict[int, list[int]],
) -> list[int]:
    """Memory-greedy: run the ready unit that allocates least net of what it frees."""
    region = model.wrapper.region
    succ: dict[int, list[int]] = {u: [] for u in units}
    deg = {u: 0 for u in units}
    for a, b in edges:
        succ[a].append(b)
        deg[b] += 1
    users: dict[int, set[int]] = {}
    for u in units:
        for s in model.reads[u] | model.writes[u]:
            users.setdefault(s, set()).add(u)
    new_of: dict[int, set[int]] = {}
    for u in units:
        names = list(region[u].defines)
        for a in attached.get(u, []):
            names += region[a].defines
        new_of[u] = model.storages_of(names) - model.external
    remaining = {s: set(us) for s, us in users.items()}
    ready = {u for u in units if deg[u] == 0}
    order: list[int] = []
    while ready:

        def score(u: int) -> tuple[int, int]:
            alloc = sum(model.sizes[s] for s in new_of[u])
            freed = sum(
                model.sizes[s]
                for s in model.reads[u] | model.writes[u]
                if model.counted(s) and remaining.get(s) == {u} and s not in new_of[u]
            )
            return (alloc - freed, u)

        u = min(ready, key=score)
        ready.remove(u)
        order.append(u)
        for s in model.reads[u] | model.writes[u]:
            remaining.get(s, set()).discard(u)
        for v in succ[u]:
            deg[v] -= 1
            if deg[v] == 0:
                ready.add(v)
    return order


def core_problem(
    model: ProgramModel,
    units: list[int],
    edges: set[tuple[int, int]],
    attached: dict[int, list[int]],
):
    """The :class:`torch_replay.schedule.Problem` of Note [Mapping to the scheduling core].

    Returns:
        ``(problem, index)`` where ``index[stmt] = unit number``, or
        ``(None, reason)`` when a storage has no producing unit.
    """
    from torch_replay import schedule

    region = model.wrapper.region
    idx = {u: i for i, u in enumerate(units)}
    deleted: set[str] = {n for st in region for n in st.deletes}
    producer: dict[int, int] = {}
    for u in units:
        names = list(region[u].defines)
        for a in attached.get(u, []):
            names += region[a].defines
        for s in model.storages_of(names) - model.external:
            producer.setdefault(s, idx[u])
    # Aliases bind existing storages; anything else must have a producer.
    named = {s for n, ss in model.name_storages.items() for s in ss}
    internal = named - model.external
    missing = internal - producer.keys()
    if missing:
        return None, f"{len(missing)} storage(s) are bound by no unit"
    # Owned inputs are graph inputs of the core problem (producer -1), freed
    # after their last consumer like any other buffer.
    for s in model.owned & named:
        producer[s] = -1
    internal |= model.owned & named
    users: dict[int, set[int]] = {s: set() for s in internal}
    for u in units:
        for s in model.storages_of(region[u].uses):
            if s in users:
                users[s].add(idx[u])
    outputs: set[int] = set()
    for n, ss in model.name_storages.items():
        if n not in deleted:
            outputs |= set(ss) - model.external
    sizes, prod, cons, outs = [], [], [], []
    for b, s in enumerate(sorted(internal)):
        sizes.append(model.sizes[s])
        prod.append(producer[s])
        cons.append(sorted(users[s] - {producer[s]}))
        if s in outputs:
            outs.append(b)
    for u in units:
        own = model.storages_of(region[u].defines) - model.external
        extra = model.transient[u] - sum(model.sizes[s] for s in own)
        if extra > 0:
            sizes.append(extra)
            prod.append(idx[u])
            cons.append([])
    extra_edges = sorted({(idx[a], idx[b]) for a, b in edges})
    p = schedule.Problem(sizes, prod, cons, outs, num_units=len(units), extra_edges=extra_edges)
    return p, idx


def search_order(
    model: ProgramModel,
    units: list[int],
    edges: set[tuple[int, int]],
    attached: dict[int, list[int]],
    tail: list[int],
    *,
    use_core: bool = True,
    time_limit_s: float = 1.0,
    admissible: Callable[[list[int]], str | None] | None = None,
    extra: dict[str, list[int]] | None = None,
) -> SearchResult:
    """Best emitted order among the heuristics and the scheduling core.

    Args:
        model: Program model with dependences filled.
        units, edges, attached, tail: From :func:`inductor_pass.program.units.build_dependences`.
        use_core: Also run :func:`torch_replay.schedule.plan_unit_order`.
        time_limit_s: Budget of the core's exact search.
        admissible: When given, a candidate's emitted statement order is kept
            only when this returns None (else the reason it is dropped), and
            the original candidate is the region's own order, not its emission
            (Note [Data-dependent sizes] in ``inductor_pass/program/unbacked.py``).
        extra: More candidate unit orders, by name.

    Returns:
        A :class:`SearchResult` (``candidate == "original"`` when nothing is lower).
    """
    cands: dict[str, list[int]] = {"original": list(units)}
    cands["greedy"] = _greedy(model, units, edges, attached)
    cands.update(_topo_orders(units, edges))
    cands.update(extra or {})
    result_bounds: dict[str, int] = {}
    lower: int | None = None
    certified = False
    mapping_exact = False
    note = ""
    core_s = 0.0
    problem = None
    idx: dict[int, int] = {}
    if use_core and units:
        t0 = time.perf_counter()
        try:
            problem, idx_or_reason = core_problem(model, units, edges, attached)
            if problem is None:
                note = f"no core mapping: {idx_or_reason}"
            else:
                idx = idx_or_reason  # type: ignore[assignment]
                from torch_replay import schedule

                floor = sum(model.sizes[s] for s in model.owned)
                if problem.peak(list(range(len(units)))) <= floor:
                    # The owned inputs alone, live at the start, reach the
                    # original order's peak: it is optimal, no search needed.
                    lower, certified = floor, True
                    note = "original order certified by the owned inputs' bytes; no search"
                else:
                    sol = schedule.plan_unit_order(problem, time_limit_s=time_limit_s)
                    cands["core"] = [units[i] for i in sol.order]
                    result_bounds = dict(sol.bounds)
                    lower = sol.lower_bound
                    certified = sol.certified
        except Exception as exc:  # the core is an optimisation; never fatal
            note = f"core failed: {type(exc).__name__}: {exc}"
            problem = None
        core_s = time.perf_counter() - t0
    scored: dict[str, int] = {}
    orders: dict[str, list[int]] = {}
    for name, uo in cands.items():
        if sorted(uo) != sorted(units):
            continue
        if admissible is not None and name == "original":
            # Inductor's program itself, the reference of ``admissible``.
            so = list(range(len(model.wrapper.region)))
            scored[name], orders[name] = simulate(model, so)[0], so
            continue
        try:
            so = emit(model, uo, attached, tail)
        except EmissionError as exc:
            note += f"; {name}: {exc}"
            continue
        if admissible is not None:
            why = admissible(so)
            if why is not None:
                note += f"; {name}: {why}"
                continue
        scored[name] = simulate(model, so)[0]
        orders[name] = so
    if "original" not in scored:
        raise EmissionError(f"the original unit order cannot be emitted ({note})")
    best = min(scored, key=lambda k: (scored[k], k != "original"))
    unit_order = cands[best]
    floor = sum(model.sizes[s] for s in model.owned)
    if lower is not None:
        lower = max(lower, floor)
        result_bounds = {k: max(v, floor) for k, v in result_bounds.items()}
    if problem is not None:
        try:
            core_orig = max(floor, problem.peak([idx[u] for u in units]))
            core_best = max(floor, problem.peak([idx[u] for u in unit_order]))
            mapping_exact = core_orig == scored["original"] and core_best == scored[best]
        except Exception as exc:
            note += f"; core peak failed: {exc}"
    if not mapping_exact:
        if problem is not None:
            note += "; core mapping not exact for this graph: bounds not reported"
        lower, certified, result_bounds = None, False, {}
    else:
        certified = lower is not None and scored[best] == lower
    return SearchResult(
        stmt_order=orders[best],
        unit_order=unit_order,
        peak=scored[best],
        candidate=best,
        candidates=scored,
        bounds=result_bounds,
        lower_bound=lower,
        certified=certified,
        mapping_exact=mapping_exact,
        core_seconds=core_s,
        note=note.strip("; "),
    )
