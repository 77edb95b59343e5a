"""The pass on programs with a C++ wrapper (``cpp_wrapper=True``).

Note [C++ wrapper]
A ``cpp_wrapper`` program's call sequence is C++, compiled into a shared
library: there is no Python statement list to permute, and the pass's profile
(per-statement live bytes, effects) needs one. But the order of that sequence
is the order of Inductor's scheduler nodes, and Inductor has a seam for it:
``config._post_fusion_custom_pass``, a list-of-nodes -> list-of-nodes hook run
after fusion (and before ``reorder_for_peak_memory``, which is turned off when
the hook gives the order). So:

1. At compile time, beside the C++ program Inductor compiles as always, the
   same graph is compiled once more with the Python wrapper: the *twin*. Its
   kernels are the same ones (Inductor's code cache shares them); only the
   call sequence is Python.
2. At the first call, the pass runs on the twin exactly as on any Python
   program (profiled on copies of the call's real inputs, Note [Profiling on
   real inputs] in ``inductor_pass/runtime/first_call.py``), and finds and
   certifies an order of the twin's statements.
3. If it found a lower one, the graph is compiled again, C++ wrapper and all,
   with the hook putting the scheduler nodes in that order: each node at the
   position of the first kernel call or allocation of the permuted twin that
   names one of its buffers (``bufN``: the names come from the lowering, so
   they are the same in both programs), nodes named by none (a multi-output
   item, a view) as early as their dependences allow. The order is made by a
   topological sort over the nodes' dependences (``unmet_dependencies`` and
   ``ancestors``), so the C++ program is valid whatever the mapping gives.
4. Both C++ programs are run on copies of the call's inputs: the permuted one
   is deployed only if its measured peak is lower and its outputs, the inputs
   it writes, and the aliasing of its outputs are bitwise those of the
   unpermuted one. The report gives the C++ programs' measured peaks, and the
   twin's modelled and measured ones in a note. The C++ program's own
   allocations follow Inductor's C++ codegen for that order (its buffer reuse
   is Inductor's), so the C++ peak is measured, not modelled.

Graphs whose twin is not compiled, with the reason in the report: symbolic or
data-dependent sizes (the order is chosen at one size, and a C++ program is
compiled per order), and graphs with observable calls (never run by the pass,
Note [Observable calls]). The AOTAutograd cache is off for ``cpp_wrapper``
compiles under the backend, so the inner compile (and the twin) always runs; the
FX graph cache still serves both programs. The permuted program is compiled at
the first call, outside the FX graph cache (the hook is not part of its key);
Inductor's code cache still serves its kernels and, in a warm process, its
wrapper library. The decision is kept in the pass's decision cache (keyed by
the twin's source and the call's signature): a warm process compiles the
cached order again and deploys it without profiling or guard runs.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inductor_pass.config import PassConfig
from inductor_pass.observe import span
from inductor_pass.program.wrapper_ast import StmtKind, parse_wrapper
from inductor_pass.report import GraphReport, failed, record
from inductor_pass.runtime import decision_cache
from inductor_pass.runtime.graph_copy import binds_unbacked_symbols, copy_graph
from inductor_pass.runtime.salt import pass_uuid
from inductor_pass.stages import guard
from inductor_pass.stages.rewrite import optimize_wrapper
from inductor_pass.variants.choose import Program, flipped_options

__all__ = [
    "CppTwin",
    "CppWrapperPass",
    "OrderRefused",
    "compare",
    "compile_twin",
    "hook_patch",
    "node_keys",
    "order_hook",
    "order_nodes",
    "refusal",
]

TWIN_NOTE = (
    "C++ wrapper: the pass ran on the graph's Python twin (the same graph and kernels, "
    "Python wrapper) and its order is carried to the C++ program (Note [C++ wrapper])"
)


TWIN_PATCH = {"cpp_wrapper": False, "triton.store_cubin": False}
"""The twin's Inductor options: a Python wrapper, as without ``cpp_wrapper`` (which also
turns ``triton.store_cubin`` on: kernel objects keep their binaries for the C++ side, and
the Python wrapper then resets flags in a ``for`` loop over its globals)."""


class OrderRefused(Exception):
    """The node-order hook found nothing to carry (the compile is abandoned)."""


@dataclass(kw_only=True, slots=True)
class CppTwin:
    """What the first call needs: the twin and a way to compile the C++ program again."""

    program: Program
    """The Python twin (loaded)."""
    recompile: Callable[[Callable[[list[Any]], list[Any]]], Any]
    """``recompile(hook)``: the C++ program compiled with ``hook`` as the post-fusion pass;
    returns its ``CompiledFxGraph``."""
    notes: list[str] = field(default_factory=list)


def twin_refusal(gm: Any, example_inputs: Any) -> str | None:
    """Why the twin of a ``cpp_wrapper`` graph is not compiled, or None."""
    from inductor_pass.stages.observable import observable_node

    why = guard.symbolic_inputs(example_inputs)
    if why:
        return f"C++ wrapper with symbolic sizes ({why}): an order is carried at static sizes only"
    if binds_unbacked_symbols(gm):
        return "C++ wrapper with data-dependent sizes: an order is carried at static sizes only"
    with contextlib.suppress(Exception):
        observable = observable_node(gm)
        if observable is not None:
            return observable  # Note [Observable calls]: nothing runs
    return None


def compile_twin(gm: Any, example_inputs: Any, kw: dict[str, Any]) -> CppTwin | str:
    """The Python twin of a ``cpp_wrapper`` graph, compiled now (before the C++ program).

    Returns:
        The twin, or why there is none (for the report).
    """
    from torch._guards import TracingContext, detect_fake_mode
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    from inductor_pass.runtime.state import collecting

    why = twin_refusal(gm, example_inputs)
    if why is not None:
        return why
    context = TracingContext.try_get()
    fake_mode = detect_fake_mode(example_inputs)
    pristine = copy_graph(gm)  # the permuted C++ program is compiled from this one
    twin_kw = {**kw, "cpp_wrapper": False} if "cpp_wrapper" in kw else kw
    with _kept_strides(context), span("C++ wrapper twin"):
        with collecting() as sink, inductor_config.patch(TWIN_PATCH):
            compile_fx_inner(copy_graph(gm), example_inputs, **twin_kw)
    if len(sink) != 1 or not isinstance(sink[0], Program):
        return f"no Python twin to profile ({sink!r:.80})"

    def recompile(hook: Callable[[list[Any]], list[Any]]) -> Any:
        from torch._guards import tracing
        from torch._inductor.virtualized import V

        patch = {
            **hook_patch(hook, inductor_config.reorder_for_peak_memory),
            "fx_graph_cache": False,
        }
        with (
            tracing(context) if context is not None else contextlib.nullcontext(),
            V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext(),
            _kept_strides(context),
            collecting(),
            inductor_config.patch(patch),
        ):
            return compile_fx_inner(copy_graph(pristine), example_inputs, **kw)

    return CppTwin(program=sink[0], recompile=recompile)


@contextlib.contextmanager
def _kept_strides(context: Any):
    """Leave the tracing context's output strides as they were (only the default
    program's compile may record them for AOTAutograd)."""
    strides = getattr(context, "output_strides", None)
    saved = list(strides) if strides is not None else None
    if strides is not None:
        strides.clear()
    try:
        yield
    finally:
        if saved is not None and strides is not None:
            strides[:] = saved


def node_keys(permuted_source: str) -> dict[str, int]:
    """Buffer name -> position of the first kernel call or allocation naming it in
    ``permuted_source`` (the twin's permuted program)."""
    keys: dict[str, int] = {}
    for pos, st in enumerate(parse_wrapper(permuted_source).region):
        if st.kind in (StmtKind.UNIT, StmtKind.ALLOC):
            for name in (*st.defines, *st.uses):
                keys.setdefault(name, pos)
    return keys


def order_nodes(nodes: list[Any], keys: dict[str, int]) -> tuple[list[Any], int]:
    """Scheduler ``nodes`` ordered by ``keys`` (Note [C++ wrapper], step 3).

    A topological sort over the nodes' dependences: among the nodes whose
    producers are all placed, the one with the smallest key goes next (nodes
    with no key first, then the original position breaks ties).

    Returns:
        ``(ordered nodes, number of nodes with a key)``.

    Raises:
        OrderRefused: No node has a key, or the dependences form no order.
    """
    owner: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for name in (*n.get_operation_names(), *n.get_buffer_names()):
            owner[name] = i
    prio: list[tuple[int, int]] = []
    keyed = 0
    for i, n in enumerate(nodes):
        found = [keys[b] for b in n.get_buffer_names() if b in keys]
        keyed += bool(found)
        prio.append((min(found) if found else -1, i))
    if not keyed:
        raise OrderRefused("no scheduler node's buffers appear in the twin's program")
    preds: list[set[int]] = []
    for i, n in enumerate(nodes):
        names = set(getattr(n, "ancestors", ()) or ())
        names |= {d.name for d in getattr(n, "unmet_dependencies", ())}
        preds.append({owner[x] for x in names if x in owner and owner[x] != i})
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [len(p) for p in preds]
    for i, p in enumerate(preds):
        for j in p:
            users[j].append(i)
    ready = [prio[i] for i in range(len(nodes)) if not waiting[i]]
    heapq.heapify(ready)
    out: list[Any] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, prio[u])
    if len(out) != len(nodes):
        raise OrderRefused(f"the dependences of {len(nodes) - len(out)} nodes form a cycle")
    return out, keyed


def order_hook(permuted_source: str) -> tuple[Callable[[list[Any]], list[Any]], dict[str, int]]:
    """Inductor's post-fusion hook putting the scheduler nodes in the order of the twin's
    ``permuted_source``, and the counts it fills (``nodes``, ``keyed``, ``moved``).

    The hook raises :class:`OrderRefused` when the order is Inductor's own.
    """
    keys = node_keys(permuted_source)
    moved: dict[str, int] = {}

    def hook(nodes: list[Any]) -> list[Any]:
        ordered, keyed = order_nodes(list(nodes), keys)
        moved.update(nodes=len(nodes), keyed=keyed)
        moved["moved"] = sum(a is not b for a, b in zip(ordered, nodes, strict=True))
        if not moved["moved"]:
            raise OrderRefused("the twin's order gives Inductor's node order")
        return ordered

    return hook, moved


def hook_patch(hook: Callable[[list[Any]], list[Any]], reorder_on: bool) -> dict[str, Any]:
    """Inductor options for a compile in ``hook``'s node order: the hook, and Inductor's
    own peak-memory reordering off where it is on (it runs after the hook)."""
    patch: dict[str, Any] = {"_post_fusion_custom_pass": hook}
    if reorder_on:
        patch.update(
            dict(flipped_options(["reorder_for_peak_memory"]))["reorder_for_peak_memory=False"]
        )
    return patch


def refusal(exc: BaseException) -> OrderRefused | None:
    """The hook's refusal behind a failed compile (Inductor wraps what a hook raises)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OrderRefused):
        cause = cause.__cause__ or cause.__context__
    return cause


def moved_note(moved: dict[str, int]) -> str:
    return (
        f"{moved.get('moved')} of {moved.get('nodes')} scheduler nodes moved; "
        f"{moved.get('keyed')} named in the twin"
    )


def compare(
    original: Callable[[list[Any]], Any],
    permuted: Callable[[list[Any]], Any],
    inputs: list[Any],
    owned: list[bool] | None,
    rep: GraphReport,
) -> tuple[int, int, bool]:
    """Both compiled programs run on copies of ``inputs``: ``(original peak, permuted peak,
    bitwise)``; bitwise covers outputs, the inputs they write and their outputs' aliasing.
    Fills the report's measured peaks (``byte_exact`` None: the compiled program plans
    its own buffer reuse, so its peak is measured, not modelled)."""
    measure = guard.measure_cuda if rep.device == "cuda" else guard.measure_cpu
    p0, out0, held0 = measure(original, inputs, owned=owned)
    p1, out1, held1 = measure(permuted, inputs, owned=owned)
    same = (
        guard.bitwise_equal(out0, out1)
        and guard.bitwise_equal(held0, held1)
        and guard.alias_pattern(out0) == guard.alias_pattern(out1)
    )
    rep.measured_original_peak, rep.measured_permuted_peak = p0, p1
    rep.bitwise_identical, rep.byte_exact = same, None
    return p0, p1, same


class CppWrapperPass:
    """The pass on a ``cpp_wrapper`` graph, run at its first call (Note [C++ wrapper])."""

    def __init__(
        self, call: Callable[[list[Any]], Any], twin: CppTwin, kind: str, config: PassConfig
    ) -> None:
        self.impl = call
        self._pending: tuple[CppTwin, str, PassConfig] | None = (twin, kind, config)
        self.report: GraphReport | None = None
        # What the backend sets on an armed pass (no variants are compiled for these graphs).
        self.variants: list[Any] = []
        self.variant_notes: list[str] = []
        self.variants_skipped = False

    def __call__(self, args: list[Any]) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            return self.impl(args)
        twin, kind, config = pending
        try:  # first, before anything else references the inputs
            owned: list[bool] | None = guard.input_ownership(args)
        except Exception:
            owned = None
        call = self.impl
        key = None
        try:
            with span("first-call pass (C++ wrapper)"):
                if decision_cache.enabled(config):
                    key = decision_cache.decision_key(
                        "cpp_wrapper\n" + twin.program.source,
                        pass_uuid(config),
                        decision_cache.call_signature(args, owned),
                    )
                cached = self._from_cache(key, twin) if key is not None else None
                if cached is not None:
                    rep, chosen = cached
                else:
                    rep, chosen = self._run(args, owned, twin, kind, config)
                    if key is not None:
                        decision = {"permuted": rep.permuted_source if chosen else None}
                        decision_cache.store(key, decision, rep.as_dict())
        except Exception as exc:
            rep, chosen = failed(kind, twin.program.source, exc), None
            rep.notes.append(TWIN_NOTE)
        self.report = rep
        record(rep, print_it=config.report, dump_dir=config.dump_dir)
        if chosen is not None:
            self.impl = chosen
        return call(args)

    def _from_cache(self, key: str, twin: CppTwin):
        """``(report, program)`` from the pass's decision cache, or None (Note [Decision
        cache] in ``inductor_pass/runtime/decision_cache.py``): a deployed order is compiled
        again (Inductor's code cache holds its library) and run without a new guard, as a
        cached Python program is."""
        entry = decision_cache.load(key)
        if entry is None:
            return None
        permuted = (entry.get("decision") or {}).get("permuted")
        rep = GraphReport.from_dict(entry.get("report") or {})
        rep.original_source = twin.program.source
        chosen = None
        if isinstance(permuted, str):
            keys = node_keys(permuted)
            with span("C++ wrapper recompile"):
                compiled = twin.recompile(lambda nodes: order_nodes(list(nodes), keys)[0])
            chosen = compiled.current_callable
            rep.permuted_source = permuted
        rep.pass_seconds = 0.0
        rep.notes = [*rep.notes, f"decision from the pass's cache ({key[:16]})"]
        return rep, chosen

    def _run(self, args, owned, twin: CppTwin, kind: str, config: PassConfig):
        t0 = time.perf_counter()
        prog = twin.program
        rep, new_call, _ = optimize_wrapper(
            prog.source,
            prog.globals or {},
            list(args),
            original_call=prog.call,
            partitions=prog.partitions,
            config=config,
            kind=kind,
            owned=owned,
        )
        rep.notes.append(TWIN_NOTE)
        rep.notes.extend(twin.notes)
        rep.deployed = False

        def done(reason: str):
            rep.reason = reason
            rep.pass_seconds = time.perf_counter() - t0
            return rep, None

        if new_call is None:
            return done(f"{rep.reason} (C++ program unchanged)")
        if rep.permuted_order is None or rep.permuted_source is None:
            return done(
                "left unchanged: the twin's program is recomputed, not permuted; only an "
                "order is carried to the C++ program"
            )
        twin_peaks = (rep.measured_original_peak, rep.measured_permuted_peak)
        rep.notes.append(
            f"twin (Python wrapper): modelled {rep.modelled_original_peak} -> "
            f"{rep.modelled_permuted_peak} B, measured {twin_peaks[0]} -> {twin_peaks[1]} B"
        )
        hook, moved = order_hook(rep.permuted_source)

        try:
            with span("C++ wrapper recompile"):
                compiled = twin.recompile(hook)
        except OrderRefused as exc:
            return done(f"left unchanged: {exc} (C++ program unchanged)")
        except Exception as exc:
            cause = refusal(exc)
            if cause is not None:
                return done(f"left unchanged: {cause} (C++ program unchanged)")
            raise
        permuted = compiled.current_callable
        rep.notes.append(f"C++ program compiled with the twin's order ({moved_note(moved)})")
        with span("C++ wrapper guard"):
            p0, p1, same = compare(self.impl, permuted, list(args), owned, rep)
        if not same:
            return done(
                "left unchanged: the permuted C++ program's outputs are not bitwise the original's"
            )
        if p1 >= p0:
            return done(
                f"left unchanged: the permuted C++ program measured {p1} B, not below {p0} B"
            )
        if not config.deploy:
            return done(f"not deployed (PassConfig.deploy=False): C++ program {p0} -> {p1} B")
        rep.deployed = True
        rep.reason = f"deployed: the C++ program with the twin's order measured {p0} -> {p1} B"
        rep.pass_seconds = time.perf_counter() - t0
        return rep, permuted
