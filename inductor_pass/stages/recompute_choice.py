"""The exact choice of recomputation candidates under the additive peak model.

Note [Recomputation choice] is in ``inductor_pass/stages/recompute.py``; this is its
search: a branch and bound over candidate subsets within the MAC budget (the C++
core's ``choose_recomputation`` when the built extension has it, else the same
algorithm in Python).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inductor_pass.program.recompute_program import Candidate, Program, Refused, apply, levels

__all__ = ["branch_and_bound", "choose", "core_chooser"]


def core_chooser() -> Callable[..., Any] | None:
    """``choose_recomputation`` of the C++ core, or None when the built extension
    predates it (the Python search below is the same algorithm)."""
    try:
        from torch_replay._ext import require_extension

        return getattr(require_extension().schedule, "choose_recomputation", None)
    except Exception:
        return None


def branch_and_bound(
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
    core = core_chooser() if use_core else None
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
    peak, chosen = branch_and_bound(base_levels, deltas, events, costs, budget, groups)
    return peak, [keep[i] for i in chosen]
