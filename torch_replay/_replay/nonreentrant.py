"""The non-reentrant path of ``torch_replay.checkpoint``: saved-tensor hooks driving the
segment's C++ Transaction on re-run (as torch's ``_CheckpointFrame``)."""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.utils._pytree import tree_flatten

from .._ext import require_extension
from ..errors import ReplayError, RngMismatchError, UnsupportedReplayError
from .bindings import Bindings
from .call import SegmentCall
from .observe import new_gate
from .segment import (
    DEBUG_TIP,
    autocast_state,
    debug_on,
    device_context,
    device_type_of,
    early_stop_on,
    flat_leaves,
    graph_task_id,
    in_graph_exec_group,
    internal_hooks,
    named_errors,
    observer_of_segment,
    rng_devices_of,
)

# ---------------------------------------------------------- non-reentrant path


class _Handle:
    pass


class _Holder:
    __slots__ = ("handles", "__weakref__")

    def __init__(self) -> None:
        self.handles: dict[int, _Handle | None] = {}


class _StopRecompute(Exception):
    pass


# torch < 2.13 keeps a checkpoint's inputs through an autograd Function
# (_NoopSaveInputs.apply(dummy, kwargs, *args)) whose first saved tensor is a dummy,
# torch.empty((0,), requires_grad=True), so an outer hook packs that (0,) tensor before
# the inputs and unpacks it first at each re-run; 2.13 saves the inputs alone
# (_CheckpointFrame.save_inputs). Chosen from the installed torch (Note [Inputs through
# outer hooks]).
_PACKS_A_DUMMY_INPUT = not hasattr(_tcp._CheckpointFrame, "save_inputs")


class _Packed:
    """An input of the segment as an outer saved-tensor hook packed it."""

    __slots__ = ("packed", "requires_grad")

    def __init__(self, packed: Any, requires_grad: bool) -> None:
        self.packed = packed
        self.requires_grad = requires_grad

    def unpack(self, unpack_hook) -> torch.Tensor:
        t = unpack_hook(self.packed)
        if t.requires_grad != self.requires_grad:
            t = t.detach().requires_grad_(self.requires_grad)
        return t


class _Frame:
    """Saved-tensor bookkeeping of one non-reentrant segment (as torch's
    ``_CheckpointFrame``), driving the segment's C++ Transaction on replay.

    ``run`` re-runs the segment; ``child`` makes a fresh transaction over the same
    declared state, used when the segment's saved tensors are unpacked before its
    own forward has finished (it differentiates inside itself): that re-run starts
    from the state the forward started from (nothing stateful happened yet, or it
    is refused) and is rolled back by the child's abort, as if it never ran.
    """

    def __init__(self, txn, run, early_stop: bool, metadata_fn, child, gate):
        self.txn = txn
        self.run = run
        self.saved_args: list[Any] = []
        self.unpack_input = None
        self.packed_dummy: Any = None  # torch < 2.13's (0,) tensor, as an outer hook packed it
        self.child = child
        self.gate = gate
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.forward_completed = False
        self.bindings: Bindings | None = None  # Note [Re-bound state]
        self.ignore_saved_mismatch = False
        self.weak_holders: list[weakref.ReferenceType] = []
        self.metas: list[Any] = []
        self.recomputed: defaultdict[Any, weakref.WeakKeyDictionary] = defaultdict(
            weakref.WeakKeyDictionary
        )
        self.counter: defaultdict[Any, int] = defaultdict(int)
        self.done: defaultdict[Any, bool] = defaultdict(bool)

    # Note [Inputs through outer hooks]
    # As torch's _CheckpointFrame.save_inputs: the segment's positional tensor
    # arguments, kept for the re-run, are packed by the saved-tensor hooks that
    # surround the checkpoint (not the segment's own), so an outer hook
    # (torch.autograd.graph.save_on_cpu, offload_wrapper, HF's offload=True) sees
    # and packs exactly what it sees around torch's checkpoint, and the frame keeps
    # no other reference to them. The re-run unpacks them first, outside the
    # re-run's hooks and observer (torch's _checkpoint_hook.unpack_hook). Unlike
    # torch, which keeps them as autograd SavedTensors, the hooks are called
    # directly (under no_grad, as SavedVariable does): a SavedTensor's version
    # check would refuse an input that the segment writes in place or that is
    # declared state changed before backward, both of which the transaction
    # handles (it restores or names them). Without outer hooks the inputs are kept
    # as they are, which is what a hook-less SavedTensor does. An input the segment
    # writes in place is kept itself once the forward is over (keep_written_inputs):
    # the re-run must start from its forward-time bytes in its own storage, which the
    # transaction restores and verifies; the hook's copy is dropped (torch re-runs on
    # the copy; the gradient is the same). On torch < 2.13 the outer hook also packs
    # (first) and unpacks (first, at each re-run) the (0,) dummy tensor that torch's
    # input saver saves before the inputs (_PACKS_A_DUMMY_INPUT).

    def save_inputs(self, args) -> None:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if not hooks:
            self.saved_args = list(args)
            return
        pack, self.unpack_input = hooks
        with torch.no_grad():
            if _PACKS_A_DUMMY_INPUT:
                self.packed_dummy = pack(torch.empty((0,), requires_grad=True))
            self.saved_args = [
                _Packed(pack(a), a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in args
            ]

    def keep_written_inputs(self, args) -> None:
        """After the forward: an input the segment wrote in place is state the re-run
        restores and verifies in its own storage, so it is kept itself instead of the
        outer hook's copy (which the hook packed, as with torch)."""
        if self.unpack_input is None or not self.txn.has_writes:
            return
        for i, a in enumerate(args):
            if isinstance(self.saved_args[i], _Packed) and self.txn.overwritten_later(a):
                self.saved_args[i] = a

    def get_inputs(self) -> list[Any]:
        if self.packed_dummy is not None:
            self.unpack_input(self.packed_dummy)  # as torch < 2.13's ctx.saved_tensors
        return [
            a.unpack(self.unpack_input) if isinstance(a, _Packed) else a for a in self.saved_args
        ]

    def pack(self, x: torch.Tensor) -> _Holder:
        holder = _Holder()
        self.weak_holders.append(weakref.ref(holder))
        if self.metadata_fn is not None:
            with torch.no_grad():
                self.metas.append(self.metadata_fn(x))
        self.txn.record_saved(x)
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        gid = graph_task_id()
        if not self.done[gid]:
            if self.forward_completed:
                self.recompute(gid)
            else:
                self.recompute_in_forward(gid)
        if gid not in holder.handles:
            raise _tcp.CheckpointError(
                "torch.utils.checkpoint: a saved tensor was not recomputed "
                "(torch_replay: the re-run saved fewer tensors than the forward)."
            )
        if holder.handles[gid] is None:
            extra = ""
            if in_graph_exec_group():
                extra = (
                    "Performing two backward calls that overlap (i.e. require the same "
                    "saved activation in order to compute gradients) is not allowed while "
                    "under the torch.utils.checkpoint.GraphExecGroup context. "
                )
            raise _tcp.CheckpointError(
                "torch.utils.checkpoint: Unpack is being triggered for a tensor that was "
                f"already unpacked once. {extra}If you are calling ctx.saved_tensors in "
                "backward, make sure to do so only once. Otherwise please open an issue "
                "with details on your use case."
            )
        ret = self.recomputed[gid][holder.handles[gid]]
        holder.handles[gid] = None
        return ret

    def _recompute_pack(self, gid, txn, early_stop: bool):
        # (One call for the segment instead of one per saved tensor when the forward
        # wrote no pre-existing bytes, which is the common case.)
        overwrites = txn is not None and txn.has_writes

        def pack(x):
            x = x.detach() if x.requires_grad else x
            if overwrites and txn.overwritten_later(x):
                x = x.clone()  # the segment overwrites these bytes after saving them
            idx = self.counter[gid]
            self.counter[gid] += 1
            if idx >= len(self.weak_holders):
                if not self.forward_completed:
                    # Re-run from inside the forward, which has saved fewer so far.
                    self.ignore_saved_mismatch = True
                    return x
                _raise_rng_mismatch(txn)  # the likelier cause, when it is the cause
                raise _tcp.CheckpointError(
                    "torch.utils.checkpoint: trying to save more tensors during "
                    "recomputation than during the original forward pass.\n" + DEBUG_TIP
                )
            holder = self.weak_holders[idx]()
            if holder is not None:
                holder.handles[gid] = _Handle()
                self.recomputed[gid][holder.handles[gid]] = x
            if early_stop and self.counter[gid] == len(self.weak_holders):
                # Every saved tensor is recomputed. The re-run stops here only if its
                # state is already the forward's end state, a segment that touched
                # nothing included: its re-run may have drawn random numbers the
                # forward did not (Note [Early stop of a stateful re-run]); otherwise
                # it runs on and is verified at its end.
                if txn is None or _reproduced(txn):
                    raise _StopRecompute
            return x

        return pack

    def _rerun(self, gid, txn, observed, early_stop: bool, gate=None) -> bool:
        """Runs the segment again, saving what it saves for graph task ``gid``
        (``txn`` decides which saved bytes must be copied; ``observed`` is the
        transaction its operators are shown to). False if it stopped early."""
        args = self.get_inputs()  # Note [Inputs through outer hooks]
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(
                    self._recompute_pack(gid, txn, early_stop), no_unpack
                ),
                torch.enable_grad(),
            ):
                if gate is None:
                    self.run(args, observed)
                else:
                    self.run(args, observed, gate)
        except _StopRecompute:
            return False
        return True

    def recompute(self, gid) -> None:
        txn = self.txn
        if self.bindings is not None:
            self.bindings.check(require_extension().storage_key)
        txn.begin_replay()
        try:
            if self._rerun(gid, txn, txn, self.early_stop):
                txn.verify_replay()
            # Recomputed tensors that alias state about to be put back to its live
            # bytes must keep the replay's bytes.
            if txn.restores_any:
                store = self.recomputed[gid]
                for handle in list(store.keys()):
                    t = store[handle]
                    if txn.restores(t):
                        store[handle] = t.clone()
        finally:
            txn.finish_replay()
        self.done[gid] = True
        self._check_metadata(gid)

    def recompute_in_forward(self, gid) -> None:
        """Re-run the segment while its own forward is still running (it calls
        ``torch.autograd.grad`` on its own values)."""
        if self.txn.stateful:
            raise UnsupportedReplayError(
                "the checkpointed segment differentiates its own values after it "
                "touched state or drew random numbers: re-running it from the start "
                "in the middle of its forward would replay those effects. Move the "
                "inner torch.autograd.grad before the stateful part, split the segment "
                "there, or call the function without checkpoint."
            )
        child = self.child()
        child.begin_forward([], [])
        self.gate.paused = True
        try:
            self._rerun(gid, None, child, self.early_stop, new_gate())
        finally:
            self.gate.paused = False
            child.abort_forward()  # puts every byte and generator back
        self.done[gid] = True
        self._check_metadata(gid)

    def _check_metadata(self, gid) -> None:
        if self.metadata_fn is None or self.ignore_saved_mismatch:
            return
        if self.counter[gid] != len(self.weak_holders):
            raise _tcp.CheckpointError(
                "torch.utils.checkpoint: A different number of tensors was saved "
                "during the original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.weak_holders)}\n"
                f"Number of tensors saved during recomputation: {self.counter[gid]}.\n" + DEBUG_TIP
            )
        different = []
        for idx, wh in enumerate(self.weak_holders):
            holder = wh()
            if holder is None or holder.handles.get(gid) is None:
                continue
            got = self.metadata_fn(self.recomputed[gid][holder.handles[gid]])
            if got != self.metas[idx]:
                different.append(
                    f"tensor at position {idx}:\nsaved metadata: {self.metas[idx]}\n"
                    f"recomputed metadata: {got}\n"
                )
        if different:
            raise _tcp.CheckpointError(
                "torch.utils.checkpoint: Recomputed values for the following tensors "
                "have different metadata than during the forward pass.\n"
                f"{''.join(different)}.\n" + DEBUG_TIP
            )


class _InputNames:
    """The segment's tensor arguments by weak reference, for naming them in errors
    (``_naming._name_for_key`` iterates them) without keeping them alive (Note
    [Inputs through outer hooks])."""

    __slots__ = ("refs",)

    def __init__(self, args) -> None:
        self.refs = [weakref.ref(a) if isinstance(a, torch.Tensor) else None for a in args]

    def __iter__(self):
        return iter([r() if r is not None else None for r in self.refs])


def no_unpack(x):
    return x


# Note [Early stop of a stateful re-run]
# torch's non-reentrant checkpoint stops a re-run once every tensor the forward saved is
# recomputed (torch.utils.checkpoint.set_checkpoint_early_stop, on by default): what the
# segment computes after that reaches no gradient. A stateful segment (it touched state
# or drew random numbers) must prove its re-run reproduced the forward, P(B0, R0) =
# (B_T, R_T) (Note [Replay protocol] in csrc/aten/transaction.h). It stops at that
# point too when the proof already holds there: every byte the forward wrote holds its
# end value and every generator is at the forward's end position, so the re-run's
# prefix (all that the saved tensors come from) reproduced the whole forward's effect
# on state, and what the suffix would do is what the forward's suffix did: nothing more
# (a deterministic suffix that drew or wrote would have moved the forward past these
# values). When the proof does not hold yet (the suffix writes running statistics,
# draws a dropout mask after the last saved tensor), the re-run goes on to the end and
# is verified there, as before. The gradient is the same either way; the proof is
# checked at both points by the same verify_replay.
# A segment that touched no state and drew nothing in its forward is proved the same
# way: its re-run may still draw (a Dropout in eval mode during the forward, in train
# mode at backward), and then saved tensors of the same shapes come from other
# operators. Stopping unverified gave a silently wrong gradient; verified, the re-run
# goes on and ends in RngMismatchError (tests/test_rng_paths.py).


def _raise_rng_mismatch(txn) -> None:
    """Raises the re-run's RngMismatchError if a generator has already left the
    forward's path (a re-run that draws where the forward did not saves other tensors)."""
    if txn is None:
        return
    try:
        txn.verify_replay()
    except RngMismatchError:
        raise
    except ReplayError:
        pass


def _reproduced(txn) -> bool:
    """Whether the re-run in progress already reproduced the forward's end state."""
    try:
        txn.verify_replay()
    except ReplayError:
        return False
    return True


def checkpoint_nonreentrant(call: SegmentCall, args, kwargs, txn, child):
    """Runs the segment's forward under its saved-tensor hooks; ``child`` makes a fresh
    transaction over the same state (see :class:`_Frame`)."""
    function, context_fn, preserve = call.function, call.context_fn, call.preserve_rng_state
    unpack_error_cb = None
    if debug_on(call.debug):
        if context_fn is not _tcp.noop_context_fn:
            raise ValueError("debug=True is incompatible with non-default context_fn")
        context_fn, unpack_error_cb = _tcp._get_debug_context_and_cb()
    device_type = device_type_of(args)
    forward_ctx, recompute_ctx = context_fn()
    if isinstance(forward_ctx, _tcp._CachingTorchDispatchMode):
        # Whether selective checkpointing's saved tensors go through the user's
        # saved_tensors_hooks (torch 2.14's option, set on its mode as torch sets it).
        forward_ctx.respect_saved_tensors_hooks = call.respect_saved_tensors_hooks
    autocast = autocast_state(device_type)
    device_ctx = device_context()
    gate = new_gate()
    observer = observer_of_segment()

    def run(inputs, t, g=gate):
        # The observer sits below the user's modes (context_fn): selective
        # checkpointing's caching modes expect to be the current mode, and the
        # observer should see what really runs.
        with autocast(), device_ctx, observer(t, g), recompute_ctx:
            function(*inputs, **kwargs)

    frame = _Frame(txn, run, early_stop_on(call.early_stop), call.metadata_fn, child, gate)
    names = _InputNames(args)  # names arguments in errors without holding them

    def unpack(holder):
        with named_errors(function, names, kwargs):
            if unpack_error_cb is None:
                return frame.unpack(holder)
            try:
                return frame.unpack(holder)
            except _tcp.CheckpointError as e:
                unpack_error_cb(e)

    leaves = flat_leaves(args) + (tree_flatten(kwargs)[0] if kwargs else [])
    tensor_args = [a for a in leaves if isinstance(a, torch.Tensor)]
    rng_devices = rng_devices_of(args, preserve)
    frame.save_inputs(args)  # under the outer hooks only (Note [Inputs through outer hooks])
    txn.begin_forward(tensor_args, rng_devices)
    del tensor_args, leaves
    suppressed = False
    try:
        with (
            internal_hooks(frame.pack, unpack),
            observer(txn, gate),
            forward_ctx,
        ):
            try:
                out = function(*args, **kwargs)
            except BaseException:
                suppressed = True
                raise
        if suppressed:
            raise RuntimeError(
                "torch.utils.checkpoint: the forward context provided by "
                "context_fn suppressed an exception raised during the "
                "checkpointed forward. This is not supported because checkpoint "
                "cannot return a value for a failed forward."
            )
        txn.end_forward()
    except BaseException:
        txn.abort_forward()
        raise
    frame.bindings = Bindings.of(call, txn)  # Note [Re-bound state]
    frame.keep_written_inputs(args)
    frame.forward_completed = True
    return out
