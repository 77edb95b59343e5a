"""What the backend's Inductor hooks need to know about the compile this thread runs.

Note [Hook state]
``CompiledFxGraph.post_compile`` is wrapped once per process (Note [Hooking
the pass into Inductor] in ``inductor_pass/runtime/backend.py``); the wrapper
acts only for a compile the backend runs. Each backend call owns one
:class:`HookState` and makes it this thread's current state for the duration
(:func:`active`, a ``contextvars.ContextVar``); the inner compile it starts
receives the same object as an argument (and nothing else from the backend)
and makes it current again (a backward graph is compiled lazily, after the
backend call has returned). The pass's options travel in it too
(``HookState.config``), by no other route. The hook reads it with
:func:`current`. Nothing else is shared between the hooks and the backend.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inductor_pass.config import PassConfig
from inductor_pass.variants.choose import Program
from inductor_pass.variants.kernels import DeferredWait

__all__ = ["HookState", "active", "collecting", "current", "detach"]


@dataclass(kw_only=True, slots=True)
class HookState:
    """One backend call's state, read by the ``post_compile`` hook (Note [Hook state])."""

    config: PassConfig | None
    """The pass's options; None: finished graphs are not armed."""
    sink: list[Program | Exception] | None = None
    """When a list, finished programs are collected here instead of armed (a variant's
    compile, or a benchmark's, see :func:`collecting`)."""
    deferred: list[DeferredWait] = field(default_factory=list)
    """Kernel waits of variant modules, done at the default program's ``post_compile``
    (Note [Deferred variant kernels] in ``inductor_pass/variants/kernels.py``)."""
    failed_variants: dict[int, str] = field(default_factory=dict)
    """``id(variant module globals)`` -> why its kernels failed to build."""
    cpp_twin: Any = None
    """During a ``cpp_wrapper`` graph's default compile: its Python twin (a ``CppTwin``), or
    why there is none (Note [C++ wrapper] in ``inductor_pass/runtime/cpp_wrapper.py``,
    which imports this module)."""
    armed: list[Any] = field(default_factory=list)
    """The passes the hook armed (``FirstCallPass``, ``SizeDispatch``, ``CppWrapperPass``), in order (the inner compile gives the default
    program's its variants, then removes those it armed; the backend call empties
    it when it returns)."""


_CURRENT: contextvars.ContextVar[HookState | None] = contextvars.ContextVar(
    "torch_replay_hook_state", default=None
)


def current() -> HookState | None:
    """This thread's backend call's state, or None outside one."""
    return _CURRENT.get()


def detach() -> None:
    """No backend call is current in this thread from now on (a forked child's first step)."""
    _CURRENT.set(None)


@contextlib.contextmanager
def active(state: HookState | None) -> Iterator[HookState | None]:
    """Make ``state`` the current one in the block (None: no backend call is current)."""
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def collecting() -> Iterator[list[Program | Exception]]:
    """Programs Inductor finishes in this thread in the block are collected, not armed.

    Yields:
        The list they are appended to (an ``Exception`` for one whose module
        could not be read).
    """
    state = current()
    if state is None:
        state = HookState(config=None)
        with active(state):
            state.sink = []
            yield state.sink
        return
    previous, state.sink = state.sink, []
    try:
        yield state.sink
    finally:
        state.sink = previous
