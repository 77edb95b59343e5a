"""Operators the sweep adds to torch's OpInfo database: the reads of state that real models
make and op_db has no entry for (``Tensor.type_as``, ``Tensor.copy_``), or has only at the
tensor's own dtype (op_db's ``to`` samples convert to the dtype of the sample: a
``float32 -> float64`` conversion, ``self.inv_freq.to(x.dtype)``, is not among them).

Each is an object with the part of the OpInfo interface the sweep uses (``name``,
``variant_test_name``, ``supported_dtypes``, ``sample_inputs``, ``op``,
``inplace_variant``, ``supports_out``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.testing._internal.opinfo.core import SampleInput

__all__ = ["EXTRA_OPS", "ExtraOp"]

_FLOATS = (torch.float64, torch.float32, torch.bfloat16)


def _other(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.float64 else torch.float64


def _values(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (torch.linspace(-2.0, 3.0, n, dtype=torch.float64).reshape(shape)).to(dtype)


@dataclass(kw_only=True, slots=True)
class ExtraOp:
    """One operator of the sweep's own, with the OpInfo attributes the sweep reads."""

    name: str
    variant_test_name: str
    op: Callable
    inplace_variant: Callable | None
    make_args: Callable[[torch.dtype], tuple]
    supports_out: bool = False

    def supported_dtypes(self, device: str) -> tuple[torch.dtype, ...]:
        return _FLOATS

    def sample_inputs(self, device: str, dtype: torch.dtype, requires_grad: bool = False):
        yield from self._samples(dtype)

    def _samples(self, dtype: torch.dtype) -> Iterator[SampleInput]:
        base = _values((4, 6), dtype)
        yield SampleInput(base, args=self.make_args(dtype))
        # A non-contiguous view of a larger storage, at an offset.
        wide = _values((4, 13), dtype)
        yield SampleInput(wide[:, 1::2], args=self.make_args(dtype))


EXTRA_OPS: list[ExtraOp] = [
    ExtraOp(
        name="Tensor.type_as",
        variant_test_name="",
        op=lambda t, other: t.type_as(other),
        inplace_variant=None,
        make_args=lambda d: (torch.zeros(1, dtype=_other(d)),),
    ),
    ExtraOp(
        name="Tensor.to",
        variant_test_name="other_dtype",
        op=lambda t, dtype: t.to(dtype),
        inplace_variant=None,
        make_args=lambda d: (_other(d),),
    ),
    ExtraOp(
        name="Tensor.copy_",
        variant_test_name="",
        # read: the state copied into a new tensor of another dtype; in place: the
        # state overwritten from a pre-existing tensor of another dtype.
        op=lambda t, src: torch.empty(t.shape, dtype=src.dtype).copy_(t),
        inplace_variant=lambda t, src: t.copy_(src),
        make_args=lambda d: (_values((4, 6), _other(d)).flip(0) * 0.5,),
    ),
]
