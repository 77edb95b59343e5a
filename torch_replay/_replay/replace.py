"""``tr.replace_torch_checkpoint()``: code that calls ``torch.utils.checkpoint`` itself
(timm, diffusers, older transformers, a training loop) runs ``tr.checkpoint`` instead,
for one block of code.

Note [Replacing torch's checkpoint]
A library reaches torch's checkpoint in one of two ways: through the module attribute at
call time (``torch.utils.checkpoint.checkpoint(...)``: timm 1.0's ``checkpoint_seq`` and
``checkpoint``) or through a name it bound at import (``from torch.utils.checkpoint import
checkpoint``: older transformers, diffusers, torch's own ``checkpoint_wrapper``). So the
block replaces every module-level name that *is* torch's ``checkpoint`` or
``checkpoint_sequential`` (found by identity in ``sys.modules``, as
``scripts/torch_checkpoint_tests.py`` checks them), the attributes of
``torch.utils.checkpoint`` among them, by two replacement functions of this module, and
puts every one of them back at the end. Names inside ``torch_replay`` are left alone
(``compiled.py`` hands a segment to torch's own function under ``torch.compile``).

What the replacements do is decided per call, not by the patch:

* The options of the innermost active block of the *calling context* (a
  ``contextvars.ContextVar``, so per thread and per asyncio task) apply: the call becomes
  ``tr.checkpoint(function, *args, replay_state=..., replay_engine=..., **kwargs)``, with
  the caller's own ``replay_state=`` / ``replay_engine=`` winning. torch_replay's options
  are always passed with their spelled names, so a ``state=`` or ``engine=`` the library
  passes goes to its function, as torch would pass it (Note [Option spelling] in api.py).
* A context with no active block calls the function that was replaced (torch's). So
  another thread that checkpoints while one thread is inside a block gets torch's
  checkpoint, exactly as before, and a name a module bound *during* a block (imported
  then) keeps working after it, until the end of the last block rebinds it.

The patch itself is process-wide and counted: the first block to enter (in any thread)
installs it, the last to leave removes it, under one lock; names are put back only where
they still hold a replacement (something that rebound a name meanwhile keeps its own
value), and modules imported during the blocks are searched for replacements too. After
the last block, every name is again the very object it was (``is``). Nested blocks only
push their options: an inner block's options win inside it.

``state="module"`` (the default) declares what the checkpointed function runs, where
that can be told from the function (:func:`owners_of`): the module itself, the module of
a bound method, a ``functools.partial``'s, the ``functions[start:end + 1]`` of the
``run_function(start, end, functions)`` closure that torch's ``checkpoint_sequential`` and
timm's ``checkpoint_seq`` build, else every module the function holds (closure cells,
defaults, the globals its code names). Where no module is found, nothing is declared:
``tr.checkpoint``'s detection then refuses, by name, a state change it cannot undo, rather
than giving a wrong gradient.

A segment run inside a block and differentiated after it works: its re-run is
``tr.checkpoint``'s own and reads no module attribute. A checkpoint *nested* inside such a
segment is looked up again when the segment is re-run; after the block that is torch's,
so keep the backward of nested checkpoints inside the block.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint as _tcp

from .._ext import require_extension
from .config import ENGINES
from .drop_in import DROP_IN, Checkpointed
from .naming import held_objects, module_of
from .segment import USE_REENTRANT_WARNING

__all__ = [
    "Options",
    "activated",
    "active_frames",
    "owners_of",
    "replace_torch_checkpoint",
    "torch_checkpoint",
]

# torch's functions, as they were when torch_replay was imported.
torch_checkpoint = _tcp.checkpoint
torch_checkpoint_sequential = _tcp.checkpoint_sequential


# ----------------------------------------------------------------- the options


@dataclasses.dataclass(frozen=True)
class Options:
    """What a block asks: ``state`` (``"module"``, ``None`` or a list) and ``engine``."""

    state: Any
    engine: str

    @classmethod
    def checked(cls, state: Any, engine: str, where: str, spelled: str = "state") -> Options:
        """The options, or ``TypeError`` / ``ValueError`` naming the bad one."""
        if isinstance(state, str):
            if state != "module":
                raise ValueError(
                    f"{where}: {spelled}= must be 'module' (declare the modules each "
                    "checkpointed function runs), None (declare nothing) or a list of "
                    f"tensors, modules and generators; got {state!r}"
                )
        elif state is not None:
            if isinstance(state, (torch.Tensor, torch.nn.Module, torch.Generator)):
                state = [state]
            if not isinstance(state, Iterable):
                raise TypeError(
                    f"{where}: {spelled}= must be 'module', None or a list of tensors, "
                    f"modules and generators; got {type(state).__name__}"
                )
            state = list(state)
            for item in state:
                if not isinstance(item, (torch.Tensor, torch.nn.Module, torch.Generator)):
                    raise TypeError(
                        f"{where}: {spelled}= lists tensors, nn.Modules and "
                        f"torch.Generators; got a {type(item).__name__}"
                    )
        if not ENGINES:
            require_extension()  # says why the extension is unavailable
        if engine not in ENGINES:
            name = "replay_engine" if spelled == "replay_state" else "engine"
            raise ValueError(f"{where}: {name}= must be one of {ENGINES}, got {engine!r}")
        return cls(state, engine)

    def state_for(self, function: Any) -> Any:
        """The ``replay_state=`` of one call of ``function``."""
        if self.state == "module":
            return owners_of(function) or None
        return self.state

    def sequential_state(self, functions: Any) -> Any:
        """The ``replay_state=`` of one ``checkpoint_sequential(functions, ...)``."""
        if self.state != "module":
            return self.state
        if isinstance(functions, torch.nn.Module):
            return [functions]
        found = [f for f in functions if isinstance(f, torch.nn.Module)]
        return _outermost(found) or None


def owners_of(function: Any) -> list[torch.nn.Module]:
    """The modules a checkpointed ``function`` runs, as far as the function tells
    (Note [Replacing torch's checkpoint]); outermost only, each once."""
    own = module_of(function)
    if own is not None:
        return [own]
    if isinstance(function, functools.partial):
        own = module_of(function.func)
        if own is not None:
            return [own]
    cells = _cells(function)
    start, end, functions = cells.get("start"), cells.get("end"), cells.get("functions")
    if isinstance(start, int) and isinstance(end, int) and isinstance(functions, Sequence):
        # run_function(start, end, functions): torch's checkpoint_sequential, timm's
        # checkpoint_seq; the segment runs functions[start], ..., functions[end].
        chunk = [f for f in functions[start : end + 1] if isinstance(f, torch.nn.Module)]
        return _outermost(chunk)
    found = [m for _, m in held_objects(function, (torch.nn.Module,))]
    return _outermost(found)


def _cells(function: Any) -> dict[str, Any]:
    code = getattr(function, "__code__", None)
    closure = getattr(function, "__closure__", None)
    if code is None or not closure:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, closure, strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            out[name] = cell.cell_contents
    return out


def _outermost(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """``modules`` without repeats and without those inside another of them."""
    unique = list({id(m): m for m in modules}.values())
    inner = set()
    for m in unique:
        for sub in m.modules():
            if sub is not m:
                inner.add(id(sub))
    return [m for m in unique if id(m) not in inner]


# ------------------------------------------------------- the active blocks


class _Frame:
    """One active block in a context: its options and how many checkpoint calls it saw."""

    __slots__ = ("calls", "options")

    def __init__(self, options: Options):
        self.options = options
        self.calls = 0


_ACTIVE: contextvars.ContextVar[tuple[_Frame, ...]] = contextvars.ContextVar(
    "torch_replay_replace_torch_checkpoint", default=()
)


def active_frames() -> tuple[_Frame, ...]:
    """The active blocks of the calling context, outermost first."""
    return _ACTIVE.get()


def _top() -> _Frame | None:
    frames = _ACTIVE.get()
    if not frames:
        return None
    for frame in frames:
        frame.calls += 1
    return frames[-1]


# ---------------------------------------------------------- the replacements


def checkpoint(function: Callable | None = None, *args: Any, **kwargs: Any) -> Any:
    """torch's ``checkpoint`` while a :func:`replace_torch_checkpoint` block is active:
    ``tr.checkpoint`` with the block's options; torch's own function in any other
    context (Note [Replacing torch's checkpoint])."""
    frame = _top()
    if frame is None:
        return torch_checkpoint(function, *args, **kwargs)
    from .api import checkpoint as tr_checkpoint

    if function is None and not args:
        # checkpoint(**options) -> a decorator (torch 2.14): checked by tr.checkpoint,
        # and its calls come back here.
        decorator = tr_checkpoint(**kwargs)
        return functools.partial(Checkpointed, checkpoint, options=decorator.keywords["options"])
    if kwargs.get("use_reentrant") is None and not torch.compiler.is_compiling():
        warnings.warn(USE_REENTRANT_WARNING, stacklevel=2)  # at the library's call
        kwargs["use_reentrant"] = True
    if "replay_state" not in kwargs:
        kwargs["replay_state"] = frame.options.state_for(function)
    kwargs.setdefault("replay_engine", frame.options.engine)
    return tr_checkpoint(function, *args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """torch's ``checkpoint_sequential`` while a block is active: ``tr.checkpoint_sequential``
    with the block's options; torch's own function in any other context."""
    frame = _top()
    if frame is None:
        return torch_checkpoint_sequential(
            functions, segments, input, use_reentrant=use_reentrant, **kwargs
        )
    from .api import checkpoint_sequential as tr_sequential

    if "replay_state" not in kwargs and "state" not in kwargs:
        kwargs["replay_state"] = frame.options.sequential_state(functions)
    if "replay_engine" not in kwargs and "engine" not in kwargs:
        kwargs["replay_engine"] = frame.options.engine
    return tr_sequential(functions, segments, input, use_reentrant=use_reentrant, **kwargs)


checkpoint.__signature__ = DROP_IN.signature  # type: ignore[attr-defined]
checkpoint_sequential.__signature__ = inspect.signature(torch_checkpoint_sequential)  # type: ignore[attr-defined]

_REPLACEMENT = {
    id(torch_checkpoint): checkpoint,
    id(torch_checkpoint_sequential): checkpoint_sequential,
}
_ORIGINAL = {
    id(checkpoint): torch_checkpoint,
    id(checkpoint_sequential): torch_checkpoint_sequential,
}


# ---------------------------------------------------------------- the patch


class _Patch:
    """The process-wide patch: installed by the first block to enter, removed by the last
    to leave (Note [Replacing torch's checkpoint])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.records: list[tuple[dict[str, Any], str]] = []
        self.modules_before: set[str] = set()

    def enter(self, scope: tuple[str, ...] | None) -> None:
        with self.lock:
            if self.users == 0:
                self.records = []
                self.modules_before = set(sys.modules)
            self.users += 1
            try:
                for namespace in _namespaces(scope):
                    for name, value in list(namespace.items()):
                        replacement = _REPLACEMENT.get(id(value))
                        if replacement is not None and _ORIGINAL[id(replacement)] is value:
                            namespace[name] = replacement
                            self.records.append((namespace, name))
            except BaseException:
                self._leave()
                raise

    def leave(self) -> None:
        with self.lock:
            self._leave()

    def _leave(self) -> None:
        self.users -= 1
        if self.users:
            return
        for namespace, name in self.records:
            original = _ORIGINAL.get(id(namespace.get(name)))
            if original is not None:
                namespace[name] = original
        self.records = []
        # Names bound to a replacement by modules imported during the blocks.
        new = [sys.modules[n] for n in set(sys.modules) - self.modules_before if n in sys.modules]
        for namespace in _module_dicts(new):
            for name, value in list(namespace.items()):
                original = _ORIGINAL.get(id(value))
                if original is not None and value is _REPLACEMENT[id(original)]:
                    namespace[name] = original

    def installed(self) -> bool:
        return self.users > 0


_PATCH = _Patch()


def _in_scope(name: str, scope: tuple[str, ...] | None) -> bool:
    if name == "torch_replay" or name.startswith("torch_replay."):
        return False  # ours (compiled.py keeps torch's function on purpose)
    if scope is None or name == _tcp.__name__:
        return True
    return any(name == s or name.startswith(s + ".") for s in scope)


def _namespaces(scope: tuple[str, ...] | None) -> list[dict[str, Any]]:
    mods = [m for n, m in list(sys.modules.items()) if _in_scope(n, scope)]
    return _module_dicts(mods)


def _module_dicts(mods: list[Any]) -> list[dict[str, Any]]:
    out = []
    for m in mods:
        if isinstance(m, types.ModuleType) and not m.__name__.startswith("torch_replay"):
            namespace = getattr(m, "__dict__", None)
            if isinstance(namespace, dict):
                out.append(namespace)
    return out


@contextlib.contextmanager
def activated(options: Options, scope: tuple[str, ...] | None = None):
    """The block itself: ``options`` pushed for this context, the patch held over
    ``scope`` (module-name prefixes; None: every module). Yields the block's frame."""
    frame = _Frame(options)
    _PATCH.enter(scope)
    token = _ACTIVE.set((*_ACTIVE.get(), frame))
    try:
        yield frame
    finally:
        _ACTIVE.reset(token)
        _PATCH.leave()


# ---------------------------------------------------------------- public API


class replace_torch_checkpoint(contextlib.ContextDecorator):  # noqa: N801 (a function to users)
    """Inside this block (a ``with`` statement, or a decorated function), code that calls
    ``torch.utils.checkpoint.checkpoint`` or ``checkpoint_sequential`` runs
    :func:`torch_replay.checkpoint` / :func:`torch_replay.checkpoint_sequential`
    instead, with the guarantees of those: the re-run sees the state the forward saw.

    For libraries that call torch's checkpoint themselves (timm, diffusers, older
    transformers): ``with tr.replace_torch_checkpoint(): loss = model(x)``. Both the
    attributes of ``torch.utils.checkpoint`` and every name a module bound with ``from
    torch.utils.checkpoint import checkpoint`` are replaced, and put back when the block
    ends, also on an exception (Note [Replacing torch's checkpoint] in
    ``torch_replay/_replay/replace.py``).

    Scope and threads: the options apply to the calling context only (this thread, or
    this asyncio task); another thread that checkpoints meanwhile gets torch's function.
    Blocks nest (the innermost options apply) and may be entered from several threads;
    the names are torch's again (the same objects) once the last block has ended. A
    segment forwarded inside the block may be differentiated after it; a checkpoint
    nested inside a segment is looked up again at its re-run, so differentiate nested
    checkpoints inside the block. Only module-level names are replaced (not a
    checkpoint function a library stored on a class or an object).

    Args:
        state: ``"module"`` (default: each call declares the modules its function runs:
            a module, a module's bound method, a ``functools.partial`` of one, the chunk
            of a ``checkpoint_sequential`` / timm ``checkpoint_seq`` closure, else the
            modules the function holds; nothing where none is found, so an undeclared
            change is refused by name), ``None`` (declare nothing) or a list of tensors,
            modules and generators declared for every call. A call that passes
            ``replay_state=`` itself keeps it.
        engine: the preservation engine of every call (``engine=`` of
            :func:`torch_replay.checkpoint`, default ``"auto"``).

    Raises:
        TypeError: a positional argument (write ``@tr.replace_torch_checkpoint()``), or
            a ``state`` that is not a list of tensors, modules and generators.
        ValueError: another string for ``state``, or an unknown ``engine``.
    """

    def __init__(self, *args: Any, state: Any = "module", engine: str = "auto") -> None:
        if args:
            raise TypeError(
                "torch_replay.replace_torch_checkpoint takes keyword arguments only "
                "(state=, engine=); as a decorator write @tr.replace_torch_checkpoint()"
            )
        self.options = Options.checked(state, engine, "torch_replay.replace_torch_checkpoint")
        self._blocks: list[contextlib.AbstractContextManager] = []

    def _recreate_cm(self) -> replace_torch_checkpoint:
        # A decorated function may run in several threads at once: one block per call.
        fresh = object.__new__(type(self))
        fresh.options = self.options
        fresh._blocks = []
        return fresh

    def __enter__(self) -> replace_torch_checkpoint:
        block = activated(self.options)
        block.__enter__()
        self._blocks.append(block)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._blocks.pop().__exit__(*exc)
        return False

    def __repr__(self) -> str:
        state = self.options.state
        shown = repr(state) if state is None or isinstance(state, str) else f"[{len(state)} items]"
        return f"replace_torch_checkpoint(state={shown}, engine={self.options.engine!r})"
