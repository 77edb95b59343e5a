"""A variant program's lower bound from its source and the default program's profile.

Note [Variant bound]
A program variant (Note [Program variants] in ``inductor_pass/variants/choose.py``)
can only be deployed when its measured peak is strictly below the default
program's deployed one, ``P``. Running the pass on a variant needs its C++
kernels, and compiling those is most of what a variant costs at a cold
compile (about one second of CPU per kernel body the default does not share,
``benchmarks/results/compile_tv.md``). So the variant's kernels are built lazily (Note [Lazy variant
kernels] in ``inductor_pass/variants/kernels.py``), and at the first call the pass
first bounds the variant from its source alone: if no order of its kernel
calls can peak below ``P``, it is reported with that bound and never built.

The bound is the pass's own (``inductor_pass/program/permute.py``: the scheduling
core's lower bounds over the unit DAG) computed on a *static* model of the
variant (:func:`static_model`), which is built from the same statement rules
as the profiled model, with sizes taken from the default program's profile:

- inputs are the default's input storages (same graph, same call, same
  ownership);
- a name bound by a kernel call whose callee is the one that binds the same
  name in the default program is that buffer (Inductor names buffers at
  lowering, which both programs share): it has the default's storages and
  sizes; any other call result has size 0;
- ``empty_strided*`` allocations have the size their arguments give;
  ``bufA = bufB`` and ``reinterpret_tensor`` share storages, and a tuple
  projection ``bufA = bufB[i]`` is the default's same projection;
- a statement's transient is its results' bytes (plus, for a non-generated
  call whose text the default has too, the default's measured transient);
- dependences come from :func:`inductor_pass.program.units.build_dependences`, as for
  the profiled model.

Every size and transient is at most the real one, so every order's modelled
peak is at most its real modelled peak, and the bound stays a lower bound.
What is not checked on the variant itself, the storage rules, is checked on
the default program: the same rules applied to the default's source must give
exactly its profiled storages, sizes and live bytes after every statement
(:func:`confirm_rules`); otherwise no bound is used and the variant is run.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import torch

from inductor_pass.program.kernel_sigs import dotted_name
from inductor_pass.program.units import ProgramModel, build_dependences, simulate
from inductor_pass.program.wrapper_ast import Stmt, StmtKind, Wrapper, parse_wrapper

__all__ = ["StaticModelError", "alloc_bytes", "static_model", "confirm_rules", "variant_bound"]


class StaticModelError(Exception):
    """The static rules cannot model this program (the reason is the message)."""


def alloc_bytes(st: Stmt) -> int | None:
    """Storage bytes of an ``empty_strided*(size, stride, dtype)`` statement; None if not literal."""
    call = getattr(st.node, "value", None)
    if not isinstance(call, ast.Call) or len(call.args) < 3:
        return None
    try:
        size = ast.literal_eval(call.args[0])
        stride = ast.literal_eval(call.args[1])
    except (ValueError, SyntaxError, TypeError):
        return None
    dotted = dotted_name(call.args[2]) or ""
    dtype = getattr(torch, dotted.rsplit(".", 1)[-1], None)
    if not isinstance(dtype, torch.dtype) or not isinstance(size, tuple):
        return None
    if not isinstance(stride, tuple) or len(size) != len(stride):
        return None
    if not all(isinstance(v, int) for v in (*size, *stride)):
        return None
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * t for s, t in zip(size, stride, strict=True))) * dtype.itemsize


def _bindings(wrapper: Wrapper) -> dict[str, Stmt | None]:
    """The region statement binding each name (None when a name is bound twice)."""
    out: dict[str, Stmt | None] = {}
    for st in wrapper.region:
        for n in st.defines:
            out[n] = None if n in out else st
    return out


def static_model(wrapper: Wrapper, default: ProgramModel) -> ProgramModel:
    """The static model of ``wrapper`` with sizes from ``default`` (Note [Variant bound]).

    Raises:
        StaticModelError: A statement has no sound static model.
    """
    if list(wrapper.input_names) != list(default.wrapper.input_names):
        raise StaticModelError("the programs' inputs differ")
    bound_in_default = _bindings(default.wrapper)
    names: dict[str, frozenset[int]] = {}
    sizes: dict[int, int] = {}
    claimed: set[int] = set()
    for n in wrapper.input_names:
        ss = default.name_storages.get(n, frozenset())
        names[n] = ss
        claimed |= ss
    sizes.update({s: default.sizes[s] for s in claimed})
    fresh = max(default.sizes, default=-1) + 1
    transient: list[int] = []
    for st in wrapper.region:
        t = 0
        if st.kind is StmtKind.ALIAS:
            (name,) = st.defines
            source = names.get(st.alias_of or "", frozenset())
            if isinstance(getattr(st.node, "value", None), ast.Subscript):  # tuple projection
                d = bound_in_default.get(name)
                theirs = default.name_storages.get(name, frozenset())
                if (
                    d is None
                    or d.kind is not StmtKind.ALIAS
                    or ast.dump(d.node.value) != ast.dump(st.node.value)  # type: ignore[attr-defined]
                    or not theirs <= source
                ):
                    raise StaticModelError(f"projection {st.text.strip()!r} has no counterpart")
                names[name] = theirs
            else:
                names[name] = source
        elif st.kind is StmtKind.ALLOC:
            (name,) = st.defines
            b = alloc_bytes(st) or 0  # unknown: 0 keeps a lower bound
            names[name] = frozenset([fresh])
            sizes[fresh] = t = b
            fresh += 1
        elif st.kind is StmtKind.UNIT:
            for name in st.defines:
                d = bound_in_default.get(name)
                theirs = default.name_storages.get(name)
                if (
                    d is not None
                    and d.kind is StmtKind.UNIT
                    and d.callee == st.callee
                    and theirs is not None
                ):
                    if theirs & claimed:
                        raise StaticModelError(f"result {name} of {st.callee} is not a new buffer")
                    names[name] = theirs
                    claimed |= theirs
                    for s in theirs:
                        sizes[s] = default.sizes[s]
                        t += default.sizes[s]
                else:  # a result the default lacks: size unknown, counted as 0
                    names[name] = frozenset([fresh])
                    sizes[fresh] = 0
                    fresh += 1
            base = (st.callee or "").removesuffix(".run")
            if base not in wrapper.kernels:  # extern/fallback calls: workspace as profiled
                for d in default.wrapper.region:
                    if d.kind is StmtKind.UNIT and d.text == st.text:
                        t = max(t, default.transient[d.index])
                        break
        transient.append(t)
    return ProgramModel(
        wrapper=wrapper,
        name_storages=names,
        sizes=sizes,
        external=default.external,
        owned=default.owned,
        transient=transient,
    )


def confirm_rules(default: ProgramModel) -> str | None:
    """Why the static rules do not reproduce the default's profiled model, or None."""
    try:
        mine = static_model(default.wrapper, default)
    except StaticModelError as exc:
        return str(exc)
    match: dict[int, int] = {}
    for name, theirs in default.name_storages.items():
        ours = mine.name_storages.get(name)
        if ours is None:
            continue  # module-level constants: external, never counted
        if ours == theirs:
            continue
        if len(ours) != 1 or len(theirs) != 1:
            return f"{name}: storages {sorted(ours)} vs profiled {sorted(theirs)}"
        (a,), (b,) = ours, theirs
        if match.setdefault(a, b) != b or mine.sizes[a] != default.sizes[b]:
            return f"{name}: {mine.sizes[a]} B vs profiled {default.sizes[b]} B"
    if len(set(match.values())) != len(match):
        return "two static storages are one profiled storage"
    order = list(range(len(default.wrapper.region)))
    if simulate(mine, order)[1] != simulate(default, order)[1]:
        return "live bytes differ from the profile"
    return None


def variant_bound(
    source: str,
    default: ProgramModel,
    resolve: Callable[[str], object],
    *,
    time_limit_s: float = 1.0,
) -> tuple[int | None, str]:
    """A lower bound on the modelled peak of every order of the variant ``source``.

    Args:
        source: The variant wrapper's source.
        default: The default program's profiled model (same graph, same call).
        resolve: Callee resolver (for the declared effects of ``torch.ops`` calls).
        time_limit_s: Budget of the scheduling core's search.

    Returns:
        ``(bound, why)``: ``bound`` is None when none can be given (``why`` says
        why); otherwise ``why`` names the bound.
    """
    from inductor_pass.program.permute import search_order

    problem = confirm_rules(default)
    if problem is not None:
        return None, f"the static rules disagree with the default's profile ({problem})"
    try:
        model = static_model(parse_wrapper(source), default)
    except StaticModelError as exc:
        return None, str(exc)
    units, edges, attached, tail = build_dependences(model, resolve)
    res = search_order(model, units, edges, attached, tail, time_limit_s=time_limit_s)
    if res.lower_bound is None:
        return None, f"no bound for the variant's static model ({res.note})"
    return res.lower_bound, "the scheduling core's bound on the variant's static model"
