"""The quick subset of the operator sweep, run by the default test command.

A fixed, representative list: every dtype conversion of op_db and the sweep's own
conversions (tests/op_sweep/extra.py), the composite reads that may or may not copy
(``contiguous``, ``reshape``, ``expand_as``, ``type_as``, ``clone``), in-place and
``out=`` variants (elementwise, indexing, batch norm's running statistics), storage-
changing writes (``resize_``), random operators, reductions, linear algebra, and sparse
CSR/COO reads. The whole database runs with ``TORCH_REPLAY_SLOW=1`` or
``python -m benchmarks.bench_op_sweep``.
"""

from __future__ import annotations

__all__ = ["QUICK_OPS"]

QUICK_OPS: tuple[str, ...] = (
    # dtype conversions and composite reads
    "to",
    "Tensor.to.other_dtype",
    "Tensor.type_as",
    "Tensor.copy_",
    "double",
    "float",
    "half",
    "bfloat16",
    "int",
    "long",
    "short",
    "bool",
    "byte",
    "char",
    "cdouble",
    "cfloat",
    "chalf",
    "contiguous",
    "reshape",
    "reshape_as",
    "view_as",
    "expand_as",
    "clone",
    "narrow_copy",
    # elementwise, with in-place and out= variants
    "add",
    "mul",
    "div.no_rounding_mode",
    "clamp",
    "exp",
    "sigmoid",
    "lerp",
    "addcmul",
    "masked_fill",
    "where",
    # indexing and scatter (in-place writes through indices)
    "index_select",
    "index_add",
    "index_put",
    "scatter_add",
    "gather",
    "select_scatter",
    "cat",
    # normalization: batch norm writes its running statistics
    "native_batch_norm",
    "nn.functional.batch_norm",
    "nn.functional.layer_norm",
    # reductions, sorting, linear algebra, convolution
    "sum",
    "var",
    "cumsum",
    "sort",
    "max.reduction_with_dim",
    "matmul",
    "addmm",
    "linalg.solve",
    "nn.functional.conv2d",
    "nn.functional.embedding",
    # random operators, storage-changing writes, fills
    "nn.functional.dropout",
    "bernoulli",
    "resize_",
    "resize_as_",
    "fill",
    "zero_",
    # sparse tensors
    "to_sparse",
    "sparse.mm.reduce",
    "sparse.sampled_addmm",
)
