"""Parse an Inductor Python wrapper into classified statements (design.md §3.1).

The wrapper's ``call`` (a module-level function or ``Runner.call``) is parsed
with :mod:`ast`. Its *region* is the statement list that the pass may permute:
the body of ``call`` (or of the single ``with`` device-guard block inside it),
without the argument unpacking prologue and the final ``return``. Each region
statement gets a :class:`StmtKind`:

- ``ALLOC``: ``bufN = empty_strided_cpu(...)`` (any ``empty_strided*``);
- ``ALIAS``: ``bufA = bufB`` (``# reuse`` / ``# alias`` lines), ``bufA =
  bufB[0]`` (tuple projection of a fallback output), ``bufA =
  reinterpret_tensor(bufB, ...)``;
- ``CHECK``: ``assert_size_stride`` / ``assert_alignment`` and, from torch 2.14,
  ``assert_size_stride_grouped`` / ``assert_tensor_metadata`` (metadata checks, no
  effect on bytes; as units they were barriers with unknown effects, which made
  the effect check hash every live storage around each: ``benchmarks/results/compile_tv.md``);
- ``DEL``: ``del name`` (frees the storage when it was the last reference);
- ``UNIT``: anything else (kernel calls: C++ ``cpp_pybinding`` kernels,
  ``extern_kernels.*``, ``torch.ops.*`` fallbacks, Triton ``.run``), and the
  statements of data-dependent sizes (Note [Data-dependent sizes] in
  ``inductor_pass/program/unbacked.py``): a *size query* ``u0 = buf2.size(0)`` /
  ``u0 = buf0.item()`` (callee ``Tensor.size`` / ``Tensor.item``: it reads its
  tensor and binds an unbacked symbol) and an ``if`` statement, one unit that
  is never split (its uses and bindings are the names it loads and stores
  anywhere inside). An ``if`` whose body only raises and whose test calls
  nothing is a *runtime check* of the symbols (``Stmt.check_if``); any other is
  a barrier with unknown effects.

``bufN = None`` (Inductor's name for a node without a buffer) is an ``ALIAS``
of nothing (``alias_of`` None).

Kernel signatures are read from the module source
(``inductor_pass/program/kernel_sigs.py``).
"""

from __future__ import annotations

import ast
import enum
import re
from dataclasses import dataclass

from inductor_pass.program.kernel_sigs import KernelSig, dotted_name, kernel_sigs, names_in

__all__ = [
    "StmtKind",
    "Stmt",
    "Wrapper",
    "UnsupportedWrapper",
    "QUERY_CALLEES",
    "SIZE_QUERIES",
    "parse_wrapper",
    "render_region",
    "unbound_names",
]


class UnsupportedWrapper(Exception):
    """The wrapper has a shape the pass does not permute (the reason is the message)."""


class StmtKind(enum.Enum):
    ALLOC = "alloc"
    ALIAS = "alias"
    CHECK = "check"
    DEL = "del"
    UNIT = "unit"


_ALLOC_FUNCS = re.compile(r"^(torch\.)?empty_strided(_[a-z0-9_]+)?$")
SIZE_QUERIES = frozenset({"size", "stride", "item", "numel", "storage_offset", "dim"})
"""Tensor methods a size query calls (``u0 = buf2.size(0)``, ``u0 = buf0.item()``): they
read their tensor, write nothing and bind a Python number; the callee is ``Tensor.<name>``."""

QUERY_CALLEES = frozenset(f"Tensor.{m}" for m in SIZE_QUERIES)
"""The callees of size-query units."""

_CHECK_FUNCS = {
    "assert_size_stride",
    "assert_alignment",
    "assert_size_stride_grouped",
    "assert_tensor_metadata",
}


@dataclass(kw_only=True, slots=True)
class Stmt:
    """One statement of the permutable region."""

    index: int
    """Position in the original region."""
    node: ast.stmt
    kind: StmtKind
    text: str
    """Source text of the statement (with its trailing comment), first line unindented."""
    comments: list[str]
    """Comment lines directly above the statement."""
    defines: list[str]
    """Names bound by the statement."""
    deletes: list[str]
    """Names deleted by the statement."""
    uses: list[str]
    """Names read by the statement (excluding the callee expression)."""
    callee: str | None = None
    """Dotted callee of a unit's call (``extern_kernels.addmm``, ``cpp_fused_0``, ``k.run``)."""
    alias_of: str | None = None
    """Source name of an ``ALIAS`` (None for ``bufN = None``)."""
    check_if: bool = False
    """An ``if <test>: raise ...`` unit whose test calls nothing: a runtime check of
    unbacked symbols (Note [Data-dependent sizes] in ``inductor_pass/program/unbacked.py``)."""


@dataclass(kw_only=True, slots=True)
class Wrapper:
    """A parsed wrapper module."""

    source: str
    tree: ast.Module
    call_node: ast.FunctionDef
    """The ``call`` function (module level or in ``class Runner``)."""
    in_runner: bool
    region: list[Stmt]
    region_indent: str
    region_first_line: int
    """1-based first line of the region in ``source``."""
    region_last_line: int
    """1-based last line of the region (inclusive)."""
    input_names: list[str]
    kernels: dict[str, KernelSig]


def _find_call(tree: ast.Module) -> tuple[ast.FunctionDef, bool]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Runner":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "call":
                    return item, True
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            return node, False
    raise UnsupportedWrapper("no `call` function (module level or Runner.call) in the wrapper")


def _stmt_text(
    lines: list[str], node: ast.stmt, line_owner: dict[int, ast.stmt]
) -> tuple[list[str], str]:
    """Comment lines above ``node``, and its source with a trailing comment."""
    first, last = node.lineno, node.end_lineno or node.lineno
    seg_lines = lines[first - 1 : last]
    if first == last:
        body = seg_lines[0][node.col_offset : node.end_col_offset]
    else:
        body = "\n".join(
            [
                seg_lines[0][node.col_offset :],
                *seg_lines[1:-1],
                seg_lines[-1][: node.end_col_offset],
            ]
        )
    # Trailing comment: only for the last statement on its last line.
    rest = lines[last - 1][node.end_col_offset :]
    if line_owner.get(last) is node and rest.strip().startswith("#"):
        body += "  " + rest.strip()
    # Leading comments: contiguous comment lines directly above (first statement on its line).
    leading: list[str] = []
    if lines[first - 1][: node.col_offset].strip() == "":
        k = first - 2
        while k >= 0 and lines[k].strip().startswith("#"):
            leading.insert(0, lines[k].strip())
            k -= 1
    return leading, body


def _classify(node: ast.stmt) -> tuple[StmtKind, list[str], list[str], str | None, str | None]:
    """Returns kind, defines, deletes, callee, alias_of."""
    if isinstance(node, ast.Delete):
        names = []
        for t in node.targets:
            if not isinstance(t, ast.Name):
                raise UnsupportedWrapper(f"del of a non-name at line {node.lineno}")
            names.append(t.id)
        return StmtKind.DEL, [], names, None, None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        callee = dotted_name(node.value.func)
        if callee in _CHECK_FUNCS:
            return StmtKind.CHECK, [], [], callee, None
        return StmtKind.UNIT, [], [], callee, None
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        value = node.value
        if isinstance(target, ast.Name):
            if isinstance(value, ast.Name):
                return StmtKind.ALIAS, [target.id], [], None, value.id
            if (
                isinstance(value, ast.Subscript)
                and isinstance(value.value, ast.Name)
                and isinstance(value.slice, ast.Constant)
            ):
                return StmtKind.ALIAS, [target.id], [], None, value.value.id
            if isinstance(value, ast.Constant) and value.value is None:
                return StmtKind.ALIAS, [target.id], [], None, None
            if isinstance(value, ast.Call) and _size_query(value):
                assert isinstance(value.func, ast.Attribute)
                return StmtKind.UNIT, [target.id], [], f"Tensor.{value.func.attr}", None
            if isinstance(value, ast.Call):
                callee = dotted_name(value.func)
                if callee is not None and _ALLOC_FUNCS.match(callee):
                    return StmtKind.ALLOC, [target.id], [], callee, None
                if (
                    callee == "reinterpret_tensor"
                    and value.args
                    and isinstance(value.args[0], ast.Name)
                ):
                    return StmtKind.ALIAS, [target.id], [], None, value.args[0].id
                return StmtKind.UNIT, [target.id], [], callee, None
            raise UnsupportedWrapper(f"unrecognised assignment at line {node.lineno}")
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, ast.Call):
            names = []
            for elt in target.elts:
                if not isinstance(elt, ast.Name):
                    raise UnsupportedWrapper(f"nested unpacking at line {node.lineno}")
                names.append(elt.id)
            return StmtKind.UNIT, names, [], dotted_name(value.func), None
    if isinstance(node, ast.If):
        for n in ast.walk(node):
            if isinstance(n, (ast.Delete, ast.Return, ast.Global, ast.Nonlocal)) or (
                isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del)
            ):
                raise UnsupportedWrapper(
                    f"`if` statement at line {node.lineno} deletes a name or returns "
                    "(an `if` is one unit: its bindings only, nothing freed inside)"
                )
        return StmtKind.UNIT, _stored_names(node), [], None, None
    raise UnsupportedWrapper(
        f"statement of type {type(node).__name__} at line {node.lineno} is not permuted"
    )


def _size_query(call: ast.Call) -> bool:
    """``t.size(0)``, ``t.item()``, ``t[0].size(0)``: a tensor method of
    :data:`SIZE_QUERIES` on a name (or a constant projection of one) with constant arguments."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in SIZE_QUERIES):
        return False
    recv = func.value
    if isinstance(recv, ast.Subscript) and isinstance(recv.slice, ast.Constant):
        recv = recv.value
    return (
        isinstance(recv, ast.Name)
        and not call.keywords
        and all(isinstance(a, ast.Constant) for a in call.args)
    )


def _stored_names(node: ast.stmt) -> list[str]:
    """Names a compound statement binds anywhere inside, in first-seen order, once each."""
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in out:
            out.append(n.id)
    return out


def _is_check_if(node: ast.If) -> bool:
    """``if <test>: raise ...`` with no ``else`` and no call in the test."""
    return (
        not node.orelse
        and len(node.body) == 1
        and isinstance(node.body[0], ast.Raise)
        and not any(isinstance(n, ast.Call) for n in ast.walk(node.test))
    )


def parse_wrapper(source: str) -> Wrapper:
    """Parse a wrapper module and classify the statements of its ``call`` region.

    Args:
        source: The wrapper's Python source (``CompiledFxGraph.source_code``).

    Returns:
        A :class:`Wrapper`.

    Raises:
        UnsupportedWrapper: The wrapper has a shape the pass leaves unchanged
            (the message says which).
        SyntaxError: ``source`` is not Python.
    """
    tree = ast.parse(source)
    call_node, in_runner = _find_call(tree)
    body = list(call_node.body)
    if len(call_node.args.args) < 1:
        raise UnsupportedWrapper("`call` takes no argument list")
    args_name = call_node.args.args[-1].arg
    input_names: list[str] = []
    # Prologue: `a, b = args` and `args.clear()`.
    i = 0
    while i < len(body):
        node = body[i]
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id == args_name
        ):
            tgt = node.targets[0]
            elts = tgt.elts if isinstance(tgt, (ast.Tuple, ast.List)) else [tgt]
            input_names += [e.id for e in elts if isinstance(e, ast.Name)]
            i += 1
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and dotted_name(node.value.func) == f"{args_name}.clear"
        ):
            i += 1
        else:
            break
    rest = body[i:]
    if not rest or not isinstance(rest[-1], ast.Return):
        raise UnsupportedWrapper("`call` does not end with a return statement")
    region_nodes = rest[:-1]
    withs = [n for n in region_nodes if isinstance(n, ast.With)]
    if withs:
        # CUDA wrappers: `with torch.cuda._DeviceGuard(0):` holds the kernels.
        if len(withs) != 1 or len(region_nodes) != 1:
            raise UnsupportedWrapper("`call` mixes a `with` block with other statements")
        region_nodes = list(withs[0].body)
    if not region_nodes:
        raise UnsupportedWrapper("empty `call` body")
    lines = source.splitlines()
    line_owner: dict[int, ast.stmt] = {}
    for node in region_nodes:
        line_owner[node.end_lineno or node.lineno] = node
    region: list[Stmt] = []
    for k, node in enumerate(region_nodes):
        kind, defines, deletes, callee, alias_of = _classify(node)
        if kind is StmtKind.DEL:
            uses = list(deletes)
        elif isinstance(node, ast.If):  # one unit: every name it loads and does not bind
            uses = [n for n in names_in(node) if n not in defines]
        elif callee in QUERY_CALLEES:  # a size query
            uses = names_in(node.value)  # type: ignore[attr-defined]
        elif isinstance(node.value, ast.Call):  # type: ignore[attr-defined]
            uses = sorted(_arg_names(node.value))  # type: ignore[attr-defined]
        else:
            uses = names_in(node.value)  # type: ignore[attr-defined]
        comments, text = _stmt_text(lines, node, line_owner)
        region.append(
            Stmt(
                index=k,
                node=node,
                kind=kind,
                text=text,
                comments=comments,
                defines=defines,
                deletes=deletes,
                uses=uses,
                callee=callee,
                alias_of=alias_of,
                check_if=isinstance(node, ast.If) and _is_check_if(node),
            )
        )
    first = region_nodes[0]
    indent = lines[first.lineno - 1][: first.col_offset]
    first_line = first.lineno
    # Include the comment lines just above the first statement.
    while first_line > 1 and lines[first_line - 2].strip().startswith("#"):
        first_line -= 1
    defined: set[str] = set(input_names)
    for st in region:
        for n in st.defines:
            if n in defined:
                raise UnsupportedWrapper(f"name {n!r} is bound twice (not SSA)")
            defined.add(n)
    return Wrapper(
        source=source,
        tree=tree,
        call_node=call_node,
        in_runner=in_runner,
        region=region,
        region_indent=indent,
        region_first_line=first_line,
        region_last_line=region_nodes[-1].end_lineno or region_nodes[-1].lineno,
        input_names=input_names,
        kernels=kernel_sigs(tree),
    )


def _arg_names(call: ast.Call) -> set[str]:
    names: set[str] = set()
    for a in [*call.args, *(k.value for k in call.keywords)]:
        names.update(names_in(a))
    return names


def render_region(wrapper: Wrapper, order: list[int], probes: dict[int, str] | None = None) -> str:
    """Source of the wrapper with its region statements emitted in ``order``.

    Args:
        wrapper: The parsed wrapper.
        order: A permutation of region statement indices.
        probes: Optional extra lines (already formatted, unindented) emitted
            before the statement at each *position* of ``order``; the key
            ``len(order)`` places one after the last statement.

    Returns:
        The full module source.
    """
    lines = wrapper.source.splitlines()
    ind = wrapper.region_indent
    out: list[str] = []
    for pos, k in enumerate(order):
        if probes and pos in probes:
            out.append(ind + probes[pos])
        st = wrapper.region[k]
        out += [ind + c for c in st.comments]
        # Continuation lines of multi-line statements keep their own indentation.
        for j, line in enumerate(st.text.split("\n")):
            out.append(ind + line if j == 0 else line)
    if probes and len(order) in probes:
        out.append(ind + probes[len(order)])
    new_lines = lines[: wrapper.region_first_line - 1] + out + lines[wrapper.region_last_line :]
    return "\n".join(new_lines) + "\n"


def unbound_names(wrapper: Wrapper, scope: dict[str, object]) -> list[str]:
    """Names the region uses that neither the inputs, the region, ``scope`` nor builtins bind.

    In a wrapper loaded from its source alone these are the constants Inductor
    attaches to the module at load time.
    """
    import builtins

    bound = set(wrapper.input_names) | {n for st in wrapper.region for n in st.defines}
    out: list[str] = []
    for st in wrapper.region:
        for n in st.uses:
            if n not in bound and n not in scope and not hasattr(builtins, n) and n not in out:
                out.append(n)
    return out
