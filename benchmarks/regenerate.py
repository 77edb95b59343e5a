"""The regeneration baseline: give the pass's order back to Inductor and let it regenerate.

Note [Regeneration baseline]
The pass rewrites the program Inductor emitted (it permutes the wrapper's
statements and places allocations and ``del`` itself). The alternative is to
return the better order to the compiler: compile the graph again with
Inductor's scheduler nodes in that order and let Inductor generate the
program, with its own allocation, buffer reuse and ``del`` placement. This
module does that, for benchmarks only (nothing here is deployed):

- :func:`order_pass` is a ``_post_fusion_custom_pass`` (torch 2.13's
  scheduler hook, run right after fusion) that sorts the fused scheduler
  nodes into a target order. The compile runs with
  ``reorder_for_peak_memory=False`` (Inductor's own reordering runs after
  the hook and would undo it) and without the FX graph cache (the hook is
  not part of its key).
- The target order comes from the pass's program text: its kernel-call
  statements (``UNIT``), each matched to the scheduler nodes whose buffers it
  binds or writes (buffer names are fixed at lowering, so they are the same
  in every program variant). A node that matches no call (a multi-output
  projection, a concat's allocation) goes right after the nodes it depends
  on, or, if it depends on none, right before its first user. The sort is
  topological (scheduler ancestors), so an order that breaks a scheduler
  dependence is repaired, never emitted.
- :class:`Capture` records what a regeneration needs per graph compiled
  through the ``torch_replay`` backend while it is active: a copy of the FX
  graph before compilation, its example inputs and compile options, and at
  the first call copies of the real inputs, their ownership (Note [Input
  ownership] in ``inductor_pass/stages/guard.py``), the original call and the
  pass's report. It is a compile observer of the backend (Note [Compile
  observers] in ``inductor_pass/observe.py``): nothing of the pass is
  patched. :func:`regenerate` then compiles and measures the regenerated
  program exactly as the guard measures the pass's programs, collecting it
  with ``inductor_pass.runtime.state.collecting`` instead of arming the pass.

Predicted is the pass's modelled peak for its order; measured is the
regenerated program's peak under the counting allocator, as the runtime
calls it.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inductor_pass.observe import CompileObserver, observing
from inductor_pass.program.units import declared_effects
from inductor_pass.program.wrapper_ast import StmtKind, parse_wrapper
from inductor_pass.runtime.backend import install_post_compile_hook
from inductor_pass.runtime.graph_copy import copy_graph
from inductor_pass.runtime.state import collecting
from inductor_pass.stages import guard
from inductor_pass.variants.choose import Program

__all__ = ["Capture", "GraphCapture", "Regenerated", "unit_names", "order_pass", "regenerate"]


def unit_names(source: str) -> list[set[str]]:
    """Per kernel-call statement of a wrapper, in text order: the names it binds or writes."""
    wrapper = parse_wrapper(source)

    def resolve(dotted: str) -> object:
        obj: Any = torch
        parts = dotted.split(".")
        if parts[0] != "torch":
            raise KeyError(dotted)
        for p in parts[1:]:
            obj = getattr(obj, p)
        return obj

    out = []
    for st in wrapper.region:
        if st.kind is not StmtKind.UNIT:
            continue
        try:
            written, _ = declared_effects(st, wrapper, resolve)
        except Exception:
            written = set()
        out.append(set(st.defines) | set(written))
    return out


class order_pass:  # noqa: N801 - used as a callable config value
    """``_post_fusion_custom_pass`` putting scheduler nodes in the order of ``units``.

    Args:
        units: Per kernel call of the target program, in the target order, the
            buffer names it binds or writes (:func:`unit_names`).
    """

    def __init__(self, units: Sequence[set[str]]) -> None:
        self.rank: dict[str, int] = {}
        for pos, names in enumerate(units):
            for n in names:
                self.rank.setdefault(n, pos)
        self.matched = 0
        self.nodes = 0
        self.repaired = 0

    def __call__(self, nodes: list[Any]) -> list[Any]:
        n = len(nodes)
        ops = [set(node.get_operation_names()) for node in nodes]
        op_owner = {op: i for i, names in enumerate(ops) for op in names}
        deps: list[set[int]] = []
        for i, node in enumerate(nodes):
            anc = getattr(node, "ancestors", None) or ()
            deps.append({op_owner[a] for a in anc if a in op_owner and op_owner[a] != i})
        users: list[set[int]] = [set() for _ in range(n)]
        for i, d in enumerate(deps):
            for j in d:
                users[j].add(i)
        rank: list[float | None] = []
        for node in nodes:
            hits = [self.rank[b] for b in node.get_buffer_names() if b in self.rank]
            rank.append(float(min(hits)) if hits else None)
        self.nodes, self.matched = n, sum(r is not None for r in rank)
        # Unmatched nodes: after the nodes they depend on, else before their first user.
        for i in range(n):  # nodes come in a topological order
            if rank[i] is None and deps[i]:
                known = [rank[j] for j in deps[i] if rank[j] is not None]
                rank[i] = (max(known) + 0.5) if known else None
        for _ in range(n):
            changed = False
            for i in range(n):
                if rank[i] is None:
                    known = [rank[j] for j in users[i] if rank[j] is not None]
                    if known:
                        rank[i] = min(known) - 0.5
                        changed = True
            if not changed:
                break
        key = [(r if r is not None else float("inf"), i) for i, r in enumerate(rank)]
        # Kahn's algorithm, smallest key first: the target order where it is legal.
        indeg = [len(d) for d in deps]
        import heapq

        ready = [key[i] for i in range(n) if indeg[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, i = heapq.heappop(ready)
            order.append(i)
            for u in users[i]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(ready, key[u])
        if len(order) != n:  # a cycle: keep Inductor's order
            return nodes
        self.repaired = sum(
            1 for a, b in zip(order, sorted(range(n), key=lambda i: key[i]), strict=True) if a != b
        )
        return [nodes[i] for i in order]


@dataclass(kw_only=True)
class GraphCapture:
    """What the regeneration of one graph needs (see :class:`Capture`)."""

    gm: Any
    example_inputs: list[Any]
    kwargs: dict[str, Any]
    source: str
    fake_mode: Any = None
    inputs: list[Any] | None = None
    """Copies of the first call's real inputs."""
    owned: list[bool] | None = None
    original_call: Any = None
    report: Any = None


@dataclass(kw_only=True)
class Regenerated:
    """A regenerated program and its measured peak."""

    source: str
    measured_peak: int
    bitwise: bool
    """Outputs and final inputs equal to Inductor's default program's, bit for bit."""
    matched: int
    """Scheduler nodes matched to a kernel call of the target program."""
    nodes: int
    in_order: bool
    """The regenerated kernel calls follow the target order."""
    notes: list[str] = field(default_factory=list)


class Capture(CompileObserver):
    """Record regeneration material for graphs compiled through ``torch_replay`` (benchmarks).

    Use as a context manager around compiling and running the first step;
    ``graphs`` then holds one :class:`GraphCapture` per graph whose first
    call ran.
    """

    def __init__(self) -> None:
        self.pending: dict[str, GraphCapture] = {}
        self.graphs: list[GraphCapture] = []
        self.overhead_s = 0.0
        """Time spent in the capture itself (copies), to subtract from compile times."""
        self._before: dict[int, Any] = {}
        self._observing: Any = None

    def __enter__(self) -> Capture:
        self._observing = observing(self)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._observing.__exit__(*exc)

    def before_inner_compile(self, gm: Any, example_inputs: Any, kwargs: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self._before[id(gm)] = copy_graph(gm)
        self.overhead_s += time.perf_counter() - t0

    def after_inner_compile(
        self, gm: Any, example_inputs: Any, kwargs: dict[str, Any], compiled: Any
    ) -> None:
        from torch._guards import detect_fake_mode

        gm_copy = self._before.pop(id(gm))
        src = getattr(compiled, "source_code", None)
        if isinstance(src, str):
            self.pending[src] = GraphCapture(
                gm=gm_copy,
                example_inputs=list(example_inputs),
                kwargs=dict(kwargs),
                source=src,
                fake_mode=detect_fake_mode(example_inputs),
            )

    def first_call(self, source, args, owned, original_call, report, seconds) -> None:
        g = self.pending.pop(source, None)
        if g is None:
            return
        t0 = time.perf_counter()
        g.inputs = guard.copy_real_inputs(args)
        g.owned = list(owned) if owned is not None else None
        g.original_call = original_call
        g.report = report
        self.graphs.append(g)
        self.overhead_s += time.perf_counter() - t0


def _kernel_calls_follow(regen_source: str, target: Sequence[set[str]]) -> bool:
    """Whether the regenerated program's kernel calls come in the target's order.

    Each regenerated call is matched to the first unused target call with the
    same names (several calls may write one buffer, e.g. a fill and an
    in-place accumulation); calls without a match are ignored.
    """
    free: dict[frozenset[str], list[int]] = {}
    for pos, names in enumerate(target):
        free.setdefault(frozenset(names), []).append(pos)
    seq = []
    for names in unit_names(regen_source):
        queue = free.get(frozenset(names))
        if queue:
            seq.append(queue.pop(0))
    return seq == sorted(seq)


def regenerate(g: GraphCapture, target_source: str) -> Regenerated:
    """Compile ``g`` with its scheduler nodes in the order of ``target_source``'s kernel calls.

    Args:
        g: A captured graph whose first call ran (``g.inputs`` set).
        target_source: The program whose kernel-call order is fed back (the
            pass's permuted program).

    Returns:
        The regenerated program, measured on copies of the first call's
        inputs with the first call's input ownership.

    Raises:
        Exception: If the graph cannot be recompiled or has no Python wrapper.
    """
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    if g.inputs is None:
        raise ValueError("the graph's first call did not run; nothing to measure on")
    install_post_compile_hook()
    units = unit_names(target_source)
    hook = order_pass(units)
    patches = {
        "reorder_for_peak_memory": False,
        "fx_graph_cache": False,
        "_post_fusion_custom_pass": hook,
    }
    ctx = TracingContext(g.fake_mode) if g.fake_mode is not None else None
    with contextlib.ExitStack() as stack:
        if ctx is not None:
            stack.enter_context(tracing(ctx))
        sink = stack.enter_context(collecting())
        stack.enter_context(inductor_config.patch(patches))
        compile_fx_inner(copy.deepcopy(g.gm), g.example_inputs, **g.kwargs)
    got = [s for s in sink if isinstance(s, Program)]
    if len(got) != 1:
        raise RuntimeError(f"regeneration produced {len(sink)} programs ({sink!r:.120})")
    source, call = got[0].source, got[0].call
    peak, out_r, in_r = guard.measure_cpu(call, g.inputs, owned=g.owned)
    _, out_o, in_o = guard.measure_cpu(g.original_call, g.inputs, owned=g.owned)
    same = guard.bitwise_equal([*out_o, *in_o], [*out_r, *in_r])
    notes = []
    if hook.repaired:
        notes.append(f"{hook.repaired} node(s) placed against the target order (dependences)")
    return Regenerated(
        source=source,
        measured_peak=int(peak),
        bitwise=bool(same),
        matched=hook.matched,
        nodes=hook.nodes,
        in_order=_kernel_calls_follow(source, units),
        notes=notes,
    )
