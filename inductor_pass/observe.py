"""Observers of the backend: what benchmarks and profilers see of a compile, without patching.

Note [Compile observers]
A benchmark that studies the pass (the regeneration baseline, the variant-cost
profiler, the stage profiler in ``benchmarks/``) needs what the backend sees:
the FX graph before Inductor compiles it, the compiled program, the first
call's real inputs and their ownership, the profile of each program, the
report, and how long each step of the backend takes (:func:`span`).
:func:`observing` registers a :class:`CompileObserver` for the block
(every thread; observers are process-wide, like the backend's hooks), and the
backend calls each of its methods at that point. An observer only looks: it
must not change its arguments (copy what it keeps), and an exception it raises
is not caught (a benchmark should fail loudly). With no observer registered
each point costs one empty-list check.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["CompileObserver", "notify", "observing", "span"]


class CompileObserver:
    """Base class: every method is a no-op; override the points to observe."""

    def span_start(self, name: str) -> None:
        """A step of the backend named ``name`` starts (see :func:`span`)."""

    def span_end(self, name: str, seconds: float) -> None:
        """The step ``name`` ended (also when it raised) after ``seconds`` of wall time."""

    def before_inner_compile(self, gm: Any, example_inputs: Any, kwargs: dict[str, Any]) -> None:
        """Inductor's inner compile of ``gm`` is about to start (the graph is still unlowered)."""

    def after_inner_compile(
        self, gm: Any, example_inputs: Any, kwargs: dict[str, Any], compiled: Any
    ) -> None:
        """The inner compile returned ``compiled`` (a ``CompiledFxGraph``), variants included."""

    def variants_compiled(self, source: str | None, variants: list[Any], notes: list[str]) -> None:
        """The inner compile of the default program ``source`` made ``variants``
        (``inductor_pass.variants.choose.Variant``; ``notes`` say where each was
        generated and why any is missing)."""

    def profiled(self, source: str, profiled: Any) -> None:
        """The pass profiled the program ``source`` (``inductor_pass.stages.profile.Profiled``)."""

    def first_call(
        self,
        source: str,
        args: list[Any],
        owned: list[bool] | None,
        original_call: Any,
        report: Any,
        seconds: float,
    ) -> None:
        """The pass ran at a graph's first call: on ``args`` (not yet consumed by the
        original program, which runs next), with input ownership ``owned``; ``report``
        is the graph's ``GraphReport``, ``seconds`` the pass's wall time there."""


_OBSERVERS: list[CompileObserver] = []
_LOCK = threading.Lock()


@contextlib.contextmanager
def observing(observer: CompileObserver) -> Iterator[CompileObserver]:
    """Register ``observer`` for the block (Note [Compile observers]).

    Args:
        observer: Called at each point of every compile the backend runs.

    Yields:
        ``observer``.
    """
    with _LOCK:
        _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        with _LOCK:
            _OBSERVERS.remove(observer)


@contextlib.contextmanager
def _span(name: str) -> Iterator[None]:
    notify("span_start", name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        notify("span_end", name, time.perf_counter() - t0)


_NO_SPAN = contextlib.nullcontext()


def span(name: str) -> contextlib.AbstractContextManager[None]:
    """A step of the backend, reported to observers by name: ``"inner compile"``,
    ``"variant programs"``, ``"first-call pass"``, ``"profile stage"``, ``"search
    stage"``, ``"decide stage"``, ``"variant choice"``. Free (a shared no-op context)
    when no observer is registered."""
    return _span(name) if _OBSERVERS else _NO_SPAN


def notify(point: str, *args: Any) -> None:
    """Call ``point`` on every registered observer (the backend's side)."""
    if not _OBSERVERS:
        return
    for observer in list(_OBSERVERS):
        getattr(observer, point)(*args)
