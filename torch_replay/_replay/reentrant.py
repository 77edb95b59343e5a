"""The reentrant path of ``torch_replay.checkpoint``: the C++ SegmentFunction
(csrc/aten/segment_function.h) and what it calls back."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._ext import require_extension
from .bindings import Bindings
from .call import SegmentCall
from .nonreentrant import no_unpack
from .segment import (
    autocast_state,
    device_type_of,
    named_errors,
    observer_of_segment,
    rng_devices_of,
)

# ------------------------------------------------------------- reentrant path


class _ReentrantRunner:
    """What the C++ SegmentFunction calls back (see csrc/aten/segment_function.h)."""

    def __init__(self, call: SegmentCall, args, txn):
        self.call = call
        self.function = call.function
        self.bindings: Bindings | None = None  # Note [Re-bound state]
        self.tensor_idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        # Tensor arguments travel as the Function's saved variables (freed as soon as
        # its backward ran); keeping them here would hold them for the whole graph.
        self.args = [None if isinstance(a, torch.Tensor) else a for a in args]
        self.txn = txn
        self.rng_devices = rng_devices_of(args, call.preserve_rng_state)
        self.autocast = autocast_state(device_type_of(args))
        self.observer = observer_of_segment()
        self.spec = None
        self.leaves: list[Any] = []
        self.tensor_pos: list[int] = []

    def _args(self, tensors):
        args = list(self.args)
        for i, t in zip(self.tensor_idx, tensors, strict=True):
            args[i] = t
        return args

    def _flat(self, out):
        if type(out) is torch.Tensor:  # the common case, without pytree's walk
            return [out], None, [out]
        leaves, spec = tree_flatten(out)
        return leaves, spec, [t for t in leaves if isinstance(t, torch.Tensor)]

    def forward(self, inputs):
        txn = self.txn
        args = self._args(inputs)
        txn.begin_forward(list(inputs), self.rng_devices)
        try:
            with named_errors(self.function, args), self.observer(txn):
                out = self.function(*args)
            txn.end_forward()
        except BaseException:
            txn.abort_forward()
            raise
        self.bindings = Bindings.of(self.call, txn)
        leaves, self.spec, tensors = self._flat(out)
        self.tensor_pos = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
        # Keep only the non-tensor leaves: holding the outputs here would keep them
        # alive as long as the graph.
        self.leaves = [None if isinstance(t, torch.Tensor) else t for t in leaves]
        return tensors

    def recompute(self, detached):
        txn = self.txn

        def pack(x):
            # Saved bytes that the re-run overwrites later, or that finish() puts
            # back to their live value, are copied: backward runs after both. Like
            # torch's own recomputation hook, keep detached values (a saved output
            # holding its own grad_fn would form a reference cycle).
            x = x.detach() if x.requires_grad else x
            return x.clone() if txn.overwritten_later(x) or txn.restores(x) else x

        # A pure segment needs no hook, and without one its re-run is torch's exactly.
        hooks = (
            torch.autograd.graph.saved_tensors_hooks(pack, no_unpack)
            if txn.stateful
            else contextlib.nullcontext()
        )
        args = self._args(detached)
        with named_errors(self.function, args):
            if self.bindings is not None:
                self.bindings.check(require_extension().storage_key)
            txn.begin_replay()
            with hooks, self.autocast(), self.observer(txn):
                out = self.function(*args)
            txn.verify_replay()
        return self._flat(out)[2]

    def finish(self):
        self.txn.finish_replay()

    def rebuild(self, tensors):
        if self.spec is None:  # a single tensor (see _flat)
            return tensors[0]
        leaves = list(self.leaves)
        for pos, t in zip(self.tensor_pos, tensors, strict=True):
            leaves[pos] = t
        return tree_unflatten(leaves, self.spec)


def checkpoint_reentrant(call: SegmentCall, args, txn):
    _tcp.check_backward_validity(args)
    runner = _ReentrantRunner(call, args, txn)
    inputs = [args[i] for i in runner.tensor_idx]
    outputs = require_extension().apply_segment(runner, inputs)
    return runner.rebuild(outputs)
