"""Run wrapper programs: build callables, profile effects and memory, measure peaks.

Note [Allocator guard]
On CPU the guard runs a program inside a counting window of the C++ counting
allocator (``csrc/aten/counting_allocator.h``, Note [Counting CPU
allocator]): every CPU allocation of the run is counted to the byte, so the
measured peak is exact and must equal the modelled one. The guard holds a
reference to every input for the whole run (inputs are never freed), runs
under ``torch.no_grad()`` from the same generator state, and restores the
generator state afterwards. On CUDA the caching allocator rounds and caches
blocks, so the CUDA guard only compares ``torch.cuda.max_memory_allocated``
of both programs (the permuted one is deployed when it is lower); it is
behind ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inductor_pass.units import declared_effects
from inductor_pass.wrapper_ast import StmtKind, Wrapper, render_region

__all__ = [
    "DynamicShapes",
    "counting_window",
    "build_call",
    "make_real_inputs",
    "needs_real_inputs",
    "copy_real_inputs",
    "EffectsProfile",
    "profile_effects",
    "profile_memory",
    "measure_cpu",
    "measure_cuda",
    "time_cuda",
    "bitwise_equal",
]

_PROBE = "torch_replay_probe_"


class DynamicShapes(ValueError):
    """The graph has symbolic sizes: a modelled peak holds for one size only."""


def _ext():
    from torch_replay._ext import require_extension

    return require_extension().inductor


@contextlib.contextmanager
def counting_window() -> Iterator[Callable[[], dict[str, int]]]:
    """Count CPU allocations to the byte while the block runs.

    Yields:
        A function returning the counters (``live``, ``peak``, ``allocated``,
        ``num_allocs``, ``num_frees``) relative to the start of the window.
    """
    ext = _ext()
    ext.counting_start()
    try:
        yield ext.counting_stats
    finally:
        ext.counting_stop()


def build_call(
    source: str,
    base_globals: dict[str, Any],
    *,
    partitions: Any = None,
    probe: Callable[..., None] | None = None,
    filename: str = "<torch_replay wrapper>",
) -> tuple[Callable[[list[Any]], Any], Any]:
    """Compile the ``call`` of a wrapper source against an already loaded module's globals.

    Only ``class Runner`` (or the module-level ``def call``) is executed, in a
    copy of ``base_globals``, so kernels are not compiled again and the
    loaded module (shared through Inductor's code cache) is not modified.

    Returns:
        ``(call, runner)``; ``runner`` is None for a module-level ``call``.
    """
    tree = ast.parse(source)
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runner"), None
    ) or next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "call")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")
    ns = dict(base_globals)
    if probe is not None:
        ns[_PROBE] = probe
    exec(code, ns)  # noqa: S102 - generated wrapper code, as Inductor itself does
    if isinstance(node, ast.ClassDef):
        runner = ns["Runner"](partitions=list(partitions or []))
        return runner.call, runner
    return ns["call"], None


def make_real_inputs(example_inputs: Sequence[Any], seed: int = 0) -> list[Any]:
    """Real tensors with the metadata of (fake) example inputs.

    Floating and complex tensors are filled from a seeded normal distribution,
    others with zeros (valid indices). Real tensors are cloned with their
    strides; non-tensor inputs are passed through.

    Raises:
        DynamicShapes: An input has symbolic sizes.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    with unset_fake_temporarily():
        for x in example_inputs:
            if not isinstance(x, torch.Tensor):
                if isinstance(x, torch.SymInt):
                    raise DynamicShapes("symbolic integer input")
                out.append(x)
                continue
            if any(not isinstance(s, int) for s in (*x.shape, *x.stride(), x.storage_offset())):
                raise DynamicShapes("symbolic tensor sizes")
            size, stride, off = tuple(x.shape), tuple(x.stride()), x.storage_offset()
            numel = off + sum((s - 1) * st for s, st in zip(size, stride, strict=True) if s > 0) + 1
            if any(s == 0 for s in size):
                numel = off
            base = torch.zeros(max(numel, 0), dtype=x.dtype)
            if x.dtype.is_floating_point or x.dtype.is_complex:
                base.copy_(torch.randn(base.shape, generator=gen, dtype=torch.float64))
            t = base.as_strided(size, stride, off).to(x.device)
            if x.device.type != "cpu":
                t = torch.empty_strided(size, stride, dtype=x.dtype, device=x.device).copy_(t)
            out.append(t.requires_grad_(False))
    return out


def needs_real_inputs(example_inputs: Sequence[Any]) -> bool:
    """Whether fabricated inputs could be invalid for the graph: an integer tensor input.

    Integer tensors are often indices (gathers, embeddings, Inductor's int8
    max-pool window offsets): fabricated values can index out of bounds, so
    such graphs are profiled on a copy of their first real inputs instead.
    """
    found = False
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return False  # dynamic shapes: left unchanged by the compile-time path
        if not isinstance(x, torch.Tensor):
            continue
        if any(not isinstance(s, int) for s in (*x.shape, *x.stride(), x.storage_offset())):
            return False
        if x.dtype != torch.bool and not (x.dtype.is_floating_point or x.dtype.is_complex):
            found = True
    return found


def copy_real_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Detached copies (same strides) of real inputs; non-tensors are passed through.

    Raises:
        DynamicShapes: An input is a symbolic integer.
    """
    if any(isinstance(x, torch.SymInt) for x in inputs):
        raise DynamicShapes("symbolic integer input")
    with torch.no_grad():
        return [x.detach() if isinstance(x, torch.Tensor) else x for x in _clone_inputs(inputs)]


def _clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            y.copy_(x)
            out.append(y)
        else:
            out.append(x)
    return out


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _bytes_view(st: torch.UntypedStorage) -> torch.Tensor:
    t = torch.empty(0, dtype=torch.uint8, device=st.device)
    return t.set_(st, 0, (st.nbytes(),), (1,))


@dataclass(kw_only=True, slots=True)
class EffectsProfile:
    """What one instrumented run recorded (see :func:`profile_effects`)."""

    name_storages: dict[str, frozenset[int]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    external: set[int] = field(default_factory=set)
    changed: dict[int, set[int]] = field(default_factory=dict)
    """Per unit statement: storages whose bytes changed while it ran."""
    problems: list[str] = field(default_factory=list)


def _bound_names_per_position(wrapper: Wrapper, order: list[int]) -> list[list[str]]:
    bound = list(wrapper.input_names)
    out = [list(bound)]
    for k in order:
        st = wrapper.region[k]
        bound = [n for n in bound if n not in st.deletes] + [
            n for n in st.defines if n not in bound
        ]
        out.append(list(bound))
    return out


def _global_tensor_names(wrapper: Wrapper, base_globals: dict[str, Any]) -> list[str]:
    defined = {n for st in wrapper.region for n in st.defines} | set(wrapper.input_names)
    names = []
    for st in wrapper.region:
        for n in st.uses:
            if n not in defined and isinstance(base_globals.get(n), torch.Tensor):
                if n not in names:
                    names.append(n)
    return names


def _probe_lines(names_per_pos: list[list[str]], extra: list[str]) -> dict[int, str]:
    return {
        p: f"{_PROBE}({p}, {{{', '.join(f'{n!r}: {n}' for n in [*names, *extra])}}})"
        for p, names in enumerate(names_per_pos)
    }


def _with_rng(fn: Callable[[], Any]) -> Any:
    cpu_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        return fn()
    finally:
        torch.random.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def profile_effects(
    wrapper: Wrapper,
    base_globals: dict[str, Any],
    inputs: Sequence[Any],
    *,
    partitions: Any = None,
    check_bytes: bool = True,
    resolve: Callable[[str], object] | None = None,
) -> EffectsProfile:
    """Run the original program once with a probe between statements.

    Records which storages every name refers to (storages are pinned for the
    run, so data pointers identify them), their sizes, and, with
    ``check_bytes``, which storages each unit changed (bytes compared before
    and after the unit), for the effect-completeness check.
    """
    order = list(range(len(wrapper.region)))
    per_pos = _bound_names_per_position(wrapper, order)
    gnames = _global_tensor_names(wrapper, base_globals)
    prof = EffectsProfile()
    pinned: dict[int, torch.UntypedStorage] = {}
    state: dict[str, Any] = {"snap": None, "prev": None}

    def keys_of(value: Any) -> frozenset[int]:
        ks = set()
        for t in _tensors(value):
            st = t.untyped_storage()
            if st.nbytes() == 0:
                continue
            k = st.data_ptr()
            pinned.setdefault(k, st)
            prof.sizes[k] = st.nbytes()
            ks.add(k)
        return frozenset(ks)

    def probe(pos: int, bound: dict[str, Any]) -> None:
        live_keys: set[int] = set()
        for n, v in bound.items():
            ks = keys_of(v)
            old = prof.name_storages.get(n)
            if old is not None and old != ks:
                prof.problems.append(f"name {n} changed storage during the run")
            prof.name_storages[n] = ks
            live_keys |= ks
        if pos == 0:
            prof.external |= live_keys
        if state["snap"] is not None:
            k_prev = state["prev"]
            changed = set()
            for key, before in state["snap"].items():
                if not torch.equal(_bytes_view(pinned[key]), before):
                    changed.add(key)
            prof.changed[k_prev] = changed
            state["snap"] = None
        if pos < len(order) and wrapper.region[order[pos]].kind is StmtKind.UNIT and check_bytes:
            state["snap"] = {k: _bytes_view(pinned[k]).clone() for k in live_keys}
            state["prev"] = order[pos]

    src = render_region(wrapper, order, probes=_probe_lines(per_pos, gnames))
    call, _ = build_call(src, base_globals, partitions=partitions, probe=probe)
    args = _clone_inputs(inputs)

    def run():
        with torch.no_grad():
            return call(list(args))

    out = _with_rng(run)
    # A name bound by a unit keeps the storages seen right after that unit.
    del out
    if check_bytes:
        for st in wrapper.region:
            if st.kind is not StmtKind.UNIT:
                continue
            written_names, barrier = declared_effects(st, wrapper, resolve)
            declared: set[int] = set()
            for n in [*written_names, *st.defines] if not barrier else [*st.uses, *st.defines]:
                declared |= prof.name_storages.get(n, frozenset())
            undeclared = prof.changed.get(st.index, set()) - declared
            if undeclared:
                prof.problems.append(
                    f"undeclared write by statement {st.index} ({st.callee}) to "
                    f"{len(undeclared)} storage(s)"
                )
    return prof


def profile_memory(
    wrapper: Wrapper, base_globals: dict[str, Any], inputs: Sequence[Any], *, partitions: Any = None
) -> tuple[list[int], list[int]]:
    """Run the original program in a counting window with a probe between statements.

    Returns:
        ``(transient, live_after)`` per region statement: the peak bytes
        above the live count while it ran, and the live bytes after it.
    """
    ext = _ext()
    n = len(wrapper.region)
    live: list[int] = [0] * (n + 1)
    peak: list[int] = [0] * (n + 1)

    def probe(pos: int) -> None:
        s = ext.counting_stats()
        live[pos] = s["live"]
        peak[pos] = s["peak"]
        ext.counting_reset_peak()

    src = render_region(wrapper, list(range(n)), probes={p: f"{_PROBE}({p})" for p in range(n + 1)})
    call, _ = build_call(src, base_globals, partitions=partitions, probe=probe)
    args = _clone_inputs(inputs)
    keep = list(args)

    def run():
        with torch.no_grad(), counting_window():
            out = call(list(args))
        return out

    out = _with_rng(run)
    del out, keep
    transient = [peak[p + 1] - live[p] for p in range(n)]
    return transient, live[1:]


def measure_cpu(
    call: Callable[[list[Any]], Any], inputs: Sequence[Any]
) -> tuple[int, list[Any], list[Any]]:
    """Measured peak bytes of one run (counting allocator), its outputs and final inputs.

    The inputs are cloned first (outside the window) and held for the run.
    """
    args = _clone_inputs(inputs)

    def run():
        with torch.no_grad(), counting_window() as stats:
            out = call(list(args))
            peak = stats()["peak"]
        return peak, out

    peak, out = _with_rng(run)
    return int(peak), _tensors(out), args


def measure_cuda(
    call: Callable[[list[Any]], Any], inputs: Sequence[Any]
) -> tuple[int, list[Any], list[Any]]:  # pragma: no cover - needs a GPU
    """Measured peak bytes on CUDA (``max_memory_allocated`` above the start)."""
    args = _clone_inputs(inputs)

    def run():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            out = call(list(args))
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    peak, out = _with_rng(run)
    return int(peak), _tensors(out), args


def time_cuda(call: Callable[[list[Any]], Any], inputs: Sequence[Any], *, reps: int = 3) -> Any:
    """Device time of one run on CUDA (``torch_replay.kernel_timing``: CUPTI when it can).

    Runs on clones of the inputs under ``torch.no_grad()`` from the same
    generator state (restored afterwards), like the peak measurement.

    Returns:
        A ``torch_replay.kernel_timing.KernelTiming``.
    """
    from torch_replay.kernel_timing import time_kernels

    args = _clone_inputs(inputs)

    def run():
        with torch.no_grad():
            return time_kernels(lambda: call(list(args)), device="cuda", reps=reps, warmup=0)

    return _with_rng(run)


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t
    view = _INT_VIEW.get(t.element_size())
    return t.view(view) if view is not None and t.dtype != view else t


def bitwise_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two lists of tensors have equal metadata and bit-identical values."""
    ta, tb = _tensors(list(a)), _tensors(list(b))
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype or x.stride() != y.stride():
            return False
        if x.device != y.device:
            return False
        if not torch.equal(_bits(x), _bits(y)):
            return False
    return True
