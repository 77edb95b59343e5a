"""The cases of the differential operator sweep, built from torch's OpInfo database.

A case is one sample of one operator (``torch.testing._internal.common_methods_invocations
.op_db``) at one dtype, in one of three kinds:

* ``read``: the segment reads a pre-existing tensor ``state`` (the sample's input)
  through the operator, ``y = x * s`` with ``s = reduce(op(state, *args))``; ``state`` is
  changed in place after the forward, before backward.
* ``inplace``: the segment writes ``state`` with the operator's in-place variant
  (BatchNorm-like), then reads it; the effect must happen once.
* ``out``: the segment writes a pre-existing buffer through ``out=``.

Every run starts from fresh copies of the sample's tensors (same values, strides, storage
offsets, and storages shared where the sample shares them), so the runs of a case are
independent. ``reduce`` maps any output to one float64 number that depends on every
element: a fixed positive weighting of the floating (or real and imaginary) parts, so
that a state change the operator does not average away shows in the gradient.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

__all__ = [
    "DTYPES",
    "UNINITIALIZED",
    "Case",
    "Sample",
    "change_state",
    "fresh_sample",
    "load_op_db",
    "make_cases",
    "op_id",
    "reduce_output",
]

# Samples taken per dtype: float64 is the reference dtype of OpInfo; float32 and
# bfloat16 add the dtype conversions (``float32 -> double`` is not a no-op).
DTYPES: dict[torch.dtype, int] = {torch.float64: 2, torch.float32: 1, torch.bfloat16: 1}
# Operators whose output is uninitialized memory: no reference value exists (two eager
# runs may agree by chance, as freed memory is often reused).
UNINITIALIZED = frozenset(
    ("empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided")
)


def load_op_db() -> list:
    """Torch's operator database (imports ``expecttest``; see requirements-dev.txt).

    Returns:
        The list of OpInfo entries."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def op_id(op) -> str:
    """``name`` or ``name.variant`` of an OpInfo entry (unique in op_db)."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@dataclass(kw_only=True, slots=True)
class Sample:
    """One run's tensors: ``state`` is the pre-existing tensor the segment reads or
    writes; ``call(x)`` is the segment's function; ``named`` holds every pre-existing
    tensor of the sample by name (their values after backward must equal eager's, and
    the observers' storage sets are mapped to these names)."""

    state: torch.Tensor
    call: Callable[[torch.Tensor], torch.Tensor]
    declared: list[torch.Tensor]
    named: dict[str, torch.Tensor]


@dataclass(kw_only=True, slots=True)
class Case:
    """One operator sample at one dtype, in one kind (``read``, ``inplace``, ``out``)."""

    op_id: str
    dtype: torch.dtype
    index: int
    kind: str
    sample: Any = field(repr=False)
    fn: Callable = field(repr=False)
    out_like: torch.Tensor | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.op_id}[{str(self.dtype).removeprefix('torch.')}#{self.index}:{self.kind}]"

    @property
    def strided_state(self) -> bool:
        """Whether ``state`` is a strided tensor (declaring a sparse one may be refused,
        by name: torch_replay preserves storages' bytes)."""
        state = _state_of(self.sample.input)
        return state is None or state.layout == torch.strided

    def make(self) -> Sample:
        """Fresh copies of the sample's tensors and the segment function over them."""
        return fresh_sample(self)


def _is_sparse(t: torch.Tensor) -> bool:
    return t.layout != torch.strided


def _copy_tensor(t: torch.Tensor, storages: dict) -> torch.Tensor:
    """A copy of ``t`` with the same values, sizes, strides and storage offset; tensors
    of the sample that share a storage get copies that share one (``storages``)."""
    if _is_sparse(t):
        return t.clone()
    if t.device.type == "meta":
        return t
    storage = t.untyped_storage()
    key = storage.data_ptr(), storage.nbytes()
    if key not in storages:
        storages[key] = storage.clone()
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    out.set_(storages[key], t.storage_offset(), t.size(), t.stride())
    return out


def _state_of(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def reduce_output(out) -> torch.Tensor:
    """One float64 number from every tensor of an operator's output: the sum of a fixed
    weighting (in [0.5, 1.5]) of each element's floating value (complex: real and
    imaginary parts; integer and bool: their value).

    Args:
        out: what the operator returned (a tensor, a nested tuple, or non-tensors).

    Returns:
        A 0-dim float64 tensor.

    Raises:
        ValueError: the output holds no tensor with elements."""
    total = None
    for leaf in tree_leaves(out):
        if not isinstance(leaf, torch.Tensor) or leaf.numel() == 0:
            continue
        if _is_sparse(leaf):
            leaf = leaf.to_dense()
        if leaf.is_complex():
            leaf = torch.view_as_real(leaf)
        v = leaf.to(torch.float64)
        n = v.numel()
        w = 1.0 + 0.5 * torch.sin(torch.arange(n, dtype=torch.float64) * 0.7 + 0.3)
        part = (v.reshape(-1) * w).sum()
        total = part if total is None else total + part
    if total is None:
        raise ValueError("the output holds no tensor with elements")
    return total


def change_state(t: torch.Tensor) -> None:
    """The in-place change made to ``state`` between the forward and backward: an affine
    map (not a shift, which softmax-like operators would not see)."""
    with torch.no_grad():
        target = t.values() if t.layout == torch.sparse_csr else t
        if t.layout == torch.sparse_coo:
            target = t._values()
        target.mul_(1.5).add_(0.25)


def fresh_sample(case: Case) -> Sample:
    """The tensors of one run of ``case`` (fresh copies) and its segment function.

    Args:
        case: the case.

    Returns:
        The run's Sample."""
    storages: dict = {}
    s = case.sample

    def copy(v):
        return _copy_tensor(v, storages) if isinstance(v, torch.Tensor) else v

    inp = tree_map(copy, s.input)
    args = tree_map(copy, tuple(s.args))
    kwargs = tree_map(copy, dict(s.kwargs))
    state = _state_of(inp)
    named: dict[str, torch.Tensor] = {"state": state}
    if isinstance(inp, (list, tuple)):
        for i, t in enumerate(inp[1:], 1):
            if isinstance(t, torch.Tensor):
                named[f"input{i}"] = t
    for i, a in enumerate(tree_leaves(args)):
        if isinstance(a, torch.Tensor):
            named[f"arg{i}"] = a
    for k, v in kwargs.items():
        for j, a in enumerate(tree_leaves(v)):
            if isinstance(a, torch.Tensor):
                named[f"{k}{j}"] = a
    fn = case.fn
    if case.kind == "out":
        out = torch.zeros_like(case.out_like)
        named["out"] = out
        declared = [state, out]

        def call(x):
            fn(inp, *args, out=out, **kwargs)
            return x * reduce_output(out)

    elif case.kind == "inplace":
        declared = [state]

        def call(x):
            fn(inp, *args, **kwargs)
            return x * reduce_output(state)

    else:
        declared = [state]

        def call(x):
            return x * reduce_output(fn(inp, *args, **kwargs))

    return Sample(state=state, call=call, declared=declared, named=named)


def _samples(op, dtype: torch.dtype, count: int) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = []
        for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
            state = _state_of(sample.input)
            if state is not None and state.numel() == 0:
                continue  # an empty state: nothing a state change could show
            out.append(sample)
            if len(out) == count:
                break
    return out


def make_cases(
    ops: list, *, only: set[str] | None = None, kinds: tuple[str, ...] = ("read", "inplace", "out")
) -> Iterator[tuple[Case | None, str, torch.dtype, str]]:
    """The cases of ``ops`` (OpInfo entries), with the reason for each sample skipped.

    Args:
        ops: OpInfo entries (``load_op_db()``).
        only: op ids to keep (all if None).
        kinds: which kinds to build.

    Yields:
        ``(case, op_id, dtype, reason)``: a case and "", or None and why the sample (or
        the whole op, dtype None) gives no case."""
    for op in ops:
        name = op_id(op)
        if only is not None and name not in only:
            continue
        if name in UNINITIALIZED:
            yield None, name, None, "the output is uninitialized memory"
            continue
        supported = op.supported_dtypes("cpu")
        dtypes = [d for d in DTYPES if d in supported]
        if not dtypes:
            yield None, name, None, "no float64, float32 or bfloat16 CPU samples"
            continue
        for dtype in dtypes:
            try:
                samples = _samples(op, dtype, DTYPES[dtype])
            except Exception as exc:  # noqa: BLE001 (the database's own failure)
                yield None, name, dtype, f"sample_inputs raises {type(exc).__name__}"
                continue
            if not samples:
                yield None, name, dtype, "no samples"
            for index, sample in enumerate(samples):
                state = _state_of(sample.input)
                if state is None or not (state.is_floating_point() or state.is_complex()):
                    yield None, name, dtype, "the input is not a floating tensor"
                    continue
                for kind in kinds:
                    fn, out_like = _variant(op, kind, sample)
                    if fn is None:
                        continue
                    case = Case(
                        op_id=name,
                        dtype=dtype,
                        index=index,
                        kind=kind,
                        sample=sample,
                        fn=fn,
                        out_like=out_like,
                    )
                    yield case, name, dtype, ""


def _variant(op, kind: str, sample) -> tuple[Callable | None, torch.Tensor | None]:
    """The function a case of ``kind`` calls, and for ``out`` the output to copy the
    shape of; (None, None) if the op has no such variant for the sample."""
    if kind == "read":
        return op.op, None
    if kind == "inplace":
        if op.inplace_variant is None or getattr(sample, "broadcasts_input", False):
            return None, None
        if not isinstance(sample.input, torch.Tensor) or _is_sparse(sample.input):
            return None, None
        return op.inplace_variant, None
    if kind == "out" and op.supports_out and isinstance(sample.input, torch.Tensor):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = op.op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 (eager fails: the read case reports it)
            return None, None
        if not isinstance(ref, torch.Tensor) or ref.layout != torch.strided:
            return None, None
        return op.op, ref.detach()
    return None, None
