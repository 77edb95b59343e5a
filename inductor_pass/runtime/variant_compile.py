"""One inner compile with its program variants: forked, compiled here, or loaded.

The default program is compiled by Inductor as always; each variant (Note
[Program variants] in ``inductor_pass/variants/choose.py``) is generated in a
forked child while it compiles (Note [Forked variant codegen] in
``inductor_pass/variants/fork.py``), or compiled in this thread before it, or,
when the child could not make it, after it from a copy of the graph taken
before. Variant modules load with lazy kernels (Note [Lazy variant kernels])
and their kernel waits are deferred to the default program's ``post_compile``
(Note [Deferred variant kernels], both in ``inductor_pass/variants/kernels.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from inductor_pass.config import PassConfig
from inductor_pass.observe import span
from inductor_pass.runtime.graph_copy import binds_unbacked_symbols, copy_graph
from inductor_pass.runtime.state import HookState, collecting, detach
from inductor_pass.stages import guard
from inductor_pass.stages.observable import observable_node
from inductor_pass.variants import fork, kernels
from inductor_pass.variants.choose import Program, Variant, flipped_options, program_of

__all__ = ["Variants", "compile_with_variants"]


@dataclass(kw_only=True, slots=True)
class Variants:
    """The variant programs one inner compile made, and why any is missing."""

    variants: list[Variant] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: bool = False
    """Variants were wanted and deliberately not compiled for this graph (the first
    call must not look for them in the pass's cache either)."""


def compile_with_variants(gm: Any, example_inputs: Any, kw: dict[str, Any], state: HookState):
    """Inductor's inner compile of ``gm`` plus its variants, under ``state`` (already active).

    Returns:
        ``(compiled graph, Variants)``; variants whose kernels failed to build
        are dropped with a note.

    Raises:
        Exception: What the default program's compile raised (the children
        are killed first).
    """
    from torch._inductor.compile_fx import compile_fx_inner

    config = state.config
    assert config is not None
    state.deferred, state.failed_variants = [], {}
    options = _variant_options(gm, example_inputs, config)
    forked: list[fork.Forked] = []
    made = Variants()
    if not options and config.enabled and config.variants and binds_unbacked_symbols(gm):
        made.skipped = True
        made.notes.append(
            "variants not compiled: data-dependent sizes (a program is chosen by its peak "
            "at one size; Note [Data-dependent sizes])"
        )
    try:
        forked, pristine = _start_forks(gm, example_inputs, kw, options, config, made.notes)
        here = [o for o in options if o[0] not in {f.name for f in forked}]
        _compile_variants(gm, example_inputs, kw, config, here, state, made)
        state.cpp_twin = _cpp_twin(gm, example_inputs, kw, config)
        out = compile_fx_inner(gm, example_inputs, **kw)
        _collect_forks(forked, out, pristine, example_inputs, kw, state, made)
    finally:
        state.cpp_twin = None
        for f in forked:  # the default compile failed: the children are not wanted
            fork.abandon(f)
        failed = {**state.failed_variants, **kernels.resolve_deferred(state.deferred)}
        state.failed_variants = {}
    for v in made.variants:
        if id(v.program.globals) in failed:
            made.notes.append(f"variant {v.name} not compiled: {failed[id(v.program.globals)]}")
    made.variants = [v for v in made.variants if id(v.program.globals) not in failed]
    return out, made


def _cpp_twin(gm: Any, example_inputs: Any, kw: dict[str, Any], config: PassConfig):
    """The Python twin of a ``cpp_wrapper`` graph (Note [C++ wrapper]), why there is none,
    or None when the graph has a Python wrapper (or the pass is off)."""
    from torch._inductor import config as inductor_config

    from inductor_pass.runtime import cpp_wrapper

    if not (config.enabled and kw.get("cpp_wrapper", inductor_config.cpp_wrapper)):
        return None
    try:
        return cpp_wrapper.compile_twin(gm, example_inputs, kw)
    except Exception as exc:  # the C++ program is compiled and runs unchanged
        return f"no Python twin ({type(exc).__name__}: {exc})"


def _variant_options(gm, example_inputs, config: PassConfig) -> list[tuple[str, dict[str, bool]]]:
    """``(name, Inductor config patch)`` of each variant to compile for this graph."""
    from torch._inductor import config as inductor_config

    if not (config.enabled and config.variants) or guard.symbolic_inputs(example_inputs):
        return []
    with contextlib.suppress(Exception):  # variants are an option: compiled when unsure
        if observable_node(gm) is not None:  # never run (Note [Observable calls])
            return []
    if getattr(inductor_config, "cpp_wrapper", False):
        return []
    if binds_unbacked_symbols(gm):  # never chosen: Note [Data-dependent sizes]
        return []
    return flipped_options(config.variants)


def _start_forks(gm, example_inputs, kw, options, config: PassConfig, notes: list[str]):
    """Fork a child per variant (Note [Forked variant codegen]); ``(forked, graph copy)``."""
    forked: list[fork.Forked] = []
    if not (options and config.fork_variants):
        return forked, None
    why = fork.fork_reason(example_inputs)
    if why is not None:
        notes.append(f"variants compiled in this process: {why}")
        return forked, None
    pristine = None
    try:
        pristine = copy_graph(gm)  # for a variant the child fails to make
    except Exception as exc:
        notes.append(f"no copy of the graph for a fallback ({type(exc).__name__})")
    for name, patch in options:
        try:
            forked.append(
                fork.start(gm, example_inputs, kw, name, patch, config.inject_failure, detach)
            )
        except Exception as exc:
            notes.append(f"variant {name} not forked ({exc}): compiled here")
    return forked, pristine


def _collect_forks(forked, out, pristine, example_inputs, kw, state: HookState, made: Variants):
    """Load what the children made; compile here what they could not. Empties ``forked``."""
    config = state.config
    assert config is not None
    default_glob = None
    with contextlib.suppress(Exception):
        default_glob = program_of(out).globals
    retry = []
    while forked:
        f = forked.pop(0)
        got, why = fork.collect(f, default_glob, lazy=config.variant_bound)
        if got is not None:
            made.variants.append(got)
            made.notes.append(f"variant {f.name} {why}")
        elif why.startswith("retry"):
            made.notes.append(f"variant {f.name}: {why.removeprefix('retry: ')}; compiled here")
            retry.append((f.name, f.patch))
        else:
            made.notes.append(f"variant {f.name} not used: {why.removeprefix('drop: ')}")
    if retry and pristine is None:
        made.notes += [f"variant {n} dropped: no copy of the graph to compile" for n, _ in retry]
    elif retry:
        _compile_variants(pristine, example_inputs, kw, config, retry, state, made)


def _compile_variants(gm, example_inputs, kw, config: PassConfig, options, state, made) -> None:
    """Compile the graph's alternative programs ``options`` in this thread (Note [Program variants]).

    Runs before the default compile (or after it, on a copy of the graph taken
    before, for a variant Note [Forked variant codegen] could not make), on
    copies of ``gm`` (Inductor's post-grad passes rewrite the graph in place).
    Appends each compiled variant to ``made.variants``, and why any variant is
    missing to ``made.notes``.
    """
    if not options:
        return
    with span("variant programs"):
        _compile_each(gm, example_inputs, kw, config, options, state, made)


def _compile_each(gm, example_inputs, kw, config: PassConfig, options, state, made) -> None:
    from torch._guards import TracingContext
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    context = TracingContext.try_get()
    for name, patch in options:
        # post_compile records the graph's output strides in the tracing
        # context for AOTAutograd; only the default program may leave them.
        strides = getattr(context, "output_strides", None)
        saved = list(strides) if strides is not None else None
        if strides is not None:
            strides.clear()  # empty before a compile (a fallback variant runs after the default's)
        deferred: list[kernels.DeferredWait] = []
        try:
            gm_copy = copy_graph(gm)
            with (
                collecting() as sink,
                kernels.deferring_waits(deferred),  # Note [Deferred variant kernels]
                inductor_config.patch(patch),
                kernels.lazy_kernels(config.variant_bound),
            ):
                compile_fx_inner(gm_copy, example_inputs, **kw)
        except Exception as exc:
            made.notes.append(f"variant {name} not compiled: {type(exc).__name__}: {exc}")
            state.deferred.extend(deferred)  # still awaited, then dropped with the variant
            continue
        finally:
            if saved is not None and strides is not None:
                strides[:] = saved
        state.deferred.extend(deferred)
        if len(sink) == 1 and isinstance(sink[0], Program):
            made.variants.append(Variant(name=name, program=sink[0]))
        else:
            made.notes.append(f"variant {name} has no Python wrapper to use ({sink!r:.80})")
