"""Naming what a ReplayError is about, in words the user can act on (Note [Naming in
errors]): the tensor (module path and buffer name, a captured variable, an argument) and
the spelling of torch_replay's options that the checkpointed function lets through.

Note [Naming in errors]
The C++ Transaction knows a storage by its key only, so its messages say "a tensor the
segment read" and carry the key (``exc.storage_key``). Python names it, on the error
path only (nothing here runs for a segment that succeeds):

* the objects the checkpointed function holds are searched for it: the function itself
  if it is an ``nn.Module``, a bound method's ``__self__``, a ``functools.partial``'s
  ``func``, ``args`` and ``keywords`` (Hugging Face's ``GradientCheckpointingLayer`` in
  transformers' ``modeling_layers.py`` checkpoints ``partial(forward, self, **kwargs)``),
  a function's closure cells, defaults and the module globals its code names, and what
  ``functools.wraps`` left in ``__wrapped__``; then the segment's arguments;
* a module found under a variable name (a closure cell, a global, a keyword of the
  partial) is named from that variable (``model.layers.0.mlp.gate.bias``), an expression
  that works in the user's code; an anonymous one (a bound method's ``__self__``) is
  named from the outermost module that holds it, found by one walk over the garbage
  collector's objects (``model.layers.0.mlp.gate.bias (buffer of DeepseekV3ForCausalLM)``);
* the messages spell torch_replay's options ``state=`` / ``engine=``; where the function
  would be handed those keywords (it has a parameter of that name, or takes ``**kwargs``:
  Note [Option spelling] in _replay/api.py) they are rewritten to ``replay_state=`` /
  ``replay_engine=``, the spelling that works there.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import re
import weakref
from typing import Any

import torch

from .._ext import require_extension
from ..errors import ReplayError

_DEPTH = 4  # how deep the objects a function holds are followed
_WIDTH = 64  # how many items of a list, tuple or dict held by a function are looked at


# --------------------------------------------------------------- what it holds


def module_of(function) -> torch.nn.Module | None:
    """The module ``function`` is, or is a bound method of (None otherwise)."""
    if isinstance(function, torch.nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


_KINDS = (torch.nn.Module, torch.Tensor)


def held_objects(function, kinds: tuple = _KINDS) -> list[tuple[str | None, Any]]:
    """``(variable name or None, object)`` for every object of ``kinds`` (modules and
    tensors by default) that ``function`` holds, the most direct first (Note [Naming in
    errors])."""
    out: list[tuple[str | None, Any]] = []
    # What was found so far, if an object's attributes cannot be read (a proxy that
    # raises): naming helps, it must never fail the call.
    with contextlib.suppress(Exception):
        _walk(function, None, 0, out, set(), kinds)
    return out


def _walk(obj, label, depth, out, seen, kinds) -> None:
    if depth > _DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, kinds):
        out.append((label, obj))
        return
    if isinstance(obj, functools.partial):
        _walk(obj.func, None, depth + 1, out, seen, kinds)
        for a in obj.args:
            _walk(a, None, depth + 1, out, seen, kinds)
        for k, v in obj.keywords.items():
            _walk(v, k, depth + 1, out, seen, kinds)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:_WIDTH]):
            _walk(v, f"{label}[{i}]" if label else None, depth + 1, out, seen, kinds)
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items())[:_WIDTH]:
            _walk(v, f"{label}[{k!r}]" if label else None, depth + 1, out, seen, kinds)
        return
    owner = getattr(obj, "__self__", None)
    if owner is not None and callable(obj):
        _walk(owner, None, depth + 1, out, seen, kinds)
        obj = getattr(obj, "__func__", obj)
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None:
        _walk(wrapped, None, depth + 1, out, seen, kinds)
    code = getattr(obj, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, getattr(obj, "__closure__", None) or (), strict=False):
        try:
            _walk(cell.cell_contents, name, depth + 1, out, seen, kinds)
        except ValueError:  # an empty cell
            pass
    defaults = getattr(obj, "__defaults__", None) or ()
    positional = code.co_varnames[: code.co_argcount]
    for name, v in zip(positional[len(positional) - len(defaults) :], defaults, strict=True):
        _walk(v, name, depth + 1, out, seen, kinds)
    for name, v in (getattr(obj, "__kwdefaults__", None) or {}).items():
        _walk(v, name, depth + 1, out, seen, kinds)
    module_globals = getattr(obj, "__globals__", None) or {}
    for name in code.co_names:
        v = module_globals.get(name)
        if isinstance(v, kinds) and id(v) not in seen:
            seen.add(id(v))
            out.append((name, v))


def root_module(function) -> torch.nn.Module | None:
    """The first module ``function`` holds (itself, its ``__self__``, a partial's or a
    closure's), the root that declared state is named from."""
    root = module_of(function)
    if root is not None:
        return root
    return next((m for _, m in held_objects(function) if isinstance(m, torch.nn.Module)), None)


# ---------------------------------------------------------------------- names


def tensor_name(t: torch.Tensor, root: torch.nn.Module | None) -> str | None:
    """``path (buffer)`` / ``path (parameter)`` of ``t`` under ``root``, or None."""
    if root is None:
        return None
    for n, b in root.named_buffers():
        if b is t:
            return f"{n} (buffer)"
    for n, p in root.named_parameters():
        if p is t:
            return f"{n} (parameter)"
    return None


def _outermost(module: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    """The module path of ``module`` under the outermost module that holds it, and
    that module: one walk over the garbage collector's objects (the error path only)."""
    parents: dict[int, tuple[torch.nn.Module, str]] = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.nn.Module):
            for n, child in vars(o).get("_modules", {}).items():
                if child is not None:
                    parents.setdefault(id(child), (o, n))
    path: list[str] = []
    seen = {id(module)}
    while id(module) in parents:
        parent, n = parents[id(module)]
        if id(parent) in seen:
            break
        seen.add(id(parent))
        path.append(n)
        module = parent
    return ".".join(reversed(path)), module


def _in_module(key: int, label: str | None, root: torch.nn.Module) -> str | None:
    C = require_extension()
    found = None
    for n, b in root.named_buffers():
        if b is not None and b.layout == torch.strided and C.storage_key(b) == key:
            found = (n, "buffer")
            break
    else:
        for n, p in root.named_parameters():
            if p.layout == torch.strided and C.storage_key(p) == key:
                found = (n, "parameter")
                break
    if found is None:
        return None
    n, kind = found
    if label is not None:
        return f"{label}.{n} ({kind})"
    path, top = _outermost(root)
    return f"{path + '.' if path else ''}{n} ({kind} of {type(top).__name__})"


def _name_for_key(key: int, function, args, kwargs=None) -> str | None:
    """Where the storage ``key`` is found from ``function`` and its arguments
    (Note [Naming in errors]), or None."""
    C = require_extension()

    def same(t) -> bool:
        return isinstance(t, torch.Tensor) and t.layout == torch.strided and C.storage_key(t) == key

    held = held_objects(function)
    for label, obj in held:
        if isinstance(obj, torch.nn.Module):
            name = _in_module(key, label, obj)
            if name is not None:
                return name
    for label, obj in held:
        if same(obj):
            return f"{label} (a tensor the checkpointed function holds)" if label else None
    for i, a in enumerate(args):
        if same(a):
            return f"argument {i} of the segment"
    for k, v in (kwargs or {}).items():
        if same(v):
            return f"keyword argument {k!r} of the segment"
    return None


# -------------------------------------------------------------------- spelling


# A plain function -> (what its signature was read from, {name: answer}); weak in the
# function, so a function that goes away takes its entry with it.
_keyword_answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature_inputs(f, bound: bool) -> tuple:
    """What ``inspect.signature`` reads of the plain function ``f`` beside ``f``
    itself (and whether it was reached through a bound method, which drops the first
    parameter): an answer cached for ``f`` holds while these are the same objects."""
    return (
        bound,
        getattr(f, "__code__", None),
        getattr(f, "__signature__", None),
        getattr(f, "__wrapped__", None),
    )


def accepts_keyword(function, name: str) -> bool | None:
    """True if ``function`` has a parameter ``name`` that can be passed by
    keyword, False if it certainly does not, None if it cannot tell.

    Asked at every call of a segment given ``state=`` or ``engine=``. For a plain
    function (a module's ``forward``, a bound method's function) the answer is kept
    while what its signature is read from stays the same objects, so the signature is
    read once per function instead of twice per segment; anything else is read every
    time."""
    target = function.forward if isinstance(function, torch.nn.Module) else function
    f = getattr(target, "__func__", target)
    if not inspect.isfunction(f):
        return _read_keyword(target, name)
    inputs = _signature_inputs(f, f is not target)
    entry = _keyword_answers.get(f)
    if entry is None or any(a is not b for a, b in zip(entry[0], inputs, strict=True)):
        entry = (inputs, {})
        _keyword_answers[f] = entry
    answers = entry[1]
    if name not in answers:
        answers[name] = _read_keyword(target, name)
    return answers[name]


def _read_keyword(target, name: str) -> bool | None:
    """``accepts_keyword`` read from ``target``'s signature."""
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    var_keyword = False
    for p in sig.parameters.values():
        if p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return True
        var_keyword |= p.kind == p.VAR_KEYWORD
    return None if var_keyword else False


_OPTION_WORD = re.compile(r"(?<![\w.'\"])(state|engine)=")


def _respell(message: str, function) -> str:
    """``message`` with ``state=`` / ``engine=`` spelled as the checkpointed function
    lets them through (Note [Option spelling] in _replay/api.py)."""

    def spelled(m: re.Match) -> str:
        word = m.group(1)
        return f"replay_{word}=" if accepts_keyword(function, word) is not False else m.group(0)

    return _OPTION_WORD.sub(spelled, message)


def _enrich(exc: ReplayError, function, args, kwargs=None) -> ReplayError:
    """``exc`` with the tensor it is about named and the options spelled as ``function``
    takes them; ``exc`` itself if nothing changes."""
    message = str(exc)
    key = getattr(exc, "storage_key", 0)
    try:
        name = _name_for_key(key, function, args, kwargs) if key else None
        if name is not None and name not in message:
            message = f"{message} [tensor: {name}]"
        message = _respell(message, function)
    except Exception:  # noqa: BLE001  (naming must never replace the error it names)
        return exc
    if message == str(exc):
        return exc
    new = type(exc)(message)
    new.__dict__.update(exc.__dict__)
    return new


class named_errors:  # noqa: N801  (used as a function-style context manager)
    """Names the tensor a ReplayError raised inside the block is about, and spells the
    options as the function takes them (Note [Naming in errors]). A class, not a
    generator: it is entered on every saved-tensor unpack, where contextlib's generator
    costs several microseconds."""

    __slots__ = ("function", "args", "kwargs")

    def __init__(self, function, args, kwargs=None) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and isinstance(exc, ReplayError):
            new = _enrich(exc, self.function, self.args, self.kwargs)
            if new is not exc:
                raise new from None
        return False
