"""The ``torch_replay`` torch.compile backend: Inductor plus the wrapper-permutation pass.

Note [Hooking the pass into Inductor]
The backend calls Inductor's ``compile_fx`` with its own ``inner_compile``, so
forward, backward (compiled lazily at the first backward) and inference graphs
all pass through it. Inside, ``compile_fx_inner`` produces a
``CompiledFxGraph`` (compiled or loaded from the FX graph cache) and calls its
``post_compile`` to wrap the callable (input realignment, cudagraphs). For the
duration of our inner compile only, ``CompiledFxGraph.post_compile`` is
wrapped so that the pass runs on the finished graph *before* those wrappers:
it reads ``source_code`` and the loaded module's globals, and when the guard
accepts the permuted program it replaces ``current_callable`` with a ``call``
compiled from the permuted source in a copy of those globals. The loaded
module itself (shared through Inductor's code cache with plain ``inductor``
compiles of the same graph) is never modified, and ``source_code`` (what the
FX graph cache stores) stays the original.

Caches: a cache hit still goes through ``post_compile``, so the pass always
runs; the pass is also registered as ``post_grad_custom_post_pass`` (an FX
no-op) whose ``uuid()`` hashes the pass's sources and configuration, which
salts the FX graph cache key. AOTAutograd's cache would bypass
``inner_compile`` on a hit, so it is disabled while this backend compiles.
If the installed torch lacks ``CompiledFxGraph.post_compile``, the pass runs
after ``compile_fx_inner`` and rewrites only an unwrapped callable; modes that
produce no Python wrapper (``cpp_wrapper``, AOT) are left unchanged with a
reason.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from inductor_pass.config import PassConfig, get_config
from inductor_pass.report import GraphReport, record

__all__ = ["TorchReplayPass", "torch_replay_backend", "make_backend", "register"]

_SOURCES = (
    "backend.py",
    "config.py",
    "guard.py",
    "permute.py",
    "report.py",
    "rewrite.py",
    "units.py",
    "wrapper_ast.py",
)

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
        here = os.path.dirname(os.path.abspath(__file__))
        for name in _SOURCES:
            with open(os.path.join(here, name), "rb") as f:
                h.update(f.read())
        cfg = {k: getattr(self.config, k) for k in self.config.__slots__}  # type: ignore[attr-defined]
        cfg.pop("report", None)
        cfg.pop("dump_dir", None)
        h.update(repr(sorted(cfg.items())).encode())
        if self.chained is not None:
            inner = getattr(self.chained, "uuid", lambda: None)()
            h.update(repr(inner).encode())
        return h.hexdigest()


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

    ``compiled_graph.current_callable`` becomes a :class:`_FirstCallPass`,
    which runs the pass at the first call (Note [Profiling on real inputs])
    and from then on calls the permuted program when it was deployed, else
    the original. Graphs the pass cannot handle are reported here.
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
        compiled_graph.current_callable = _FirstCallPass(
            source, glob, call, partitions, kind, config
        )
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


class _FirstCallPass:
    """Run the pass at the first call, on copies of that call's real inputs.

    Note [Profiling on real inputs]
    The pass runs the graph's kernels to profile effects and memory. Inputs
    fabricated from the example inputs' metadata are not valid data for every
    program: indices computed from a float input fall out of range, and then
    Inductor's index assert throws inside an OpenMP region (the process
    aborts) or, with ``assert_indirect_indexing=False``, the kernel writes out
    of bounds. So every graph is profiled at its first call, on copies of that
    call's real inputs, which the kernels are about to process anyway; the
    first call also shows which inputs the call owns (Note [Input ownership]
    in ``inductor_pass/guard.py``). The first call itself runs the original
    program after the pass's own runs on copies; later calls run the permuted
    program when it was deployed. The report is recorded at the first call.
    Any exception inside the pass leaves the original program.
    """

    def __init__(self, source, glob, call, partitions, kind, config) -> None:
        self.impl = call
        self._next = None
        self._pending = (source, glob, partitions, kind, config)

    def __call__(self, args: list[Any]) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None:
            from inductor_pass import guard

            try:
                owned: list[bool] | None = guard.input_ownership(args)
            except Exception:
                owned = None
            self._run_pass(args, owned, *pending)
            call = self.impl
            self.impl = self._next if self._next is not None else call
            return call(args)
        return self.impl(args)

    def _run_pass(self, args, owned, source, glob, partitions, kind, config) -> None:
        from inductor_pass.rewrite import optimize_wrapper

        try:
            rep, new_call, _ = optimize_wrapper(
                source,
                glob,
                list(args),
                original_call=self.impl,
                partitions=partitions,
                config=config,
                kind=kind,
                owned=owned,
            )
            self._next = new_call
            rep.notes.append("profiled on a copy of the first call's real inputs")
            if owned is None:
                rep.notes.append("input ownership unknown: every input taken as held")
        except Exception as exc:
            rep = GraphReport(
                kind=kind,
                original_source=source,
                reason=f"left unchanged: pass failed ({type(exc).__name__}: {exc})",
            )
            rep.notes.append(traceback.format_exc(limit=6))
        record(rep, print_it=config.report, dump_dir=config.dump_dir)


@contextlib.contextmanager
def _post_compile_hook(kind: str, config: PassConfig) -> Iterator[bool]:
    """Wrap ``CompiledFxGraph.post_compile`` while one inner compile runs (probed)."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except Exception:
        yield False
        return
    original = CompiledFxGraph.__dict__.get("post_compile")
    if original is None:
        yield False
        return

    @functools.wraps(original)
    def post_compile(self: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        CompiledFxGraph.post_compile = original  # once per inner compile
        run_pass(self, example_inputs, kind, config)
        return original(self, example_inputs, *args, **kwargs)

    CompiledFxGraph.post_compile = post_compile
    try:
        yield True
    finally:
        CompiledFxGraph.post_compile = original


def _inner_compile(gm: torch.fx.GraphModule, example_inputs: Any, *, _config: PassConfig, **kw):
    from torch._inductor.compile_fx import compile_fx_inner

    kind = _kind(kw)
    with _post_compile_hook(kind, _config) as hooked:
        out = compile_fx_inner(gm, example_inputs, **kw)
    if not hooked:
        # Fallback: rewrite only a callable that post_compile did not wrap.
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

        cfg = config or get_config()
        existing = getattr(inductor_config, "post_grad_custom_post_pass", None)
        if isinstance(existing, TorchReplayPass):
            existing = existing.chained
        patches = dict(options.get("options") or {})
        if hasattr(inductor_config, "post_grad_custom_post_pass"):
            patches["post_grad_custom_post_pass"] = TorchReplayPass(cfg, existing)
        try:
            from torch._functorch import config as functorch_config

            no_aot_cache = functorch_config.patch(enable_autograd_cache=False)
        except Exception:
            no_aot_cache = contextlib.nullcontext()
        with no_aot_cache:
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
