"""The FX-level model of one training step (Note [Recomputation in training] in
``inductor_pass/stages/train_recompute.py``): live intervals of the forward's and
the backward's values, and per-node cost (MACs, or elements written)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx

__all__ = [
    "calls",
    "copy_joint",
    "is_view",
    "nbytes",
    "node_cost",
    "outputs",
    "packet",
    "root",
    "step_intervals",
    "step_levels",
    "val",
]


def val(node: fx.Node) -> Any:
    return node.meta.get("val")


def is_view(node: fx.Node) -> bool:
    return node.op == "call_function" and bool(getattr(node.target, "is_view", False))


def nbytes(node: fx.Node) -> int:
    v = val(node)
    if not isinstance(v, torch.Tensor) or is_view(node):
        return 0
    return int(v.numel()) * v.element_size()


def packet(node: fx.Node) -> Any:
    return getattr(node.target, "overloadpacket", None)


def node_cost(node: fx.Node) -> tuple[int, int]:
    """``(cost, MACs)`` of one node: MACs from torch's FLOP formulas (flops/2) for
    convolutions and matmuls, else one per element written (views: 0)."""
    from torch.utils.flop_counter import flop_registry

    if node.op != "call_function" or is_view(node):
        return 0, 0
    out = val(node)
    fn = flop_registry.get(packet(node))
    if fn is not None:
        args = torch.fx.node.map_aggregate(
            node.args, lambda a: val(a) if isinstance(a, fx.Node) else a
        )
        kw = torch.fx.node.map_aggregate(
            node.kwargs, lambda a: val(a) if isinstance(a, fx.Node) else a
        )
        try:
            macs = int(fn(*args, **kw, out_val=out)) // 2
            return macs, macs
        except Exception:
            pass
    elems = sum(
        t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
    )
    return int(elems), 0


def root(node: fx.Node) -> fx.Node:
    while is_view(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def copy_joint(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of the joint graph (nodes and their ``meta`` dicts, values shared) over
    the same module attributes: tags set on it leave ``gm`` as it was."""
    g = fx.Graph()
    g._codegen = gm.graph._codegen  # (the pytree specs: read only)
    out, node = g.graph_copy(gm.graph, {}, return_output_node=True)
    g.output(out).meta = copy.copy(node.meta)
    return fx.GraphModule(gm, g)


def calls(gm: fx.GraphModule) -> set[str]:
    return {x.name for x in gm.graph.nodes if x.op == "call_function"}


def outputs(gm: fx.GraphModule) -> list[Any]:
    return list(gm.graph.find_nodes(op="output"))[0].args[0]


def step_intervals(
    fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int
) -> tuple[dict[tuple[str, str], tuple[int, int, int]], int, dict[str, int]]:
    """Live intervals of one training step at the FX level (Note [Recomputation in training]).

    Returns:
        ``({(graph, root name): (first, last, bytes)}, number of positions,
        {backward node name: position})``; positions run over the forward's then the
        backward's ``call_function`` nodes; primal inputs are not counted.
    """
    pos: dict[tuple[str, str], int] = {}
    n = 0
    for g, gm in (("fw", fw), ("bw", bw)):
        for node in gm.graph.nodes:
            if node.op == "call_function":
                pos[(g, node.name)] = n
                n += 1
    end = max(n - 1, 0)
    nfw = sum(1 for k in pos if k[0] == "fw")
    iv: dict[tuple[str, str], tuple[int, int, int]] = {}

    def use(key: tuple[str, str], at: int, size: int) -> None:
        a, b, s = iv.get(key, (at, at, size))
        iv[key] = (min(a, at), max(b, at), max(s, size))

    fw_out = outputs(fw)
    saved = {o.name: o for o in fw_out[num_fwd_outputs:] if isinstance(o, fx.Node)}
    for g, gm in (("fw", fw), ("bw", bw)):
        for node in gm.graph.nodes:
            if node.op == "call_function":
                here = pos[(g, node.name)]
                r = root(node)
                if r.op == "call_function":
                    use((g, r.name), pos[(g, r.name)], nbytes(r))
                    use((g, r.name), here, 0)
                elif g == "bw" and r.op == "placeholder":
                    use(("bw", r.name), here, 0)
                for a in node.all_input_nodes:
                    ra = root(a)
                    if ra.op == "call_function" or (g == "bw" and ra.op == "placeholder"):
                        use((g, ra.name), here, 0)
    # Forward outputs: user outputs live to the end, saved values into the backward.
    for i, o in enumerate(fw_out):
        if not isinstance(o, fx.Node):
            continue
        r = root(o)
        if r.op != "call_function":
            continue
        if i < num_fwd_outputs:
            use(("fw", r.name), end, 0)
        else:
            use(("fw", r.name), nfw - 1, 0)
    bw_pos = {name: p for (g, name), p in pos.items() if g == "bw"}
    for node in bw.graph.nodes:
        if node.op != "placeholder":
            continue
        key = ("bw", node.name)
        if node.name in saved:  # a saved value: the forward's storage, into the backward
            r = root(saved[node.name])
            if r.op == "call_function" and key in iv:
                a, b, s = iv.pop(key)
                fa, fb, fs = iv[("fw", r.name)]
                iv[("fw", r.name)] = (fa, max(fb, b), fs)
        elif "tangents" in node.name:
            first = iv.get(key, (nfw, nfw, 0))[1]
            iv[key] = (nfw, max(first, nfw), nbytes(node))
        else:
            iv.pop(key, None)  # a primal input the backward uses: the caller's
    for o in outputs(bw):  # gradients live to the end
        if isinstance(o, fx.Node) and root(o).op == "call_function":
            use(("bw", root(o).name), end, 0)
    return iv, n, bw_pos


def step_levels(iv: dict[Any, tuple[int, int, int]], n: int) -> list[int]:
    """Live bytes at each position."""
    diff = [0] * (n + 1)
    for a, b, s in iv.values():
        diff[a] += s
        diff[b + 1] -= s
    out, cur = [], 0
    for t in range(n):
        cur += diff[t]
        out.append(cur)
    return out
