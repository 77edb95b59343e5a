"""Run wrapper programs: build callables, profile effects and memory, measure peaks.

Note [Allocator guard]
On CPU the guard runs a program inside a counting window of the C++ counting
allocator (``csrc/aten/counting_allocator.h``, Note [Counting CPU
allocator]): every CPU allocation of the run is counted to the byte, so the
measured peak is exact and must equal the modelled one. Programs are called
as the runtime calls them (Note [Input ownership]): the guard holds the inputs
the runtime's caller holds, and an input the call owns is referenced only by
the list passed to ``call`` (which the wrapper clears); its copy is made
inside the window, so its bytes count from the start and its free at the
wrapper's ``del`` is seen. Runs are under ``torch.no_grad()`` from the same
generator state, which is restored afterwards.

Note [Input ownership]
Inductor's ``call(args)`` unpacks ``args`` and clears the list, so an input is
freed at the ``del`` after its last use unless someone else references it.
What holds it depends on the caller (torch 2.13,
``torch/_functorch/_aot_autograd/runtime_wrappers.py``): a forward or
inference graph's inputs are the user's inputs and the module's parameters
and buffers, held by the caller for the whole call; a backward graph gets
``[*saved_tensors, *grads]`` in a list built by ``_backward_prologue`` after
``ctx.maybe_clear_saved_tensors()`` (unless ``retain_graph``), so a saved
activation that is not also a parameter, an input or an output still held by
the user is referenced by that list only and dies at its last use; donated
buffers (``bw_donated_idxs``) are such activations that Inductor may even
reuse in place. Rather than predicting this from metadata, the pass looks at
the first real call (:func:`input_ownership`): an input is *owned* by the
call when the list is the only reference to its Python object, to its
TensorImpl and to its storage (the same test as ``cudagraph_trees``'s
storage liveness). Owned inputs are modelled as live from the start and freed
at their last ``del``; held inputs are never freed and never counted. The
peak of a call is then the bytes above what the caller holds, which is what a
user measures in a real step, less a constant. On CUDA the caching allocator rounds and caches
blocks, so the CUDA guard only compares ``torch.cuda.max_memory_allocated``
of both programs (the permuted one is deployed when it is lower); it is
behind ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = [
    "DynamicShapes",
    "counting_window",
    "build_call",
    "symbolic_inputs",
    "copy_real_inputs",
    "input_views",
    "input_ownership",
    "measure_cpu",
    "measure_cuda",
    "time_cuda",
    "bitwise_equal",
    "alias_pattern",
    "PROBE_PREFIX",
    "RuntimeArgs",
    "bytes_view",
    "clone_list",
    "extension",
    "is_opaque",
    "opaque_nbytes",
    "tensors_in",
    "with_rng",
]

PROBE_PREFIX = "torch_replay_probe_"
"""Prefix of the names the pass's probes bind in a wrapper module."""


class DynamicShapes(ValueError):
    """The graph has symbolic sizes: a modelled peak holds for one size only."""


def extension():
    """The compiled extension's ``inductor`` module (the counting allocator)."""
    from torch_replay._ext import require_extension

    return require_extension().inductor


@contextlib.contextmanager
def counting_window() -> Iterator[Callable[[], dict[str, int]]]:
    """Count CPU allocations to the byte while the block runs.

    Yields:
        A function returning the counters (``live``, ``peak``, ``allocated``,
        ``num_allocs``, ``num_frees``) relative to the start of the window.
    """
    ext = extension()
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
        ns[PROBE_PREFIX] = probe
    exec(code, ns)  # noqa: S102 - generated wrapper code, as Inductor itself does
    if isinstance(node, ast.ClassDef):
        runner = ns["Runner"](partitions=list(partitions or []))
        return runner.call, runner
    return ns["call"], None


def symbolic_inputs(example_inputs: Sequence[Any]) -> str:
    """Why the graph has symbolic sizes ("" when every size is static)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return "symbolic integer input"
        if isinstance(x, torch.Tensor) and any(
            not isinstance(s, int) for s in (*x.shape, *x.stride(), x.storage_offset())
        ):
            return "symbolic tensor sizes"
    return ""


def copy_real_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Detached copies (same strides) of real inputs; non-tensors are passed through.

    Raises:
        DynamicShapes: An input is a symbolic integer.
    """
    if any(isinstance(x, torch.SymInt) for x in inputs):
        raise DynamicShapes("symbolic integer input")
    with torch.no_grad():
        return [x.detach() if isinstance(x, torch.Tensor) else x for x in clone_list(inputs)]


def input_views(inputs: Sequence[Any]) -> list[Any]:
    """Detached views of real inputs (no copy); every run of the pass copies
    what it may write (Note [Unwritten inputs]).

    Raises:
        DynamicShapes: An input is a symbolic integer.
    """
    if any(isinstance(x, torch.SymInt) for x in inputs):
        raise DynamicShapes("symbolic integer input")
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]


def input_ownership(args: list[Any]) -> list[bool]:
    """Which inputs of a real call the call owns (see Note [Input ownership]).

    Call with the list the runtime passes to ``call``, before anything else
    references its elements. An input is owned when the list holds the only
    reference to its Python object and to its TensorImpl, and the storage is
    referenced only by TensorImpls of owned list elements.

    Returns:
        One flag per position (False for non-tensors).
    """
    import sys

    n = len(args)
    owned = [False] * n
    per_storage: dict[int, list[int]] = {}
    for i in range(n):
        x = args[i]
        # References: the list, ``x`` and getrefcount's argument.
        if isinstance(x, torch.Tensor) and sys.getrefcount(x) == 3 and x._use_count() == 1:
            owned[i] = True
        if isinstance(x, torch.Tensor):
            per_storage.setdefault(_storage_key(x), []).append(i)
        del x
    for positions in per_storage.values():
        if not all(owned[i] for i in positions):
            for i in positions:
                owned[i] = False
            continue
        st = args[positions[0]].untyped_storage()
        # The TensorImpls of these positions plus ``st`` itself.
        if torch._C._storage_Use_Count(st._cdata) != len(positions) + 1:
            for i in positions:
                owned[i] = False
        del st
    return owned


def _storage_key(x: torch.Tensor) -> int:
    st = x.untyped_storage()
    return st.data_ptr() if st.nbytes() else id(st) ^ (1 << 62)


def _clone_inputs(inputs: Sequence[Any], positions: Sequence[int] | None = None) -> dict[int, Any]:
    """Copies of ``inputs`` (the given positions; all by default) with the same
    strides, offsets and storage sharing: inputs that share a storage share
    one copy of the whole storage."""
    out: dict[int, Any] = {}
    copies: dict[int, torch.UntypedStorage] = {}
    for i in range(len(inputs)) if positions is None else positions:
        x = inputs[i]
        if not isinstance(x, torch.Tensor):
            out[i] = x
            continue
        src = x.untyped_storage()
        key = _storage_key(x)
        st = copies.get(key)
        if st is None:
            # torch.empty allocates through the current CPU allocator (the
            # counting one inside a window); UntypedStorage(n) does not.
            st = torch.empty(src.nbytes(), dtype=torch.uint8, device=x.device).untyped_storage()
            if src.nbytes():
                bytes_view(st).copy_(bytes_view(src))
            copies[key] = st
        y = torch.empty(0, dtype=x.dtype, device=x.device)
        y.set_(st, x.storage_offset(), x.shape, x.stride())
        out[i] = y
    return out


def clone_list(inputs: Sequence[Any]) -> list[Any]:
    """Copies of ``inputs`` as a list (aliasing among them kept)."""
    got = _clone_inputs(inputs)
    return [got[i] for i in range(len(inputs))]


def is_opaque(t: torch.Tensor) -> bool:
    """Whether ``t`` has no storage to read (an mkldnn tensor, a sparse one).

    Note [Opaque tensors]
    With ``torch._inductor.config.freezing`` on CPU, Inductor prepacks the
    weights of convolutions and linear layers into oneDNN's own layout: the
    wrapper's ``_frozen_param`` constants are then mkldnn tensors
    (``OpaqueTensorImpl``), whose ``untyped_storage()`` raises. The pass never
    reads them: the effect profile keys such a tensor by its TensorImpl instead
    of a storage, counts its bytes from its metadata (:func:`opaque_nbytes`),
    and does not hash it (its writes are those the operators' schemas declare;
    oneDNN's convolution and linear operators declare none). Such constants
    are held by the module for the whole call, so they are external storages
    that no order frees or counts; an opaque buffer the program itself made
    would be counted by the counting allocator, and a byte count that differs
    from the model's leaves the graph unchanged (the profile's check).
    """
    return t.layout != torch.strided


def opaque_nbytes(t: torch.Tensor) -> int:
    """The bytes of an opaque tensor's elements, from its metadata (nothing is read)."""
    return t.numel() * t.element_size()


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) list/tuple output, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def bytes_view(st: torch.UntypedStorage) -> torch.Tensor:
    """A ``uint8`` tensor over every byte of ``st``."""
    t = torch.empty(0, dtype=torch.uint8, device=st.device)
    return t.set_(st, 0, (st.nbytes(),), (1,))


def with_rng(fn: Callable[[], Any]) -> Any:
    """``fn()``, with the CPU and CUDA generators' states restored afterwards."""
    cpu_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        return fn()
    finally:
        torch.random.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


class RuntimeArgs:
    """Copies of the inputs, passed as the runtime passes them (Note [Input ownership]).

    Held inputs are copied at construction (outside any counting window) and
    referenced here for the run; :meth:`take` copies the owned ones (call it
    inside the window) and returns the list for ``call``, which is then the
    only reference to them.
    """

    def __init__(
        self,
        inputs: Sequence[Any],
        owned: Sequence[bool] | None,
        shared: Sequence[bool] | None = None,
    ) -> None:
        n = len(inputs)
        self.inputs = inputs
        self.owned = [bool(owned[i]) if owned is not None else False for i in range(n)]
        keep = [not self.owned[i] and shared is not None and bool(shared[i]) for i in range(n)]
        self.held = _clone_inputs(inputs, [i for i in range(n) if not (self.owned[i] or keep[i])])
        self.held.update({i: inputs[i] for i in range(n) if keep[i]})

    def take(self) -> list[Any]:
        own = _clone_inputs(self.inputs, [i for i, o in enumerate(self.owned) if o])
        lst = [own[i] if o else self.held[i] for i, o in enumerate(self.owned)]
        own.clear()
        return lst

    def final_held(self) -> list[Any]:
        """The held inputs after the run (owned ones may be gone)."""
        return [self.held[i] for i in sorted(self.held)]


def measure_cpu(
    call: Callable[[list[Any]], Any],
    inputs: Sequence[Any],
    *,
    owned: Sequence[bool] | None = None,
    shared: Sequence[bool] | None = None,
) -> tuple[int, list[Any], list[Any]]:
    """Measured peak bytes of one run (counting allocator), its outputs and final held inputs.

    Args:
        call: The program.
        inputs: Its inputs (copied, never modified).
        owned: Per input, whether the call owns it (Note [Input ownership]):
            owned inputs are copied inside the window and referenced only by
            the list passed to ``call``; None: every input is held.
        shared: Per input, whether it is passed as is instead of copied
            (Note [Unwritten inputs]); None: every input is copied.
    """
    args = RuntimeArgs(inputs, owned, shared)

    def run():
        with torch.no_grad(), counting_window() as stats:
            out = call(args.take())
            peak = stats()["peak"]
        return peak, out

    peak, out = with_rng(run)
    return int(peak), tensors_in(out), args.final_held()


def measure_cuda(
    call: Callable[[list[Any]], Any],
    inputs: Sequence[Any],
    *,
    owned: Sequence[bool] | None = None,
    shared: Sequence[bool] | None = None,
) -> tuple[int, list[Any], list[Any]]:  # pragma: no cover - needs a GPU
    """Measured peak bytes on CUDA (``max_memory_allocated`` above the start)."""
    args = RuntimeArgs(inputs, owned, shared)

    def run():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            out = call(args.take())
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    peak, out = with_rng(run)
    return int(peak), tensors_in(out), args.final_held()


def time_cuda(call: Callable[[list[Any]], Any], inputs: Sequence[Any], *, reps: int = 3) -> Any:
    """Device time of one run on CUDA (``torch_replay._planning.kernel_timing``: CUPTI when it can).

    Runs on clones of the inputs under ``torch.no_grad()`` from the same
    generator state (restored afterwards), like the peak measurement.

    Returns:
        A ``torch_replay._planning.kernel_timing.KernelTiming``.
    """
    from torch_replay._planning.kernel_timing import time_kernels

    args = _clone_inputs(inputs)

    def run():
        with torch.no_grad():
            return time_kernels(lambda: call(list(args)), device="cuda", reps=reps, warmup=0)

    return with_rng(run)


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t
    view = _INT_VIEW.get(t.element_size())
    return t.view(view) if view is not None and t.dtype != view else t


def alias_pattern(values: Sequence[Any]) -> list[int]:
    """Per tensor of ``values``: the index of the first tensor sharing its storage.

    Two programs whose outputs alias differently (one returns two views of a
    buffer, the other two buffers) are not interchangeable even with equal
    values: AOTAutograd's runtime relies on the aliasing it traced.
    """
    first: dict[int, int] = {}
    out = []
    for i, t in enumerate(tensors_in(list(values))):
        st = t.untyped_storage()
        key = st.data_ptr() if st.nbytes() else -1 - i
        out.append(first.setdefault(key, i))
    return out


def bitwise_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two lists of tensors have equal metadata and bit-identical values."""
    ta, tb = tensors_in(list(a)), tensors_in(list(b))
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
