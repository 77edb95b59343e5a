"""Selective recomputation in training, at AOTAutograd's partition (issue 46, item 5).

Note [Recomputation in training]
In training AOTAutograd splits the joint graph into a forward and a backward
graph *before* Inductor: every activation the backward needs is an output of
the forward, held by autograd between the two graphs, so the wrapper-level
recomputation (Note [Recomputation in the wrapper] in ``stages/recompute.py``)
can never drop it. What is saved is decided by the partitioner
(``min_cut_rematerialization_partition``), which already recomputes cheap
fusible chains but bans ops whose result the backward must materialize (the
input of a convolution's or matmul's weight gradient: ReLU and normalisation
outputs), convolutions, matmuls and reductions. With ``PassConfig(recompute=True)``
the backend installs :class:`TrainingRecompute` as Inductor's
``custom_partitioner_fn`` (a public config seam; Inductor's joint-graph passes
still run first), which:

1. runs Inductor's own partition (the baseline: its saved set ``B``);
2. takes each saved activation ``S`` (a forward ``call_function``, not a user
   output, no other saved value a view of it) as a candidate: its *chain* is
   the closure of forward nodes computing ``S`` from primal inputs and other
   values of ``B`` (its *leaves*). A chain is refused unless every node is in
   :data:`EXACT_OPS`: views, IEEE exactly rounded elementwise ops (the same
   bits whichever kernel, vectorised or not, fuses them) and the extern
   convolution / matmul calls (the same call on the same bytes); random,
   effectful, reduction and transcendental ops are never recomputed;
3. models the step at the FX level (:func:`step_intervals`): forward then
   backward nodes in order, each non-view value live from its node to its last
   use (saved values to their last backward use, user outputs and gradients to
   the end; primal inputs are the caller's). A candidate frees ``S`` from its
   last forward use to its first backward use and extends its saved leaves to
   that use; its replay block adds the chain's intermediates. These are the
   per-position changes and events of Note [Recomputation choice], and the set
   of least modelled step peak under the bound (extra cost, MACs of
   convolutions/matmuls plus one per element written by other ops, as a
   fraction of the joint graph's cost, ``PassConfig.recompute_budget``) is
   chosen by the same exact branch and bound (the C++ core's
   ``choose_recomputation``);
4. tags the chosen chains ``CheckpointPolicy.MUST_RECOMPUTE`` (the tag
   activation checkpointing uses) on a copy of the joint graph and partitions
   it again; the result is modelled again (the authority: chains can
   interact, and the min cut may move) and recounted, and while it is not
   strictly below the baseline's modelled peak or exceeds the bound, the last
   chosen candidate is dropped. Nothing chosen: Inductor's partition is
   returned unchanged.

The decision is a model, not a measurement: measuring both partitions in a
real step would run the user's forward twice (batch-norm statistics, RNG: item
1 of issue 46), so the runtime guard does not cover it. Bitwise gradients rest
on :data:`EXACT_OPS`; ``tests/test_recompute_training.py`` checks them with
``torch.equal`` against plain Inductor, and ``benchmarks/bench_recompute_training.py``
measures the real step peak (``benchmarks/results/recompute_training.md``).
Each decision is recorded as a ``GraphReport`` of kind ``"partition"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from inductor_pass.config import PassConfig
from inductor_pass.stages.train_step_model import (
    calls,
    copy_joint,
    is_view,
    nbytes,
    node_cost,
    outputs,
    packet,
    root,
    step_intervals,
    step_levels,
    val,
)

__all__ = ["EXACT_OPS", "TrainingRecompute", "node_cost", "step_intervals", "step_levels"]

aten = torch.ops.aten
prims = torch.ops.prims

EXACT_OPS = frozenset(
    {
        # exactly rounded elementwise (IEEE), comparisons and selection
        aten.add,
        aten.sub,
        aten.mul,
        aten.div,
        aten.neg,
        aten.abs,
        aten.sqrt,
        aten.rsqrt,  # 1/sqrt, vectorised and scalar (at::vec, c10)
        aten.relu,
        aten.maximum,
        aten.minimum,
        aten.clamp_min,
        aten.clamp_max,
        aten.where,
        aten.le,
        aten.lt,
        aten.ge,
        aten.gt,
        aten.eq,
        aten.ne,
        aten.threshold_backward,
        prims.convert_element_type,
        aten.clone,
        # views
        aten.view,
        aten._unsafe_view,
        aten.unsqueeze,
        aten.squeeze,
        aten.permute,
        aten.expand,
        aten.t,
        aten.transpose,
        aten.slice,
        aten.select,
    }
)
"""Op packets a recomputed chain may contain (Note [Recomputation in training])."""


class _Candidate:
    __slots__ = ("name", "chain", "leaves", "size", "q", "cost", "macs")

    def __init__(self, name: str, chain: list[fx.Node], leaves: list[fx.Node], size: int, q: int):
        self.name, self.chain, self.leaves, self.size, self.q = name, chain, leaves, size, q
        costs = [node_cost(x) for x in chain]
        self.cost = sum(c for c, _ in costs)
        self.macs = sum(m for _, m in costs)


def _chain(
    s: fx.Node, avail: set[str], max_chain: int
) -> tuple[list[fx.Node], list[fx.Node]] | str:
    """The forward nodes computing ``s`` from ``avail`` (primal inputs and saved
    values), in graph order, and the saved values they read; or why refused."""
    chain: dict[fx.Node, None] = {}
    leaves: dict[fx.Node, None] = {}
    stack = [s]
    while stack:
        x = stack.pop()
        if x in chain:
            continue
        if x is not s and x.name in avail:
            if x.op != "placeholder":
                leaves[x] = None
            continue
        if x.op != "call_function" or packet(x) not in EXACT_OPS:
            return f"{x.name} ({getattr(x.target, '__name__', x.target)}) is not recomputed exactly"
        chain[x] = None
        if len(chain) > max_chain:
            return f"chain longer than {max_chain}"
        stack.extend(x.all_input_nodes)
    order = {x: i for i, x in enumerate(s.graph.nodes)}
    return sorted(chain, key=order.__getitem__), list(leaves)


def _candidates(
    fw: fx.GraphModule, bw: fx.GraphModule, nfo: int, bw_pos: dict[str, int], max_chain: int
) -> tuple[list[_Candidate], dict[str, str]]:
    fw_out = [o for o in outputs(fw) if isinstance(o, fx.Node)]
    outs = outputs(fw)
    user = {root(o).name for o in outs[:nfo] if isinstance(o, fx.Node)}
    saved = [o for o in outs[nfo:] if isinstance(o, fx.Node)]
    avail = {o.name for o in saved} | {root(o).name for o in saved}  # a saved view keeps its base
    avail |= {p.name for p in fw.graph.nodes if p.op == "placeholder"}
    roots = [root(o).name for o in fw_out]
    bw_nodes = {x.name: x for x in bw.graph.nodes}
    found, refused = [], {}
    for s in saved:
        if s.op != "call_function" or is_view(s) or not isinstance(val(s), torch.Tensor):
            continue
        if s.name in user or roots.count(s.name) > 1:
            refused[s.name] = "also a user output or aliased by another saved value"
            continue
        ph = bw_nodes.get(s.name)
        uses = [bw_pos[u.name] for u in (ph.users if ph is not None else ()) if u.name in bw_pos]
        if not uses:
            continue
        got = _chain(s, avail, max_chain)
        if isinstance(got, str):
            refused[s.name] = got
            continue
        found.append(_Candidate(s.name, got[0], got[1], nbytes(s), min(uses)))
    return found, refused


def _effects(
    c: _Candidate, iv: dict[Any, tuple[int, int, int]], base: list[int], fw_pos: dict[str, int]
) -> tuple[list[int], tuple[int, int]]:
    """Per-position change of the level and the replay block's event (Note
    [Recomputation choice]) of one candidate."""
    n = len(base)
    delta = [0] * n
    a, _, s = iv[("fw", c.name)]
    last_fw = max([a] + [fw_pos[u.name] for u in c.chain[-1].users if u.name in fw_pos])
    for t in range(last_fw + 1, c.q):
        delta[t] -= s
    for leaf in c.leaves:
        key = ("fw", root(leaf).name)
        if key in iv:
            _, b, sl = iv[key]
            for t in range(b + 1, min(c.q + 1, n)):
                delta[t] += sl
    transient = sum(nbytes(x) for x in c.chain if x.name != c.name)
    return delta, (c.q, base[c.q] + delta[c.q] + transient)


class TrainingRecompute(CustomPartitionerFn):
    """Inductor's ``custom_partitioner_fn`` for ``PassConfig.recompute`` (Note
    [Recomputation in training])."""

    def __init__(self, config: PassConfig) -> None:
        self.config = config

    def uuid(self) -> Any:
        from torch._inductor.custom_graph_pass import get_hash_for_files

        c = self.config
        return (get_hash_for_files((__file__,)), c.recompute_budget, c.recompute_max_chain)

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kw: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition as min_cut

        from inductor_pass.report import GraphReport, record

        rep = GraphReport(kind="partition")
        try:
            base = min_cut(copy_joint(gm), joint_inputs, **kw)
        except Exception as exc:
            rep.reason = f"left unchanged: joint graph not copied ({type(exc).__name__}: {exc})"
            record(rep, print_it=self.config.report, dump_dir=None)
            return min_cut(gm, joint_inputs, **kw)
        try:
            got, note = self.choose(gm, joint_inputs, kw, base, rep)
        except Exception as exc:  # never worse than Inductor's partition
            got, note = None, f"left unchanged: pass failed ({type(exc).__name__}: {exc})"
        rep.deployed = got is not None
        rep.reason = rep.recompute_note = note
        record(rep, print_it=self.config.report, dump_dir=None)
        return got if got is not None else base

    def choose(
        self, gm: fx.GraphModule, ji: Sequence[object], kw: dict[str, Any], base: Any, rep: Any
    ) -> tuple[Any, str]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition as min_cut
        from torch.utils.checkpoint import CheckpointPolicy

        from inductor_pass.stages.recompute_choice import branch_and_bound

        nfo = kw["num_fwd_outputs"]
        fw, bw = base
        iv, n, bw_pos = step_intervals(fw, bw, nfo)
        levels = step_levels(iv, n)
        peak = max(levels, default=0)
        rep.modelled_original_peak = rep.modelled_permuted_peak = peak
        fns = [x for x in fw.graph.nodes if x.op == "call_function"]
        fw_pos = {x.name: i for i, x in enumerate(fns)}
        cands, refused = _candidates(fw, bw, nfo, bw_pos, self.config.recompute_max_chain)
        rep.notes += [f"not recomputed: {k}: {v}" for k, v in sorted(refused.items())]
        total = sum(node_cost(x)[0] for x in gm.graph.nodes)
        limit = int(self.config.recompute_budget * total)
        eff = [(c, *_effects(c, iv, levels, fw_pos)) for c in cands if c.cost <= limit]
        eff = [e for e in eff if min(e[1], default=0) < 0]
        eff = sorted(eff, key=lambda e: min(e[1]))[:16]  # the search is exponential
        if not eff:
            return None, (
                f"recomputation in training: no saved activation's chain lowers the modelled "
                f"step peak within the budget ({self.config.recompute_budget:.2%} of {total} ops)"
            )
        _, idx = branch_and_bound(
            levels, [e[1] for e in eff], [e[2] for e in eff], [e[0].cost for e in eff], limit
        )
        chosen = [eff[i][0] for i in idx]
        if not chosen:
            at = max(range(len(levels)), key=levels.__getitem__)
            steps = fns + [x for x in bw.graph.nodes if x.op == "call_function"]
            where = "forward" if at < len(fns) else "backward"
            name = steps[at].name if at < len(steps) else "?"
            return None, (
                f"recomputation in training: no set of chains within the budget lowers the "
                f"modelled step peak ({peak} bytes, at {where} node {name}, step position "
                f"{at} of {len(levels)}; {len(eff)} chain(s) lower the live bytes only elsewhere)"
            )
        redone = calls(bw) & calls(fw)
        joint = {x.name: x for x in gm.graph.nodes}
        while chosen:
            g2 = copy_joint(gm)
            tag = {x.name for c in chosen for x in c.chain}
            for node in g2.graph.nodes:
                if node.name in tag:
                    node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            fw2, bw2 = min_cut(g2, ji, **kw)
            pk = max(step_levels(*step_intervals(fw2, bw2, nfo)[:2]), default=0)
            extra = (calls(bw2) & calls(fw2)) - redone
            costs = [node_cost(joint[k]) for k in extra if k in joint]
            cost, macs = sum(c for c, _ in costs), sum(m for _, m in costs)
            if pk < peak and cost <= limit:
                rep.modelled_permuted_peak = pk
                for c in chosen:
                    rep.recomputed.append(
                        {
                            "names": [c.name],
                            "bytes": c.size,
                            "late_use": min((k for k, p in bw_pos.items() if p == c.q), default=""),
                            "kernels": [str(packet(x)) for x in c.chain],
                            "extra_macs": c.macs,
                            "extra_cost": c.cost,
                            "total_macs": sum(node_cost(x)[1] for x in gm.graph.nodes),
                            "total_cost": total,
                        }
                    )
                rep.notes.append(
                    f"recomputed in the backward: {sorted(extra)} ({cost} ops, {macs} MACs)"
                )
                return (fw2, bw2), (
                    f"recomputation in training: {len(chosen)} saved activation(s) recomputed in "
                    f"the backward, modelled step peak {peak} -> {pk} bytes"
                )
            chosen = chosen[:-1]
        return None, (
            "recomputation in training: the chosen recomputations do not lower the modelled "
            "step peak within the budget once partitioned"
        )
