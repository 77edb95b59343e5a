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
unless this thread is inside the backend or its inner compile, Note [Hook
state] in ``inductor_pass/runtime/state.py``), and the pass is armed on the finished graph *before*
Inductor's wrappers: ``current_callable`` becomes a :class:`FirstCallPass`
that runs the pass at the first call and then calls either the original
``call`` or one compiled from the permuted source in a copy of the loaded
module's globals. The loaded module itself (shared through Inductor's code
cache with plain ``inductor`` compiles of the same graph) is never modified,
and ``source_code`` (what the caches store) stays the original.

Caches: the pass is registered as ``post_grad_custom_post_pass`` (an FX
no-op, ``inductor_pass/runtime/salt.py``) whose ``uuid()`` hashes the pass's sources and configuration, which
salts the FX graph and AOTAutograd cache keys; both caches stay on (unless
program variants are wanted and the decision cache is off, see Note
[Decision cache]). The
pass's own decisions are cached too (Note [Decision cache] in
``inductor_pass/runtime/decision_cache.py``), so a warm process pays next to nothing.
If the installed torch lacks ``CompiledFxGraph.post_compile``, the pass is
armed after ``compile_fx_inner`` on an unwrapped callable only; modes that
produce no Python wrapper are handled through a Python twin (``cpp_wrapper``,
Note [C++ wrapper] in ``inductor_pass/runtime/cpp_wrapper.py``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from inductor_pass.config import PassConfig, get_config
from inductor_pass.observe import notify, span
from inductor_pass.report import GraphReport, failed, record
from inductor_pass.runtime import decision_cache, variant_compile
from inductor_pass.runtime.cpp_wrapper import CppTwin, CppWrapperPass
from inductor_pass.runtime.first_call import FirstCallPass
from inductor_pass.runtime.per_size import SizeDispatch
from inductor_pass.runtime.salt import TorchReplayPass, pass_uuid
from inductor_pass.runtime.state import HookState, active, current
from inductor_pass.stages import guard
from inductor_pass.variants import kernels
from inductor_pass.variants.choose import program_of

__all__ = [
    "TorchReplayPass",
    "install_post_compile_hook",
    "make_backend",
    "register",
    "run_pass",
    "torch_replay_backend",
]


def _kind(kwargs: dict[str, Any]) -> str:
    if kwargs.get("is_backward"):
        return "backward"
    if kwargs.get("is_inference"):
        return "inference"
    return "forward"


def _unchanged(kind: str, reason: str, config: PassConfig) -> None:
    rep = GraphReport(kind=kind, reason=f"left unchanged: {reason}")
    record(rep, print_it=config.report, dump_dir=config.dump_dir)


def run_pass(
    compiled_graph: Any,
    example_inputs: Any,
    kind: str,
    config: PassConfig,
    twin: CppTwin | str | None = None,
) -> FirstCallPass | SizeDispatch | CppWrapperPass | None:
    """Arm the pass on a finished ``CompiledFxGraph``; never raises.

    ``compiled_graph.current_callable`` becomes a :class:`FirstCallPass`,
    which runs the pass at the first call (Note [Profiling on real inputs]
    in ``inductor_pass/runtime/first_call.py``) and from then on calls the permuted
    program when it was deployed, else the original; for a graph with symbolic
    sizes, a :class:`SizeDispatch` that does so at the first call of each size
    (Note [Per-size orders] in ``inductor_pass/runtime/per_size.py``). Graphs the
    pass cannot handle are reported here. A ``cpp_wrapper`` graph gets a
    :class:`CppWrapperPass` on its Python ``twin`` (Note [C++ wrapper] in
    ``inductor_pass/runtime/cpp_wrapper.py``); ``twin`` is why there is none when a string.

    Returns:
        The armed pass, or None when the graph was left unchanged.
    """
    from torch._inductor import config as inductor_config

    if not config.enabled:
        return _unchanged(kind, "pass disabled (PassConfig.enabled=False)", config)
    if getattr(inductor_config, "cpp_wrapper", False):
        call = getattr(compiled_graph, "current_callable", None)
        if isinstance(twin, CppTwin) and call is not None:
            armed_cpp = CppWrapperPass(call, twin, kind, config)
            compiled_graph.current_callable = armed_cpp
            return armed_cpp
        why = twin or "no Python twin: the graph was not compiled in this backend call"
        return _unchanged(kind, f"cpp_wrapper: {why}", config)
    source = getattr(compiled_graph, "source_code", None)
    if not isinstance(source, str) or getattr(compiled_graph, "current_callable", None) is None:
        return _unchanged(kind, f"{type(compiled_graph).__name__} has no Python wrapper", config)
    try:
        armed: FirstCallPass | SizeDispatch
        if guard.symbolic_inputs(example_inputs):  # Note [Per-size orders]
            armed = SizeDispatch(program_of(compiled_graph), kind, config, example_inputs)
        else:
            armed = FirstCallPass(program_of(compiled_graph), kind, config)
        compiled_graph.current_callable = armed
        return armed
    except Exception as exc:
        rep = failed(kind, source, exc)
    record(rep, print_it=config.report, dump_dir=config.dump_dir)
    return None


def _kind_of(compiled_graph: Any, graph_kwargs: Any) -> str:
    kw = graph_kwargs if isinstance(graph_kwargs, dict) else {}
    if kw.get("is_backward"):
        return "backward"
    head = (getattr(compiled_graph, "source_code", "") or "")[:400]
    if "_inference'" in head or kw.get("is_inference"):
        return "inference"
    return "forward"


def install_post_compile_hook() -> bool:
    """Wrap ``CompiledFxGraph.post_compile`` once per process (probed); False if absent.

    The wrapper acts on the current :class:`~inductor_pass.runtime.state.HookState`
    only (Note [Hook state]): it collects the program into ``state.sink``
    when that is a list, else arms the pass when ``state.config`` is set.
    """
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except Exception:
        return False

    def make(original: Any) -> Any:
        def post_compile(self: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            state = current()
            if state is not None and state.sink is not None:  # collected, not armed
                try:
                    state.sink.append(program_of(self))
                except Exception as exc:
                    state.sink.append(exc)
            elif (
                state is not None
                and state.config is not None
                and not isinstance(
                    getattr(self, "current_callable", None),
                    (FirstCallPass, SizeDispatch, CppWrapperPass),
                )
            ):
                state.failed_variants.update(kernels.resolve_deferred(state.deferred))
                graph_kwargs = args[1] if len(args) > 1 else kwargs.get("graph_kwargs")
                armed = run_pass(
                    self, example_inputs, _kind_of(self, graph_kwargs), state.config, state.cpp_twin
                )
                if armed is not None:
                    state.armed.append(armed)
            return original(self, example_inputs, *args, **kwargs)

        return post_compile

    return kernels.wrap_once(CompiledFxGraph, "post_compile", make)


def _inner_compile(gm: torch.fx.GraphModule, example_inputs: Any, *, _state: HookState, **kw):
    """Inductor's inner compile of one graph under its backend call's ``_state`` (Note [Hook state]).

    The state is made current again here: a backward graph is compiled
    lazily, at the first backward, after the backend call has returned.
    """
    config = _state.config
    assert config is not None
    kind = _kind(kw)
    notify("before_inner_compile", gm, example_inputs, kw)
    start = len(_state.armed)  # what this compile arms; earlier ones are not its
    try:
        with active(_state), span("inner compile"):
            hooked = install_post_compile_hook()
            out, variants = variant_compile.compile_with_variants(gm, example_inputs, kw, _state)
        armed = _state.armed[-1] if len(_state.armed) > start else None
    finally:
        del _state.armed[start:]
    notify(
        "variants_compiled", getattr(out, "source_code", None), variants.variants, variants.notes
    )
    if armed is not None:
        armed.variants.extend(variants.variants)
        armed.variant_notes.extend(variants.notes)
        armed.variants_skipped = variants.skipped
        source = getattr(out, "source_code", None)
        if variants.variants and isinstance(source, str) and decision_cache.enabled(config):
            decision_cache.store_variants(
                decision_cache.variants_key(source, pass_uuid(config)),
                {v.name: v.program.source for v in variants.variants},
            )
    if not hooked:
        # Fallback: arm the pass only on a callable that post_compile did not wrap.
        call = getattr(out, "current_callable", None)
        runner = getattr(out, "compiled_fn_runner", None)
        bare = runner is not None and getattr(call, "__func__", None) is getattr(
            type(runner), "call", None
        )
        if bare:
            run_pass(out, example_inputs, kind, config)
        else:
            _unchanged(kind, "this torch has no CompiledFxGraph.post_compile hook", config)
    notify("after_inner_compile", gm, example_inputs, kw, out)
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

        from inductor_pass.runtime import decision_cache

        cfg = config or get_config()
        existing = getattr(inductor_config, "post_grad_custom_post_pass", None)
        if isinstance(existing, TorchReplayPass):
            existing = existing.chained
        patches = dict(options.get("options") or {})
        if hasattr(inductor_config, "post_grad_custom_post_pass"):
            patches["post_grad_custom_post_pass"] = TorchReplayPass(cfg, existing)
        if cfg.recompute and getattr(inductor_config, "custom_partitioner_fn", 0) is None:
            from inductor_pass.stages.train_recompute import TrainingRecompute

            # Training: the saved activations are chosen at the partition (Note
            # [Recomputation in training] in inductor_pass/stages/train_recompute.py).
            patches.setdefault("custom_partitioner_fn", TrainingRecompute(cfg))
        no_aot_cache = contextlib.nullcontext()
        cpp = patches.get("cpp_wrapper", getattr(inductor_config, "cpp_wrapper", False))
        if (cfg.variants and not decision_cache.enabled(cfg)) or (cfg.enabled and cpp):
            # A cpp_wrapper graph's twin is compiled in the inner compile (Note [C++ wrapper]
            # in inductor_pass/runtime/cpp_wrapper.py), which a cache hit skips.
            # Variants of graphs loaded from AOTAutograd's cache come from the
            # decision cache (Note [Decision cache]); without it, compile them.
            try:
                from torch._functorch import config as functorch_config

                no_aot_cache = functorch_config.patch(enable_autograd_cache=False)
            except Exception:
                pass
        # The state also arms graphs loaded from AOTAutograd's cache (they skip the inner
        # compile); the inner compile, also the lazy backward's, gets the same object.
        state = HookState(config=cfg)
        try:
            with no_aot_cache, active(state):
                install_post_compile_hook()
                return compile_fx(
                    gm,
                    example_inputs,
                    inner_compile=functools.partial(_inner_compile, _state=state),
                    config_patches=patches,
                )
        finally:
            state.armed.clear()  # the graphs hold their passes; the state outlives this call

    backend.__name__ = "torch_replay"
    return backend


def torch_replay_backend(gm: torch.fx.GraphModule, example_inputs: Any, **options: Any):
    """The ``torch_replay`` backend (entry point ``torch_dynamo_backends``)."""
    return make_backend()(gm, example_inputs, **options)


def register() -> None:
    """Register ``torch_replay`` with dynamo (idempotent: a second call changes nothing).

    Note [Backend registration]
    The backend is found two ways: ``import inductor_pass`` (which calls this) and the
    ``torch_dynamo_backends`` entry point (``pyproject.toml``), which dynamo loads
    itself when ``torch.compile(backend="torch_replay")`` names a backend it does not
    have yet (``lookup_backend`` in ``torch/_dynamo/backends/registry.py``): it reads
    the entry points into ``_BACKENDS`` (name -> ``EntryPoint``), loads ours (which
    imports this package, and so calls this function) and then registers what the load
    returned, asserting that the name is new. So when dynamo already holds our entry
    point, the registration is left to dynamo; otherwise (a checkout that is not
    installed, or an import before any backend lookup) this registers the backend, and
    ``_BACKENDS`` maps the name to ``None``.
    """
    try:
        from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
    except Exception:  # pragma: no cover - probed private API
        return
    if "torch_replay" not in _COMPILER_FNS and _BACKENDS.get("torch_replay") is None:
        register_backend(torch_replay_backend, name="torch_replay")
    # torch.compile(backend="inductor") imports Inductor's compile module when torch.compile
    # is called (torch/__init__.py, _TorchCompileInductorWrapper); a string or callable
    # backend would import it inside the first compile instead, and with it the
    # DeprecationWarnings torch.utils.mkldnn raises at import. Import it here, as Inductor does.
    with contextlib.suppress(Exception):
        import torch._inductor.compile_fx  # noqa: F401
