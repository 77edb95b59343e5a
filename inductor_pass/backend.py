"""The ``torch_replay`` torch.compile backend: Inductor plus the wrapper-permutation pass.

Note [Hooking the pass into Inductor]
The backend calls Inductor's ``compile_fx`` with its own ``inner_compile``, so
forward, backward (compiled lazily at the first backward) and inference graphs
all pass through it. Inside, ``compile_fx_inner`` produces a
``CompiledFxGraph`` (compiled or loaded from the FX graph cache) and calls its
``post_compile`` to wrap the callable (input realignment, cudagraphs). On an
AOTAutograd cache hit ``inner_compile`` is skipped, but the loaded forward and
backward graphs still go through ``post_compile``
(``torch/_functorch/_aot_autograd/aot_autograd_result.py``). So
``CompiledFxGraph.post_compile`` is wrapped once per process (a pass-through
unless this thread is inside the backend or its inner compile, see
:func:`_armed`), and the pass is armed on the finished graph *before*
Inductor's wrappers: ``current_callable`` becomes a :class:`FirstCallPass`
that runs the pass at the first call and then calls either the original
``call`` or one compiled from the permuted source in a copy of the loaded
module's globals. The loaded module itself (shared through Inductor's code
cache with plain ``inductor`` compiles of the same graph) is never modified,
and ``source_code`` (what the caches store) stays the original.

Caches: the pass is registered as ``post_grad_custom_post_pass`` (an FX
no-op) whose ``uuid()`` hashes the pass's sources and configuration, which
salts the FX graph and AOTAutograd cache keys; both caches stay on (unless
program variants are wanted and the decision cache is off, see Note
[Decision cache]). The
pass's own decisions are cached too (Note [Decision cache] in
``inductor_pass/decision_cache.py``), so a warm process pays next to nothing.
If the installed torch lacks ``CompiledFxGraph.post_compile``, the pass is
armed after ``compile_fx_inner`` on an unwrapped callable only; modes that
produce no Python wrapper (``cpp_wrapper``, AOT) are left unchanged with a
reason.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from inductor_pass.config import PassConfig, get_config
from inductor_pass.first_call import FirstCallPass
from inductor_pass.report import GraphReport, record

__all__ = ["TorchReplayPass", "torch_replay_backend", "make_backend", "register"]


try:  # probed: the base class moved across versions
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
except Exception:  # pragma: no cover - very old torch
    _PassBase = object  # type: ignore[assignment,misc]


class TorchReplayPass(_PassBase):  # type: ignore[misc,valid-type]
    """The pass as a ``CustomGraphPass``: an FX no-op whose ``uuid()`` salts Inductor's caches.

    The permutation itself runs after code generation (Note [Hooking the pass
    into Inductor]); :meth:`uuid` hashes the pass's source files and its
    configuration so that a cached program is never reused across pass
    versions or options.
    """

    def __init__(self, config: PassConfig, chained: Any = None) -> None:
        self.config = config
        self.chained = chained

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> str:
        h = hashlib.sha256()
        for name, text in _package_sources():
            h.update(name.encode())
            h.update(text)
        cfg = {k: getattr(self.config, k) for k in self.config.__slots__}  # type: ignore[attr-defined]
        # These do not change any program (a variant is only skipped when it cannot win).
        for key in ("report", "dump_dir", "decision_cache", "variant_bound", "fork_variants"):
            cfg.pop(key, None)
        h.update(repr(sorted(cfg.items())).encode())
        if self.chained is not None:
            inner = getattr(self.chained, "uuid", lambda: None)()
            h.update(repr(inner).encode())
        return h.hexdigest()


@functools.cache
def _package_sources() -> tuple[tuple[str, bytes], ...]:
    """Every Python source file of the package, sorted by name (the cache salt).

    All of them, not a hand-kept list, so that no change to the pass can reuse
    a cached program or decision of an older pass (``regenerate.py`` too: it is
    a benchmark helper, but hashing it costs nothing and needs no judgment).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                out.append((name, f.read()))
    return tuple(out)


def _kind(kwargs: dict[str, Any]) -> str:
    if kwargs.get("is_backward"):
        return "backward"
    if kwargs.get("is_inference"):
        return "inference"
    return "forward"


def _unchanged(kind: str, reason: str, config: PassConfig) -> None:
    rep = GraphReport(kind=kind, reason=f"left unchanged: {reason}")
    record(rep, print_it=config.report, dump_dir=config.dump_dir)


def _module_parts(compiled_graph: Any) -> tuple[dict[str, Any], Any, Any]:
    """(globals, original call, partitions) of a CompiledFxGraph's loaded module."""
    call = compiled_graph.current_callable
    runner = getattr(compiled_graph, "compiled_fn_runner", None)
    fn = getattr(call, "__func__", call)
    glob = getattr(fn, "__globals__", None)
    if glob is None:
        raise RuntimeError(f"cannot find the wrapper module of {call!r}")
    partitions = getattr(runner, "partitions", None) if runner is not None else None
    return glob, call, partitions


def run_pass(compiled_graph: Any, example_inputs: Any, kind: str, config: PassConfig) -> None:
    """Arm the pass on a finished ``CompiledFxGraph``; never raises.

    ``compiled_graph.current_callable`` becomes a :class:`FirstCallPass`,
    which runs the pass at the first call (Note [Profiling on real inputs]
    in ``inductor_pass/first_call.py``) and from then on calls the permuted
    program when it was deployed, else the original. Graphs the pass cannot
    handle are reported here.
    """
    from torch._inductor import config as inductor_config

    if not config.enabled:
        return _unchanged(kind, "pass disabled (PassConfig.enabled=False)", config)
    if getattr(inductor_config, "cpp_wrapper", False):
        return _unchanged(kind, "cpp_wrapper mode has no Python wrapper to permute", config)
    source = getattr(compiled_graph, "source_code", None)
    if not isinstance(source, str) or getattr(compiled_graph, "current_callable", None) is None:
        return _unchanged(kind, f"{type(compiled_graph).__name__} has no Python wrapper", config)
    from inductor_pass import guard

    try:
        dynamic = guard.symbolic_inputs(example_inputs)
        if dynamic:
            return _unchanged(
                kind, f"dynamic shapes ({dynamic}); a peak is certified per size", config
            )
        glob, call, partitions = _module_parts(compiled_graph)
        first_call = FirstCallPass(source, glob, call, partitions, kind, config)
        compiled_graph.current_callable = first_call
        _HOOK.last_armed = first_call
        return None
    except Exception as exc:
        rep = GraphReport(
            kind=kind,
            original_source=source,
            reason=f"left unchanged: pass failed ({type(exc).__name__}: {exc})",
        )
        rep.notes.append(traceback.format_exc(limit=6))
    record(rep, print_it=config.report, dump_dir=config.dump_dir)
    return None


_HOOK = threading.local()
_HOOK_LOCK = threading.Lock()


def _kind_of(compiled_graph: Any, graph_kwargs: Any) -> str:
    kw = graph_kwargs if isinstance(graph_kwargs, dict) else {}
    if kw.get("is_backward"):
        return "backward"
    head = (getattr(compiled_graph, "source_code", "") or "")[:400]
    if "_inference'" in head or kw.get("is_inference"):
        return "inference"
    return "forward"


def _wrap_once(owner: Any, name: str, make: Any) -> bool:
    """Replace ``owner.name`` by ``make(original)`` once per process; False if absent."""
    with _HOOK_LOCK:
        current = owner.__dict__.get(name)
        if current is None:
            return False
        if getattr(current, "_torch_replay_hook", False):
            return True
        wrapper = functools.wraps(current)(make(current))
        wrapper._torch_replay_hook = True
        setattr(owner, name, wrapper)
        return True


def _install_post_compile_hook() -> bool:
    """Wrap ``CompiledFxGraph.post_compile`` once per process (probed); False if absent."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except Exception:
        return False

    def make(original: Any) -> Any:
        def post_compile(self: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            sink = getattr(_HOOK, "sink", None)
            config = getattr(_HOOK, "config", None)
            if sink is not None:  # a variant program: collected, not armed
                try:
                    sink.append((self.source_code, *_module_parts(self)))
                except Exception as exc:
                    sink.append(exc)
            elif config is not None and not isinstance(
                getattr(self, "current_callable", None), FirstCallPass
            ):
                _HOOK.failed_variants = {
                    **getattr(_HOOK, "failed_variants", {}),
                    **_resolve_deferred(),
                }
                graph_kwargs = args[1] if len(args) > 1 else kwargs.get("graph_kwargs")
                run_pass(self, example_inputs, _kind_of(self, graph_kwargs), config)
            return original(self, example_inputs, *args, **kwargs)

        return post_compile

    return _wrap_once(CompiledFxGraph, "post_compile", make)


def _install_wait_hook() -> bool:
    """Wrap ``AsyncCompile.wait`` once per process (probed); False if absent.

    Note [Deferred variant kernels]
    A variant's wrapper module submits its C++ kernels to Inductor's compile
    workers when it loads and then waits for all of them. Waiting there keeps
    the workers' compiles from overlapping the default program's lowering and
    code generation, which come next in this thread. So while a variant loads
    (``_HOOK.defer`` is a list, set by :func:`_compile_variants` for this
    thread only) the wait is recorded instead of done; :func:`_resolve_deferred`
    does it, with Inductor's own ``wait``, as soon as the default program's
    module is loaded (at its ``post_compile``, before anything can call either
    program) and at the latest when the inner compile returns or fails. A
    variant whose kernels fail to build is dropped with a note. Other threads,
    and every compile outside a variant's, wait as Inductor does.
    """
    try:
        from torch._inductor.async_compile import AsyncCompile
    except Exception:
        return False

    def make(original: Any) -> Any:
        def wait(self: Any, scope: dict[str, Any]) -> None:
            deferred = getattr(_HOOK, "defer", None)
            if deferred is not None:
                deferred.append((original, self, scope))
                return None
            return original(self, scope)

        return wait

    return _wrap_once(AsyncCompile, "wait", make)


def _install_lazy_hook() -> bool:
    """Wrap ``AsyncCompile.cpp_pybinding`` once per process (probed); False if absent.

    Note [Lazy variant kernels]
    A variant's C++ kernels are most of its cost at a cold compile (issue 12:
    about one second of CPU per kernel body the default program does not
    share), and most variants are never deployed. So while a variant's module
    loads (inside :func:`lazy_kernels`, which sets ``_HOOK.lazy`` for this
    thread only: the variant's compile, the forked variant's load, a cached
    variant's load) each ``cpp_pybinding`` kernel becomes a :class:`_LazyKernel`: not
    submitted to the compile workers until :func:`force_kernels` asks for it,
    at the first call, once Note [Variant bound] has not ruled the variant out.
    A lazy kernel that is called before that (the module is Inductor's, shared
    through its code cache) builds itself first, so a caller never sees the
    difference. Kernels are built under the Inductor configuration of the
    variant's compile, as Inductor would have built them then.
    """
    try:
        from torch._inductor.async_compile import AsyncCompile
    except Exception:
        return False

    def make(original: Any) -> Any:
        def cpp_pybinding(self: Any, *args: Any, **kwargs: Any) -> Any:
            settings = getattr(_HOOK, "lazy", None)
            if settings is not None:
                return _LazyKernel(functools.partial(original, self, *args, **kwargs), settings)
            return original(self, *args, **kwargs)

        return cpp_pybinding

    return _wrap_once(AsyncCompile, "cpp_pybinding", make)


@contextlib.contextmanager
def lazy_kernels(enabled: bool = True) -> Iterator[None]:
    """C++ kernels of modules this thread loads in the block are lazy (Note [Lazy variant kernels]).

    Built, when asked, under the Inductor configuration in force on entry.
    """
    if not (enabled and _install_lazy_hook()):
        yield
        return
    from torch._inductor import config as inductor_config

    _HOOK.lazy = inductor_config.get_config_copy()
    try:
        yield
    finally:
        _HOOK.lazy = None


class _LazyKernel:
    """A variant's C++ kernel, built when first needed (Note [Lazy variant kernels])."""

    __slots__ = ("_build", "_settings", "_pending", "_kernel", "_lock")

    def __init__(self, build: Any, settings: dict[str, Any]) -> None:
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

    Raises:
        Exception: A kernel failed to build (the scope keeps the others lazy).
    """
    if not scope:
        return 0
    lazy = {k: v for k, v in scope.items() if isinstance(v, _LazyKernel)}
    for kernel in lazy.values():
        kernel.submit()
    for name, kernel in lazy.items():
        scope[name] = kernel.result()
    return len(lazy)


def _resolve_deferred() -> dict[int, str]:
    """Do the waits deferred by Note [Deferred variant kernels]; never raises.

    Returns:
        ``{id(module globals): error}`` for each variant module whose kernels failed.
    """
    pending = getattr(_HOOK, "deferred", None) or []
    _HOOK.deferred = []
    failed: dict[int, str] = {}
    for wait, owner, scope in pending:
        try:
            wait(owner, scope)
        except Exception as exc:
            failed[id(scope)] = f"{type(exc).__name__}: {exc}"
    return failed


@contextlib.contextmanager
def _armed(config: PassConfig) -> Iterator[bool]:
    """Arm the pass on every graph this thread finishes while the block runs."""
    hooked = _install_post_compile_hook()
    previous = getattr(_HOOK, "config", None)
    _HOOK.config = config
    try:
        yield hooked
    finally:
        _HOOK.config = previous


def _inner_compile(gm: torch.fx.GraphModule, example_inputs: Any, *, _config: PassConfig, **kw):
    from torch._inductor.compile_fx import compile_fx_inner

    from inductor_pass import variant_fork

    kind = _kind(kw)
    _HOOK.deferred, _HOOK.failed_variants = [], {}
    options = _variant_options(example_inputs, _config)
    forked: list[variant_fork.Forked] = []
    notes: list[str] = []
    try:
        forked, pristine = _start_forks(gm, example_inputs, kw, options, _config, notes)
        here = [o for o in options if o[0] not in {f.name for f in forked}]
        alternatives, more = _compile_variants(gm, example_inputs, kw, _config, here)
        notes += more
        _HOOK.last_armed = None
        with _armed(_config) as hooked:
            out = compile_fx_inner(gm, example_inputs, **kw)
        alternatives += _collect_forks(forked, out, pristine, example_inputs, kw, _config, notes)
    finally:
        for f in forked:  # the default compile failed: the children are not wanted
            variant_fork.abandon(f)
        failed = {**_HOOK.failed_variants, **_resolve_deferred()}
        _HOOK.failed_variants = {}
    for name, _src, glob, *_ in [a for a in alternatives if id(a[2]) in failed]:
        notes.append(f"variant {name} not compiled: {failed[id(glob)]}")
    alternatives = [a for a in alternatives if id(a[2]) not in failed]
    first_call, _HOOK.last_armed = getattr(_HOOK, "last_armed", None), None
    if isinstance(first_call, FirstCallPass):
        first_call.variants.extend(alternatives)
        first_call.variant_notes.extend(notes)
        source = getattr(out, "source_code", None)
        if alternatives and isinstance(source, str):
            from inductor_pass import decision_cache

            if decision_cache.enabled(_config):
                decision_cache.store_variants(
                    decision_cache.variants_key(source, TorchReplayPass(_config).uuid()),
                    {name: src for name, src, *_ in alternatives},
                )
    if not hooked:
        # Fallback: arm the pass only on a callable that post_compile did not wrap.
        call = getattr(out, "current_callable", None)
        runner = getattr(out, "compiled_fn_runner", None)
        bare = runner is not None and getattr(call, "__func__", None) is getattr(
            type(runner), "call", None
        )
        if bare:
            run_pass(out, example_inputs, kind, _config)
        else:
            _unchanged(kind, "this torch has no CompiledFxGraph.post_compile hook", _config)
    return out


def _start_forks(gm, example_inputs, kw, options, config: PassConfig, notes: list[str]):
    """Fork a child per variant (Note [Forked variant codegen]); ``(forked, graph copy)``."""
    from inductor_pass import variant_fork

    forked: list[variant_fork.Forked] = []
    if not (options and config.fork_variants):
        return forked, None
    why = variant_fork.fork_reason(example_inputs)
    if why is not None:
        notes.append(f"variants compiled in this process: {why}")
        return forked, None
    pristine = None
    try:
        pristine = copy.deepcopy(gm)  # for a variant the child fails to make
    except Exception as exc:
        notes.append(f"no copy of the graph for a fallback ({type(exc).__name__})")
    for name, patch in options:
        try:
            forked.append(
                variant_fork.start(gm, example_inputs, kw, name, patch, config.inject_failure)
            )
        except Exception as exc:
            notes.append(f"variant {name} not forked ({exc}): compiled here")
    return forked, pristine


def _collect_forks(forked, out, pristine, example_inputs, kw, config: PassConfig, notes):
    """Load what the children made; compile here what they could not. Empties ``forked``."""
    from inductor_pass import variant_fork

    default_glob = None
    with contextlib.suppress(Exception):
        default_glob = _module_parts(out)[0]
    alternatives, retry = [], []
    while forked:
        f = forked.pop(0)
        got, why = variant_fork.collect(f, default_glob, lazy=config.variant_bound)
        if got is not None:
            alternatives.append(got)
            notes.append(f"variant {f.name} {why}")
        elif why.startswith("retry"):
            notes.append(f"variant {f.name}: {why.removeprefix('retry: ')}; compiled here")
            retry.append((f.name, f.patch))
        else:
            notes.append(f"variant {f.name} not used: {why.removeprefix('drop: ')}")
    if retry and pristine is None:
        notes += [f"variant {name} dropped: no copy of the graph to compile" for name, _ in retry]
    elif retry:
        last = _HOOK.last_armed
        got_here, more = _compile_variants(pristine, example_inputs, kw, config, retry)
        alternatives += got_here
        notes += more
        _HOOK.last_armed = last
    return alternatives


def _variant_options(example_inputs, config: PassConfig) -> list[tuple[str, dict[str, bool]]]:
    """``(name, Inductor config patch)`` of each variant to compile for this graph."""
    from torch._inductor import config as inductor_config

    from inductor_pass import guard, variants

    if not (config.enabled and config.variants) or guard.symbolic_inputs(example_inputs):
        return []
    if getattr(inductor_config, "cpp_wrapper", False):
        return []
    return variants.flipped_options(config.variants)


def _compile_variants(gm, example_inputs, kw, config: PassConfig, options):
    """Compile the graph's alternative programs ``options`` in this thread (Note [Program variants]).

    Runs before the default compile (or after it, on a copy of the graph taken
    before, for a variant Note [Forked variant codegen] could not make), on
    copies of ``gm`` (Inductor's post-grad passes rewrite the graph in place).

    Returns:
        ``(alternatives, notes)``: ``(name, source, globals, call, partitions)``
        per compiled variant, and why any variant is missing.
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    if not options:
        return [], []
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    out, notes = [], []
    for name, patch in options:
        sink: list[Any] = []
        previous = getattr(_HOOK, "sink", None)
        # post_compile records the graph's output strides in the tracing
        # context for AOTAutograd; only the default program may leave them.
        strides = getattr(context, "output_strides", None)
        saved = list(strides) if strides is not None else None
        if strides is not None:
            strides.clear()  # empty before a compile (a fallback variant runs after the default's)
        deferred: list[Any] = []
        try:
            gm_copy = copy.deepcopy(gm)
            _HOOK.sink = sink
            if _install_wait_hook():
                _HOOK.defer = deferred  # Note [Deferred variant kernels]
            with inductor_config.patch(patch), lazy_kernels(config.variant_bound):
                compile_fx_inner(gm_copy, example_inputs, **kw)
        except Exception as exc:
            notes.append(f"variant {name} not compiled: {type(exc).__name__}: {exc}")
            _HOOK.deferred.extend(deferred)  # still awaited, then dropped with the variant
            continue
        finally:
            _HOOK.sink = previous
            _HOOK.defer = None
            if saved is not None and strides is not None:
                strides[:] = saved
        _HOOK.deferred.extend(deferred)
        if len(sink) == 1 and isinstance(sink[0], tuple):
            out.append((name, *sink[0]))
        else:
            notes.append(f"variant {name} has no Python wrapper to use ({sink!r:.80})")
    return out, notes


def make_backend(config: PassConfig | None = None):
    """A ``torch.compile`` backend running Inductor plus the pass with ``config``.

    Args:
        config: Pass options; None uses :func:`inductor_pass.get_config` at
            compile time.

    Returns:
        A backend callable ``(gm, example_inputs) -> compiled``.
    """

    def backend(gm: torch.fx.GraphModule, example_inputs: Any, **options: Any):
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        from inductor_pass import decision_cache

        cfg = config or get_config()
        existing = getattr(inductor_config, "post_grad_custom_post_pass", None)
        if isinstance(existing, TorchReplayPass):
            existing = existing.chained
        patches = dict(options.get("options") or {})
        if hasattr(inductor_config, "post_grad_custom_post_pass"):
            patches["post_grad_custom_post_pass"] = TorchReplayPass(cfg, existing)
        no_aot_cache = contextlib.nullcontext()
        if cfg.variants and not decision_cache.enabled(cfg):
            # Variants of graphs loaded from AOTAutograd's cache come from the
            # decision cache (Note [Decision cache]); without it, compile them.
            try:
                from torch._functorch import config as functorch_config

                no_aot_cache = functorch_config.patch(enable_autograd_cache=False)
            except Exception:
                pass
        with no_aot_cache, _armed(cfg):  # also arms graphs loaded from AOTAutograd's cache
            return compile_fx(
                gm,
                example_inputs,
                inner_compile=functools.partial(_inner_compile, _config=cfg),
                config_patches=patches,
            )

    backend.__name__ = "torch_replay"
    return backend


def torch_replay_backend(gm: torch.fx.GraphModule, example_inputs: Any, **options: Any):
    """The ``torch_replay`` backend (entry point ``torch_dynamo_backends``)."""
    return make_backend()(gm, example_inputs, **options)


def register() -> None:
    """Register ``torch_replay`` with dynamo (idempotent)."""
    try:
        from torch._dynamo.backends.registry import _BACKENDS, register_backend
    except Exception:  # pragma: no cover - probed private API
        return
    if _BACKENDS.get("torch_replay") is None:
        register_backend(torch_replay_backend, name="torch_replay")
