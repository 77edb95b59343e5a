"""A variant's C++ kernels: built lazily, and waited for after the default program's codegen.

Two hooks on Inductor's ``AsyncCompile`` (each installed once per process,
:func:`wrap_once`) change how the kernels of a *variant* program's module are
built; every other module, and every other thread, builds and waits as
Inductor does. Both are switched on per thread with context managers
(:func:`lazy_kernels`, :func:`deferring_waits`), whose state is a
``contextvars.ContextVar`` owned by this module.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeferredWait",
    "LazyKernel",
    "deferring_waits",
    "force_kernels",
    "lazy_kernels",
    "resolve_deferred",
    "wrap_once",
]

_WRAP_LOCK = threading.Lock()


def wrap_once(owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
    """Replace ``owner.name`` by ``make(original)`` once per process; False if absent."""
    with _WRAP_LOCK:
        current = owner.__dict__.get(name)
        if current is None:
            return False
        if getattr(current, "_torch_replay_hook", False):
            return True
        wrapper = functools.wraps(current)(make(current))
        wrapper._torch_replay_hook = True
        setattr(owner, name, wrapper)
        return True


@dataclass(frozen=True, slots=True)
class DeferredWait:
    """One ``AsyncCompile.wait(scope)`` a variant's module load did not do yet."""

    wait: Callable[[Any, dict[str, Any]], None]
    owner: Any
    scope: dict[str, Any]


_DEFER: contextvars.ContextVar[list[DeferredWait] | None] = contextvars.ContextVar(
    "torch_replay_defer", default=None
)
_LAZY: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "torch_replay_lazy", default=None
)


def _install_wait_hook() -> bool:
    """Wrap ``AsyncCompile.wait`` once per process (probed); False if absent.

    Note [Deferred variant kernels]
    A variant's wrapper module submits its C++ kernels to Inductor's compile
    workers when it loads and then waits for all of them. Waiting there keeps
    the workers' compiles from overlapping the default program's lowering and
    code generation, which come next in this thread. So while a variant loads
    (inside :func:`deferring_waits`, for this thread only) the wait is
    recorded instead of done; :func:`resolve_deferred` does it, with
    Inductor's own ``wait``, as soon as the default program's module is loaded
    (at its ``post_compile``, before anything can call either program) and at
    the latest when the inner compile returns or fails. A variant whose
    kernels fail to build is dropped with a note. Other threads, and every
    compile outside a variant's, wait as Inductor does.
    """
    try:
        from torch._inductor.async_compile import AsyncCompile
    except Exception:
        return False

    def make(original: Any) -> Any:
        def wait(self: Any, scope: dict[str, Any]) -> None:
            deferred = _DEFER.get()
            if deferred is not None:
                deferred.append(DeferredWait(wait=original, owner=self, scope=scope))
                return None
            return original(self, scope)

        return wait

    return wrap_once(AsyncCompile, "wait", make)


@contextlib.contextmanager
def deferring_waits(into: list[DeferredWait]) -> Iterator[None]:
    """Kernel waits of modules this thread loads in the block go to ``into``.

    Note [Deferred variant kernels]; where the hook cannot be installed, the
    waits are done as Inductor does them and ``into`` stays empty.
    """
    if not _install_wait_hook():
        yield
        return
    token = _DEFER.set(into)
    try:
        yield
    finally:
        _DEFER.reset(token)


def resolve_deferred(pending: list[DeferredWait]) -> dict[int, str]:
    """Do (and empty) the waits deferred by Note [Deferred variant kernels]; never raises.

    Returns:
        ``{id(module globals): error}`` for each variant module whose kernels failed.
    """
    todo, pending[:] = list(pending), []
    failed: dict[int, str] = {}
    for d in todo:
        try:
            d.wait(d.owner, d.scope)
        except Exception as exc:
            failed[id(d.scope)] = f"{type(exc).__name__}: {exc}"
    return failed


def _install_lazy_hook() -> bool:
    """Wrap ``AsyncCompile.cpp_pybinding`` once per process (probed); False if absent.

    Note [Lazy variant kernels]
    A variant's C++ kernels are most of its cost at a cold compile (about one
    second of CPU per kernel body the default program does not share,
    measured in ``benchmarks/results/compile_tv.md``), and most variants are
    never deployed. So while a variant's module loads (inside
    :func:`lazy_kernels`, for this thread only: the variant's compile, the
    forked variant's load, a cached variant's load) each ``cpp_pybinding``
    kernel becomes a :class:`LazyKernel`: not submitted to the compile workers
    until :func:`force_kernels` asks for it, at the first call, once Note
    [Variant bound] has not ruled the variant out. A lazy kernel that is
    called before that (the module is Inductor's, shared through its code
    cache) builds itself first, so a caller never sees the difference.
    Kernels are built under the Inductor configuration of the variant's
    compile, as Inductor would have built them then.
    """
    try:
        from torch._inductor.async_compile import AsyncCompile
    except Exception:
        return False

    def make(original: Any) -> Any:
        def cpp_pybinding(self: Any, *args: Any, **kwargs: Any) -> Any:
            settings = _LAZY.get()
            if settings is not None:
                return LazyKernel(functools.partial(original, self, *args, **kwargs), settings)
            return original(self, *args, **kwargs)

        return cpp_pybinding

    return wrap_once(AsyncCompile, "cpp_pybinding", make)


@contextlib.contextmanager
def lazy_kernels(enabled: bool = True) -> Iterator[None]:
    """C++ kernels of modules this thread loads in the block are lazy (Note [Lazy variant kernels]).

    Built, when asked, under the Inductor configuration in force on entry.
    """
    if not (enabled and _install_lazy_hook()):
        yield
        return
    from torch._inductor import config as inductor_config

    token = _LAZY.set(inductor_config.get_config_copy())
    try:
        yield
    finally:
        _LAZY.reset(token)


class LazyKernel:
    """A variant's C++ kernel, built when first needed (Note [Lazy variant kernels])."""

    __slots__ = ("_build", "_settings", "_pending", "_kernel", "_lock")

    def __init__(self, build: Callable[[], Any], settings: dict[str, Any]) -> None:
        self._build = build
        self._settings = settings
        self._pending: Any = None
        self._kernel: Any = None
        self._lock = threading.Lock()

    def submit(self) -> None:
        """Hand the kernel to Inductor's compile workers (once)."""
        with self._lock:
            if self._kernel is None and self._pending is None:
                from torch._inductor import config as inductor_config

                with inductor_config.patch(self._settings):
                    self._pending = self._build()

    def result(self) -> Any:
        """The built kernel (waits for it)."""
        self.submit()
        with self._lock:
            if self._kernel is None:
                pending, self._pending = self._pending, None
                self._kernel = pending.result() if hasattr(pending, "result") else pending
            return self._kernel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.result()(*args, **kwargs)


def force_kernels(scope: dict[str, Any] | None) -> int:
    """Build every lazy kernel of a module's globals, in parallel; returns how many.

    Args:
        scope: A wrapper module's globals (None: nothing to build).

    Returns:
        The number of kernels built.

    Raises:
        Exception: A kernel failed to build (the scope keeps the others lazy).
    """
    if not scope:
        return 0
    lazy = {k: v for k, v in scope.items() if isinstance(v, LazyKernel)}
    for kernel in lazy.values():
        kernel.submit()
    for name, kernel in lazy.items():
        scope[name] = kernel.result()
    return len(lazy)
