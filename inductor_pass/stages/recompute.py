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
(:func:`inductor_pass.program.units.simulate`, a replayed statement's transient is its
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

from collections.abc import Callable, Sequence
from typing import Any

from inductor_pass.program.recompute_program import (  # noqa: F401  (re-exported)
    Candidate,
    Program,
    RecomputeResult,
    Refused,
    apply,
    candidates,
    find_candidate,
    levels,
    returned_names,
    single_operator_bound,
    stmt_storages,
)
from inductor_pass.program.units import ProgramModel, simulate
from inductor_pass.program.wrapper_ast import StmtKind, Wrapper

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
    base_levels = levels(prog.model, prog.order)
    deltas, events, costs, keep = [], [], [], []
    for c in cands:
        try:
            one = apply(prog, c, "rcx")
        except Refused:
            continue
        lv = levels(one.model, one.order)
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

    from inductor_pass.program.units import declared_effects
    from inductor_pass.stages import guard

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
            elems[p - 1] = sum(t.numel() for v in values.values() for t in guard.tensors_in(v))

    probes = {}
    for p in range(n + 1):
        names = written.get(p - 1, []) if p > 0 else []
        probes[p] = f"{guard.PROBE_PREFIX}({p}, {{{', '.join(f'{x!r}: {x}' for x in names)}}})"
    from inductor_pass.program.wrapper_ast import render_region

    src = render_region(wrapper, list(range(n)), probes=probes)
    call, _ = guard.build_call(src, base_globals, partitions=partitions, probe=probe)
    args = guard.clone_list(inputs)

    def run():
        with torch.no_grad(), counter:
            return call(list(args))

    out = guard.with_rng(run)
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
            stor = [s for s in stmt_storages(prog.model, q) if prog.lineage.get(s, s) == line]
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
