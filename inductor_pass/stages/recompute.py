"""Selective recomputation after the certified order (docs/design.md §3.4).

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
from inductor_pass.stages.recompute_choice import choose

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
