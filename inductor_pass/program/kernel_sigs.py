"""Declared effects of the kernels an Inductor wrapper module defines, read from its source.

The argument types of ``async_compile.cpp_pybinding([...], src)`` (``const T*`` is
read-only, and so is every argument but an ``out_ptr``) and the argument names and
``mutated_arg_names`` of ``async_compile.triton(...)``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

__all__ = ["KernelSig", "dotted_name", "kernel_sigs", "names_in"]


@dataclass(kw_only=True, slots=True)
class KernelSig:
    """Declared effects of a generated kernel: which positional arguments it writes."""

    kind: str
    """``"cpp"`` or ``"triton"``."""
    writes: list[bool]
    """For each positional argument, whether the kernel may write it."""
    arg_names: list[str] = field(default_factory=list)
    """Parameter names when known (``in_ptr0``, ``out_ptr1``, ``in_out_ptr0`` ...)."""


def dotted_name(node: ast.expr) -> str | None:
    """``"a.b.c"`` for a ``Name``/``Attribute`` chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def names_in(node: ast.AST) -> list[str]:
    """The names ``node`` loads, in first-seen order, once each."""
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in out:
            out.append(n.id)
    return out


_CPP_PARAM = re.compile(r"(const\s+)?[\w:<>]+\s*\*\s*(__restrict__\s+)?(\w+)")


def _cpp_sig(argtypes: list[str], src: str) -> KernelSig:
    names: list[str] = []
    m = re.search(r'extern\s+"C"[^(]*\bkernel\s*\(([^)]*)\)', src)
    if m:
        for p in m.group(1).split(","):
            pm = _CPP_PARAM.search(p)
            names.append(pm.group(3) if pm else p.strip().split()[-1] if p.strip() else "")
    writes = []
    for i, t in enumerate(argtypes):
        name = names[i] if i < len(names) else ""
        is_ptr = "*" in t
        is_const = t.strip().startswith("const")
        writes.append(bool(is_ptr and (not is_const or "out_ptr" in name)))
    return KernelSig(kind="cpp", writes=writes, arg_names=names)


def _triton_sig(kernel_name: str, src: str) -> KernelSig | None:
    m = re.search(r"def\s+" + re.escape(kernel_name) + r"\s*\(([^)]*)\)", src)
    if m is None:
        m = re.search(r"def\s+\w+\s*\(([^)]*)\)", src)
    if m is None:
        return None
    names = [a.strip().split(":")[0].split("=")[0].strip() for a in m.group(1).split(",")]
    names = [n for n in names if n]
    mutated: set[str] = set()
    mm = re.search(r"['\"]mutated_arg_names['\"]\s*:\s*\[([^\]]*)\]", src)
    if mm:
        mutated = {s.strip().strip("'\"") for s in mm.group(1).split(",") if s.strip()}
    writes = [n in mutated or n.startswith(("out_ptr", "in_out_ptr")) for n in names]
    return KernelSig(kind="triton", writes=writes, arg_names=names)


def kernel_sigs(tree: ast.Module) -> dict[str, KernelSig]:
    """Name -> signature of each kernel a wrapper module defines at its top level."""
    sigs: dict[str, KernelSig] = {}
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
            continue
        func = dotted_name(node.value.func)
        if func not in ("async_compile.cpp_pybinding", "async_compile.triton"):
            continue
        args = node.value.args
        try:  # (argument types, source) for C++; (kernel name, source) for Triton
            first, src = ast.literal_eval(args[0]), ast.literal_eval(args[1])
        except (IndexError, ValueError):
            continue
        if func == "async_compile.cpp_pybinding":
            sig = _cpp_sig(list(first), str(src))
        else:
            sig = _triton_sig(str(first), str(src))
        if sig is not None:
            sigs[node.targets[0].id] = sig
    return sigs
