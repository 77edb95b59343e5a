"""Calls whose effects another process or the user observes: the pass never runs them.

Note [Observable calls]
The pass runs a graph's program several times at its first call (the effect and
memory profiles, the guard's measurements of every program and variant: Note
[Profiling on real inputs] in ``inductor_pass/runtime/first_call.py``). Those runs
are invisible to the caller for what a program does to tensors: each runs on copies
of the inputs it may write, from the same random generator state, restored after it
(``guard.with_rng``), so it repeats the first call's draws and advances nothing.
They are not invisible for a call whose effect leaves the program's tensors:

- a collective (``torch.ops._c10d_functional.*`` and the other communication
  namespaces, :data:`COLLECTIVE_NAMESPACES`) pairs with the other ranks' calls.
  An extra run on one rank shifts that rank's later collectives by one call. How
  many runs a rank makes depended on its decision cache (a warm rank deploys the
  cached decision and runs nothing; Note [Decision cache] in
  ``inductor_pass/runtime/decision_cache.py``), so with rank 0's cache warm and
  rank 1's cold, every all-reduce from the second call on paired with the other
  rank's previous one (wrong outputs), and gloo then timed out.
- an operator registered as effectful (``torch.library._register_effectful_op``;
  torch registers ``aten::_print`` and calls on torchbind objects): it prints,
  logs, counts or talks to something outside the process.

A program that makes such a call is left unchanged, decided from its source alone
(:func:`observable_call`) before any of its kernels runs: every rank decides the
same whatever its cache holds, and the program runs as often as plain Inductor's.
Not among them: ``aten::_linalg_check_errors`` (registered effectful only so that
it is not removed; it raises on a failed factorization and does nothing else), and
operators without a declared effect, whose effects the schema states (writes to
their arguments, which the pass makes on copies; Note [Effect check scope] in
``inductor_pass/stages/effects.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import torch

from inductor_pass.program.kernel_sigs import dotted_name

__all__ = ["COLLECTIVE_NAMESPACES", "observable_call", "observable_node"]

COLLECTIVE_NAMESPACES = frozenset(
    {
        "_c10d_functional",
        "_c10d_functional_autograd",
        "c10d",
        "c10d_functional",
        "_dtensor",
        "symm_mem",
    }
)
"""Operator namespaces of collectives and of waits on them (torch 2.13)."""

_UNOBSERVABLE_EFFECTS = frozenset({"aten::_linalg_check_errors"})
"""Effectful by registration, unobservable when repeated (Note [Observable calls])."""

_NOT_RUN = frozenset({"get_args", "benchmark_compiled_module"})
"""Functions of a wrapper module that a call never runs (Inductor's benchmark harness)."""


def observable_call(source: str, resolve: Callable[[str], object]) -> str | None:
    """Why running the program once more would be observable, or None.

    Looks at every call in the wrapper module's functions (``call``, the
    ``Runner``'s methods, graph partitions), from the source alone: nothing
    runs (Note [Observable calls]).

    Args:
        source: The wrapper module's source.
        resolve: Maps a dotted name of the module to the object it names
            (:func:`inductor_pass.stages.rewrite.resolver`).

    Returns:
        None, or a sentence naming the first such call and what it is.
    """
    seen: set[str] = set()
    for fn in _functions(ast.parse(source)):
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            name = dotted_name(node.func)
            if name is None or name in seen:
                continue
            seen.add(name)
            why = _resolved(name, resolve)
            if why is not None:
                return f"calls {name}, {why}"
    return None


def _functions(tree: ast.Module) -> list[ast.AST]:
    out: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name not in _NOT_RUN:
                out.append(node)
        elif isinstance(node, ast.ClassDef):
            out.extend(
                n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return out


def observable_node(gm: torch.fx.GraphModule) -> str | None:
    """:func:`observable_call` on an FX graph, before Inductor compiles it, or None.

    The backend compiles no program variant of such a graph (Note [Program
    variants] in ``inductor_pass/variants/choose.py``): none would ever run.
    """
    with_effects = getattr(torch.ops.higher_order, "with_effects", None)
    seen: set[object] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if target is with_effects and len(node.args) > 1:
            target = node.args[1]  # the effectful operator under its token
        if target in seen:
            continue
        seen.add(target)
        why = _why(str(target), target)
        if why is not None:
            return f"calls {target}, {why}"
    return None


def _resolved(name: str, resolve: Callable[[str], object]) -> str | None:
    try:
        obj = resolve(name)
    except Exception:
        obj = None
    return _why(name, obj)


def _why(name: str, obj: object) -> str | None:
    ops: list[object] = []
    if isinstance(obj, torch._ops.OpOverload):
        namespace, ops = obj.namespace, [obj]
    elif isinstance(obj, torch._ops.OpOverloadPacket):
        namespace = obj._qualified_op_name.split("::")[0]
        ops = [getattr(obj, o) for o in obj.overloads()]
    elif isinstance(obj, torch._ops.HigherOrderOperator):
        namespace, ops = obj.namespace, [obj]
    elif obj is None and name.startswith("torch.ops."):
        namespace = name.split(".")[2] if name.count(".") >= 2 else ""
    else:
        return None
    if namespace in COLLECTIVE_NAMESPACES:
        return (
            "a collective: other ranks pair with every call, so the pass never runs "
            "the program (Note [Observable calls])"
        )
    for op in ops:
        qualname = _effectful(op)
        if qualname is not None:
            return (
                f"an operator registered with side effects ({qualname}): the pass never "
                "runs the program (Note [Observable calls])"
            )
    return None


def _effectful(op: object) -> str | None:
    """The qualified name of an operator registered as effectful, else None."""
    try:
        from torch._higher_order_ops.effects import _get_effect, _get_op_qualname

        qualname = _get_op_qualname(op)  # type: ignore[arg-type]
        effect = _get_effect(op)  # type: ignore[arg-type]
    except Exception:  # an operator torch's registry does not know: no declared effect
        return None
    if effect is None or qualname in _UNOBSERVABLE_EFFECTS:
        return None
    return qualname
