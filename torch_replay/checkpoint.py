"""Replay-safe activation checkpointing: a drop-in for ``torch.utils.checkpoint``.

The re-run of a segment sees exactly the state its forward saw. Declared state
(``state=``) is preserved by a preservation engine written in C++ (whole snapshot,
region journal, read-set, or guard); undeclared state is checked; the replay is
verified byte for byte (``P(B0, R0) = (B_T, R_T)``) and is invisible afterwards.
See Note [Replay protocol] in ``csrc/aten/transaction.h`` for the protocol and
``README.md`` ("What is detected") for what is and is not caught.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import sys
import uuid
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import fsdp as _fsdp
from ._ext import require_extension
from ._observe import DispatchModeObserver, Observer, new_gate
from .compiled import checkpoint_compiled, constant_under_compile
from .errors import ReplayError, UnsupportedReplayError

__all__ = [
    "ENGINES",
    "ReplayConfig",
    "checkpoint",
    "checkpoint_sequential",
    "config",
    "engine_bytes",
    "last_transaction",
]

from ._ext import C as _C_ext  # noqa: E402

# The engine names, defined once in C++ (csrc/core/preservation_engine.cpp).
ENGINES: tuple[str, ...] = (
    tuple(_C_ext.engine_names())
    if _C_ext is not None
    else ("auto", "snapshot", "journal", "readset", "guard")  # unbuilt: for the error only
)


@dataclass(kw_only=True, slots=True)
class ReplayConfig:
    """Process-wide settings of ``torch_replay.checkpoint``."""

    detect: str = "reads"
    """What undeclared state is checked (by version counters) before a re-run.
    ``"reads"`` (default): every tensor that existed before the segment and that it
    read (parameters, buffers, inputs, captured tensors), plus what it saved for
    backward; one weak reference and one integer per tensor. ``"saved"``: only the
    tensors the forward saved for backward (what eager autograd checks).
    ``use_reentrant=True`` always uses ``"reads"``, since its forward saves nothing.
    ``"preserve"``: instead of checking, preserve every such tensor the segment
    read: a later in-place write to it (outside segments too) first journals the
    old bytes of what it overwrites, so the re-run sees the forward's values
    without ``state=`` (copy-on-write, as ``engine="journal"`` for declared
    state). Writes that bypass the dispatcher (the memory of ``.numpy()``, raw
    pointers) are still detected, by hashes, and raise ``StateMutationError``.
    While such a segment waits for its backward, every operator of the process
    pays the write watch (benchmarks/results/observer.md gives its cost).
    Inside ``torch.compile``, ``"preserve"`` treats a module segment's buffers as
    declared (Note [Checkpoint under torch.compile] in compiled.py); the other
    levels leave undeclared tensors to autograd's version check there."""

    observer: str = os.environ.get("TORCH_REPLAY_OBSERVER", "c++")
    """How the operators of a segment are observed (Note [C++ observer]): ``"c++"``
    (a thread-local RecordFunction callback of the dispatcher, about 1 µs per
    operator) or ``"python"`` (a TorchDispatchMode, about 10 µs per operator; the
    reference implementation)."""

    observe: bool = True
    """Run the forward and the re-run under the observer (needed for declared
    state, explicit generators, undeclared writes, overlap and integer-write
    checks). Turning it off makes a segment with ``state=None`` behave like
    ``torch.utils.checkpoint`` plus the saved-tensor check."""


config = ReplayConfig()
_DETECT_LEVELS = ("saved", "reads", "preserve")
_last_txn: weakref.ReferenceType | None = None


def engine_bytes() -> int:
    """Bytes the preservation engines hold in C++ right now, process-wide: the saved
    regions of every live transaction (snapshots, read-sets, first-touch bytes, a
    re-run's live copy) and the region journal. Allocator statistics and live-tensor
    counts do not include them; add this figure to report a step's real memory."""
    C = require_extension()
    return int(C.region_store_bytes()) + int(C.journal_bytes())


_transaction_sink: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torch_replay_transaction_sink", default=None
)


@contextlib.contextmanager
def collect_transactions():
    """Hands the C++ Transactions of the checkpoint calls made inside the ``with``
    block (in this thread or task) to the caller, in call order: how
    :class:`~torch_replay.PlannedSequential` gets each segment's transaction
    without the process-wide :func:`last_transaction`.

    Yields:
        The list they are appended to."""
    sink: list = []
    token = _transaction_sink.set(sink)
    try:
        yield sink
    finally:
        _transaction_sink.reset(token)


def last_transaction():
    """The C++ Transaction of the most recent checkpoint call (for tests and
    benchmarks: ``engine``, ``retained_bytes``, ``replay_transient_bytes``), or None."""
    return _last_txn() if _last_txn is not None else None


# ---------------------------------------------------------------------- state


def _module_of(function) -> torch.nn.Module | None:
    if isinstance(function, torch.nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


def _collect_state(state, function):
    """Flatten ``state`` into (tensors, names, generators, generator names)."""
    tensors: list[torch.Tensor] = []
    names: list[str] = []
    gens: list[torch.Generator] = []
    gen_names: list[str] = []
    if state is None:
        return tensors, names, gens, gen_names
    if isinstance(state, (torch.Tensor, torch.nn.Module, torch.Generator)):
        state = [state]
    if not isinstance(state, Iterable):
        raise TypeError(
            "state= must be an iterable of tensors, nn.Modules and torch.Generators; "
            f"got {type(state).__name__}"
        )
    root = _module_of(function)
    paths = {id(m): p for p, m in root.named_modules()} if root is not None else {}
    for i, item in enumerate(state):
        if isinstance(item, torch.nn.Module):
            prefix = paths.get(id(item), type(item).__name__)
            prefix = prefix or type(item).__name__
            # FSDP2 / DTensor state is preserved by its local shard (Note [FSDP traffic]).
            owner = _fsdp.owners(item)
            for n, b in item.named_buffers():
                if b is not None:
                    local = _fsdp.local_state(b, owner)
                    tensors.append(local)
                    names.append(f"{prefix}.{n} (buffer{_shard_word(local, b)})")
            for n, p in item.named_parameters():
                local = _fsdp.local_state(p, owner)
                tensors.append(local)
                names.append(f"{prefix}.{n} (parameter{_shard_word(local, p)})")
        elif isinstance(item, torch.Tensor):
            local = _fsdp.local_state(item)
            tensors.append(local)
            names.append((_tensor_name(item, root) or f"state[{i}]") + _shard_word(local, item))
        elif isinstance(item, torch.Generator):
            gens.append(item)
            gen_names.append(f"state[{i}] (torch.Generator on {item.device})")
        else:
            raise TypeError(
                f"state[{i}] is a {type(item).__name__}; state= takes tensors, "
                "nn.Modules (their buffers and parameters) and torch.Generators only"
            )
    return tensors, names, gens, gen_names


def _shard_word(local: torch.Tensor, declared: torch.Tensor) -> str:
    return ", local shard" if local is not declared else ""


def _tensor_name(t: torch.Tensor, root: torch.nn.Module | None) -> str | None:
    if root is None:
        return None
    for n, b in root.named_buffers():
        if b is t:
            return f"{n} (buffer)"
    for n, p in root.named_parameters():
        if p is t:
            return f"{n} (parameter)"
    return None


def _name_for_key(key: int, function, args) -> str | None:
    """Module path and buffer name (or argument position) of a storage key."""
    C = require_extension()
    root = _module_of(function)
    if root is not None:
        for n, b in root.named_buffers():
            if b is not None and C.storage_key(b) == key:
                return f"buffer '{n}' of {type(root).__name__}"
        for n, p in root.named_parameters():
            if C.storage_key(p) == key:
                return f"parameter '{n}' of {type(root).__name__}"
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.layout == torch.strided and C.storage_key(a) == key:
            return f"argument {i} of the segment"
    return None


def _enrich(exc: ReplayError, function, args) -> ReplayError:
    key = getattr(exc, "storage_key", 0)
    if not key:
        return exc
    name = _name_for_key(key, function, args)
    if name is None or name in str(exc):
        return exc
    new = type(exc)(f"{exc} [tensor: {name}]")
    new.storage_key = key
    return new


@contextlib.contextmanager
def _named_errors(function, args):
    try:
        yield
    except ReplayError as exc:
        new = _enrich(exc, function, args)
        if new is exc:
            raise
        raise new from None


# -------------------------------------------------------------------- helpers


def _leaves(tree) -> list[Any]:
    """Leaves of ``tree``; a flat tuple/list of tensors and numbers needs no pytree."""
    if isinstance(tree, (tuple, list)) and all(
        isinstance(a, (torch.Tensor, int, float, bool, str, type(None))) for a in tree
    ):
        return list(tree)
    return tree_flatten(tree)[0]


def _rng_devices(args, preserve: bool) -> list[torch.device]:
    """Non-CPU devices whose default generator torch would stash (devices of the
    tensor arguments, when that device type is initialised)."""
    if not preserve:
        return []
    out: list[torch.device] = []
    for a in _leaves(args):
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            mod = getattr(torch, a.device.type, None)
            if getattr(mod, "_initialized", False) and a.device not in out:
                out.append(a.device)
    return out


def _autocast_state(device_type: str):
    device_kwargs, cpu_kwargs = _tcp._get_autocast_kwargs(device_type)

    def ctx():
        stack = contextlib.ExitStack()
        if torch.amp.is_autocast_available(device_type):
            stack.enter_context(torch.amp.autocast(device_type=device_type, **device_kwargs))
        stack.enter_context(torch.amp.autocast("cpu", **cpu_kwargs))
        return stack

    return ctx


def _observer(txn, gate=None):
    if not config.observe:
        return contextlib.nullcontext()
    if config.observer == "python":
        return DispatchModeObserver(txn, gate)
    return Observer(txn, gate)


def _new_transaction(state, function, engine, preserve_rng_state, watch_reads, last=True):
    C = require_extension()
    tensors, names, gens, gen_names = _collect_state(state, function)
    txn = C.Transaction(
        engine,
        tensors,
        names,
        gens,
        gen_names,
        preserve_rng_state,
        watch_reads,
        preserve_reads=config.detect == "preserve" and config.observe,
    )
    if last:
        global _last_txn
        _last_txn = weakref.ref(txn)
        sink = _transaction_sink.get()
        if sink is not None:
            sink.append(txn)
    return txn


def _metadata(x: torch.Tensor) -> dict[str, Any]:
    return {"shape": x.shape, "dtype": x.dtype, "device": x.device}


# ------------------------------------------------------- torch's words and knobs
# Note [Drop-in fidelity]
# Where torch.utils.checkpoint is right, torch_replay behaves the same: the same
# signature and defaults, the same warnings, torch's global knobs
# (set_checkpoint_early_stop, set_checkpoint_debug_enabled, GraphExecGroup) and
# torch's error texts as the start of ours, so code that matches on them keeps
# working. PyTorch's own checkpoint tests are run with torch_replay swapped in
# (scripts/torch_checkpoint_tests.py).

_DEBUG_TIP = getattr(_tcp, "_debug_tip_msg", "")
_USE_REENTRANT_WARNING = (
    "torch.utils.checkpoint: the use_reentrant parameter should be "
    "passed explicitly. Starting in PyTorch 2.9, calling checkpoint "
    "without use_reentrant will raise an exception. use_reentrant=False is "
    "recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants."
)
_USE_REENTRANT_WARNING_SEQUENTIAL = (
    "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant "
    "parameter should be passed explicitly. "
    "In version 2.9 we will raise an exception if use_reentrant "
    "is not passed. use_reentrant=False is "
    "recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants."
)


def _early_stop(local: bool) -> bool:
    knob = getattr(_tcp, "_enable_checkpoint_early_stop", None)
    return bool(knob if knob is not None else local)


def _debug(local: bool) -> bool:
    knob = getattr(_tcp, "_checkpoint_debug_enabled", None)
    return bool(knob if knob is not None else local)


def _graph_task_id():
    group = getattr(_tcp, "GraphExecGroup", None)
    gid = group._get_current_group() if group is not None else None
    if gid is None:
        gid = torch._C._current_graph_task_id()
        if gid == -1:
            # Unpacked outside of a backward call: a fresh id.
            gid = int(uuid.uuid4())
    return gid


def _in_graph_exec_group() -> bool:
    get = getattr(torch._C, "_get_graph_exec_group", None)
    return get is not None and get() is not None


# -------------------------------------------------- torch_replay's own options
# Note [Option spelling]
# torch_replay adds two keywords to torch's signature, state= and engine=.
# A keyword is never swallowed: when the checkpointed function itself takes a
# parameter of that name, the keyword goes to the function (as torch would
# pass it) and torch_replay's option is spelled replay_state= / replay_engine=
# (those spellings always mean torch_replay's). When it cannot tell (the
# function takes **kwargs, or has no inspectable signature), it refuses before
# running anything and names both spellings.

_OPTIONS = (("state", "replay_state", None), ("engine", "replay_engine", "auto"))


@constant_under_compile
def _takes_keyword(function, name: str) -> bool | None:
    """True if ``function`` has a parameter ``name`` that can be passed by
    keyword, False if it certainly does not, None if it cannot tell."""
    target = function.forward if isinstance(function, torch.nn.Module) else function
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    var_keyword = False
    for p in sig.parameters.values():
        if p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return True
        var_keyword |= p.kind == p.VAR_KEYWORD
    return None if var_keyword else False


def _replay_options(function, kwargs: dict[str, Any]) -> tuple[Any, str]:
    """Pops torch_replay's options out of ``kwargs`` and returns ``(state, engine)``
    (Note [Option spelling]); keywords of the function stay in ``kwargs``."""
    values = []
    for plain, spelled, default in _OPTIONS:
        explicit = spelled in kwargs
        value = kwargs.pop(spelled, default)
        if plain in kwargs and not explicit:
            takes = _takes_keyword(function, plain)
            if takes is False:
                value = kwargs.pop(plain)
            elif takes is None:
                name = getattr(function, "__qualname__", None) or type(function).__name__
                raise TypeError(
                    f"torch_replay.checkpoint: {plain}= is ambiguous: the checkpointed "
                    f"function {name} accepts arbitrary keyword arguments (or has no "
                    f"inspectable signature), so torch.utils.checkpoint would pass "
                    f"{plain}= to it. Write {spelled}=... for torch_replay's option; "
                    f"{plain}= passed together with {spelled}= goes to the function. "
                    "Nothing was run."
                )
        values.append(value)
    return values[0], values[1]


# ---------------------------------------------------------- non-reentrant path


class _Handle:
    pass


class _Holder:
    __slots__ = ("handles", "__weakref__")

    def __init__(self) -> None:
        self.handles: dict[int, _Handle | None] = {}


class _StopRecompute(Exception):
    pass


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
        self.child = child
        self.gate = gate
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.forward_completed = False
        self.ignore_saved_mismatch = False
        self.weak_holders: list[weakref.ReferenceType] = []
        self.metas: list[Any] = []
        self.recomputed: defaultdict[Any, weakref.WeakKeyDictionary] = defaultdict(
            weakref.WeakKeyDictionary
        )
        self.counter: defaultdict[Any, int] = defaultdict(int)
        self.done: defaultdict[Any, bool] = defaultdict(bool)

    def pack(self, x: torch.Tensor) -> _Holder:
        holder = _Holder()
        self.weak_holders.append(weakref.ref(holder))
        if self.metadata_fn is not None:
            with torch.no_grad():
                self.metas.append(self.metadata_fn(x))
        self.txn.record_saved(x)
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        gid = _graph_task_id()
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
            if _in_graph_exec_group():
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
        def pack(x):
            x = x.detach() if x.requires_grad else x
            if txn is not None and txn.overwritten_later(x):
                x = x.clone()  # the segment overwrites these bytes after saving them
            idx = self.counter[gid]
            self.counter[gid] += 1
            if idx >= len(self.weak_holders):
                if not self.forward_completed:
                    # Re-run from inside the forward, which has saved fewer so far.
                    self.ignore_saved_mismatch = True
                    return x
                raise _tcp.CheckpointError(
                    "torch.utils.checkpoint: trying to save more tensors during "
                    "recomputation than during the original forward pass.\n" + _DEBUG_TIP
                )
            holder = self.weak_holders[idx]()
            if holder is not None:
                holder.handles[gid] = _Handle()
                self.recomputed[gid][holder.handles[gid]] = x
            if early_stop and self.counter[gid] == len(self.weak_holders):
                raise _StopRecompute
            return x

        return pack

    def _rerun(self, gid, txn, observed, early_stop: bool, gate=None) -> bool:
        """Runs the segment again, saving what it saves for graph task ``gid``
        (``txn`` decides which saved bytes must be copied; ``observed`` is the
        transaction its operators are shown to). False if it stopped early."""
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(
                    self._recompute_pack(gid, txn, early_stop), _no_unpack
                ),
                torch.enable_grad(),
            ):
                if gate is None:
                    self.run(observed)
                else:
                    self.run(observed, gate)
        except _StopRecompute:
            return False
        return True

    def recompute(self, gid) -> None:
        txn = self.txn
        # A stateful segment runs to the end so that its end state is verified.
        early_stop = self.early_stop and not txn.stateful
        txn.begin_replay()
        try:
            if self._rerun(gid, txn, txn, early_stop):
                txn.verify_replay()
            # Recomputed tensors that alias state about to be put back to its live
            # bytes must keep the replay's bytes.
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
                f"Number of tensors saved during recomputation: {self.counter[gid]}.\n" + _DEBUG_TIP
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
                f"{''.join(different)}.\n" + _DEBUG_TIP
            )


def _no_unpack(x):
    return x


def _metadata_fn(determinism_check: str):
    checks = getattr(_tcp, "_allowed_determinism_checks_to_fns", None)
    if checks is None:
        checks = {"default": _metadata, "none": lambda _: None}
    if determinism_check not in checks:
        raise ValueError(
            f"determinism_check should be one of {list(checks.keys())}, but got {determinism_check}"
        )
    return checks[determinism_check]


def _device_context():
    """The DeviceContext mode the forward runs under (the re-run respects it)."""
    return next(
        (m for m in reversed(_get_current_function_mode_stack()) if isinstance(m, DeviceContext)),
        contextlib.nullcontext(),
    )


def _checkpoint_nonreentrant(
    function, args, kwargs, txn, child, preserve, context_fn, metadata_fn, debug, early_stop
):
    unpack_error_cb = None
    if _debug(debug):
        if context_fn is not _tcp.noop_context_fn:
            raise ValueError("debug=True is incompatible with non-default context_fn")
        context_fn, unpack_error_cb = _tcp._get_debug_context_and_cb()
    device_type = _tcp._infer_device_type(*args)
    forward_ctx, recompute_ctx = context_fn()
    autocast = _autocast_state(device_type)
    device_ctx = _device_context()
    gate = new_gate()

    def run(t, g=gate):
        # The observer sits below the user's modes (context_fn): selective
        # checkpointing's caching modes expect to be the current mode, and the
        # observer should see what really runs.
        with autocast(), device_ctx, _observer(t, g), recompute_ctx:
            function(*args, **kwargs)

    frame = _Frame(txn, run, _early_stop(early_stop), metadata_fn, child, gate)

    def unpack(holder):
        with _named_errors(function, args):
            if unpack_error_cb is None:
                return frame.unpack(holder)
            try:
                return frame.unpack(holder)
            except _tcp.CheckpointError as e:
                unpack_error_cb(e)

    leaves = _leaves(args) + (tree_flatten(kwargs)[0] if kwargs else [])
    tensor_args = [a for a in leaves if isinstance(a, torch.Tensor)]
    txn.begin_forward(tensor_args, _rng_devices(args, preserve))
    suppressed = False
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(frame.pack, unpack),
            _observer(txn, gate),
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
    frame.forward_completed = True
    return out


# ------------------------------------------------------------- reentrant path


class _ReentrantRunner:
    """What the C++ SegmentFunction calls back (see csrc/aten/segment_function.h)."""

    def __init__(self, function, args, txn, preserve):
        self.function = function
        self.tensor_idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        # Tensor arguments travel as the Function's saved variables (freed as soon as
        # its backward ran); keeping them here would hold them for the whole graph.
        self.args = [None if isinstance(a, torch.Tensor) else a for a in args]
        self.txn = txn
        self.rng_devices = _rng_devices(args, preserve)
        self.autocast = _autocast_state(_tcp._infer_device_type(*args))
        self.spec = None
        self.leaves: list[Any] = []
        self.tensor_pos: list[int] = []

    def _args(self, tensors):
        args = list(self.args)
        for i, t in zip(self.tensor_idx, tensors, strict=True):
            args[i] = t
        return args

    def _flat(self, out):
        leaves, spec = tree_flatten(out)
        return leaves, spec, [t for t in leaves if isinstance(t, torch.Tensor)]

    def forward(self, inputs):
        txn = self.txn
        args = self._args(inputs)
        txn.begin_forward(list(inputs), self.rng_devices)
        try:
            with _named_errors(self.function, args), _observer(txn):
                out = self.function(*args)
            txn.end_forward()
        except BaseException:
            txn.abort_forward()
            raise
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
            torch.autograd.graph.saved_tensors_hooks(pack, _no_unpack)
            if txn.stateful
            else contextlib.nullcontext()
        )
        args = self._args(detached)
        with _named_errors(self.function, args):
            txn.begin_replay()
            with hooks, self.autocast(), _observer(txn):
                out = self.function(*args)
            txn.verify_replay()
        return self._flat(out)[2]

    def finish(self):
        self.txn.finish_replay()

    def rebuild(self, tensors):
        leaves = list(self.leaves)
        for pos, t in zip(self.tensor_pos, tensors, strict=True):
            leaves[pos] = t
        return tree_unflatten(leaves, self.spec)


def _checkpoint_reentrant(function, args, txn, preserve):
    _tcp.check_backward_validity(args)
    runner = _ReentrantRunner(function, args, txn, preserve)
    inputs = [args[i] for i in runner.tensor_idx]
    outputs = require_extension().apply_segment(runner, inputs)
    return runner.rebuild(outputs)


# ------------------------------------------------------------------ public API


def checkpoint(
    function: Callable,
    *args: Any,
    use_reentrant: bool | None = None,
    context_fn: Callable[[], tuple[Any, Any]] = _tcp.noop_context_fn,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Checkpoint ``function(*args, **kwargs)`` so that its re-run is exact.

    A drop-in for :func:`torch.utils.checkpoint.checkpoint`: the same signature,
    defaults, warnings and global knobs (Note [Drop-in fidelity]); for a pure segment
    outputs and gradients are bitwise equal and the same activations are dropped.

    Args:
        function: the segment to run now and re-run in backward.
        *args: its positional arguments.
        use_reentrant: ``False`` (recommended) runs the segment under saved-tensor
            hooks; ``True`` through the C++ autograd Function (reentrant backward).
            Omitted, torch's warning is given and ``True`` is used, as torch does.
        context_fn: returns two context managers for the forward and the re-run
            (``use_reentrant=False`` only).
        determinism_check: ``"default"`` (compare shapes, dtypes and devices of
            recomputed saved tensors) or ``"none"``.
        debug: on a determinism error, print operator traces (as torch).
        early_stop: stop the re-run once every saved tensor is recomputed (only for
            segments that touched no state and drew no random numbers; stateful segments
            always re-run to the end so their end state can be verified). Overridden by
            ``torch.utils.checkpoint.set_checkpoint_early_stop``.
        **kwargs: keyword arguments of ``function`` (``use_reentrant=False`` only),
            ``preserve_rng_state`` (default ``True``: stash and restore the default
            generators, and undeclared explicit generators, for the re-run; declared
            generators are always preserved), and torch_replay's two options:

            ``state`` (or ``replay_state``): tensors, ``nn.Module`` s (all their
            buffers and parameters) and ``torch.Generator`` s that the segment may read
            or write and that may change before the re-run. The re-run sees their
            forward-time bytes and positions; afterwards they are exactly as they were.

            ``engine`` (or ``replay_engine``): how declared state is preserved:
            ``"snapshot"`` (copy every declared storage at the start), ``"journal"``
            (copy-on-write: the old bytes of every later write to the declared
            storages, inside or outside segments, in one shared log),
            ``"readset"`` (the bytes the segment touches, saved at first touch),
            ``"guard"`` (keep nothing, prove by hashes that nothing changed or raise) or
            ``"auto"`` (default: the journal if the segment touches declared state,
            so state it only reads costs nothing unless something writes it before
            backward; otherwise the guard). The journal and ``auto`` cannot undo a
            write that bypasses the dispatcher (the memory of ``.numpy()``, a raw
            pointer): the re-run then raises ``StateMutationError`` saying so;
            ``"readset"`` and ``"snapshot"`` copy instead and survive such writes.

            If ``function`` itself takes a parameter named ``state`` or ``engine``,
            that keyword goes to ``function`` and torch_replay's option must be spelled
            ``replay_state=`` / ``replay_engine=``; if ``function`` takes ``**kwargs``
            the plain spelling is refused as ambiguous (Note [Option spelling]).

    Returns:
        What ``function`` returns.

    Raises:
        StateMutationError: state the re-run depends on changed and cannot be restored.
        RngMismatchError: the re-run left a generator at another position than the forward.
        UnsupportedReplayError: e.g. a float gradient through an integer write.
        OverlapError: the segment copies between overlapping views of one memory.
        TypeError, ValueError: bad arguments (nothing is run, or state is rolled back).
    """
    if torch.compiler.is_compiling():
        # Inside torch.compile: Dynamo's checkpoint region (Note [Checkpoint under
        # torch.compile] in compiled.py), not the eager transaction. As torch there,
        # an omitted use_reentrant is not warned about.
        preserve = kwargs.pop("preserve_rng_state", True)
        state, engine = _replay_options(function, kwargs)
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        root = _module_of(function)
        if state is None and config.detect == "preserve" and root is not None:
            state = [root]  # preserve what it reads, undeclared: its buffers, as declared
        return checkpoint_compiled(
            function,
            args,
            kwargs,
            use_reentrant=use_reentrant,
            context_fn=context_fn,
            determinism_check=determinism_check,
            debug=debug,
            early_stop=early_stop,
            preserve=preserve,
            state=state,
            engine=engine,
        )
    if use_reentrant is None:
        warnings.warn(_USE_REENTRANT_WARNING, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    state, engine = _replay_options(function, kwargs)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if use_reentrant:
        if context_fn is not _tcp.noop_context_fn or debug is not False:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
        metadata_fn = None
    else:
        metadata_fn = _metadata_fn(determinism_check)
    if config.detect not in _DETECT_LEVELS:
        raise ValueError(
            f"torch_replay.config.detect must be one of {_DETECT_LEVELS}, got {config.detect!r}"
        )
    if config.observer not in ("c++", "python"):
        raise ValueError(
            f"torch_replay.config.observer must be 'c++' or 'python', got {config.observer!r}"
        )
    _fsdp.install()  # FSDP2's unshard/reshard is not the segment's (Note [FSDP traffic])
    if not torch.is_grad_enabled():
        # Nothing will be differentiated: run plainly (as torch does).
        _collect_state(state, function)  # still refuse malformed state
        return function(*args, **kwargs)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # loaded once anything compiled
    if eval_frame is not None and isinstance(function, eval_frame.OptimizedModule):
        # A compiled block: its kernels write memory the observer cannot see (and
        # Inductor allocates buffers outside the dispatcher). Compile the segment
        # instead, with the block's own compile settings, so it becomes Dynamo's
        # checkpoint region around the original module (Note [Checkpoint under
        # torch.compile] in compiled.py).
        original = function._orig_mod

        def segment(*a, **k):
            return checkpoint(
                original,
                *a,
                use_reentrant=use_reentrant,
                context_fn=context_fn,
                determinism_check=determinism_check,
                debug=debug,
                early_stop=early_stop,
                preserve_rng_state=preserve,
                replay_state=state,
                replay_engine=engine,
                **k,
            )

        return function.dynamo_ctx(segment)(*args, **kwargs)
    watch_reads = use_reentrant or config.detect == "reads"
    if not config.observe and state is not None:
        # Without the observer nothing reports what the segment touches: only the
        # whole snapshot preserves declared state then.
        if engine not in ("auto", "snapshot"):
            raise ValueError(
                f"engine={engine!r} needs the observer (torch_replay.config.observe=False); "
                "use engine='snapshot' or turn the observer back on"
            )
        engine = "snapshot"
    txn = _new_transaction(state, function, engine, preserve, watch_reads)
    with _named_errors(function, args):
        if use_reentrant:
            return _checkpoint_reentrant(function, args, txn, preserve)

        def child():
            return _new_transaction(state, function, engine, preserve, watch_reads, last=False)

        return _checkpoint_nonreentrant(
            function,
            args,
            kwargs,
            txn,
            child,
            preserve,
            context_fn,
            metadata_fn,
            debug,
            early_stop,
        )


def checkpoint_sequential(
    functions,
    segments: int,
    input: Any,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Checkpoint a sequential model in ``segments`` chunks (as
    :func:`torch.utils.checkpoint.checkpoint_sequential`, same signature, defaults
    and warning).

    Every chunk but the last runs through :func:`checkpoint`; with declared state,
    the last chunk does too, so that a declared buffer changed before backward is
    preserved for every chunk (torch runs the last chunk eagerly, whose saved
    tensors would then be stale).

    Args:
        functions: an ``nn.Sequential`` or a list of modules / functions.
        segments: number of chunks.
        input: the input of the first function.
        use_reentrant: as for :func:`checkpoint` (omitted: torch's warning, ``True``).
        **kwargs: ``preserve_rng_state``; torch_replay's ``state`` / ``engine``
            (``replay_state`` / ``replay_engine`` are accepted too) and the other
            keywords of :func:`checkpoint` (``context_fn``, ``determinism_check``,
            ``debug``, ``early_stop``).

    Returns:
        The output of the last function.

    Raises:
        ValueError: an unknown keyword (torch's text).
    """
    if use_reentrant is None:
        warnings.warn(_USE_REENTRANT_WARNING_SEQUENTIAL, stacklevel=2)
        use_reentrant = True
    options = {"preserve_rng_state": kwargs.pop("preserve_rng_state", True)}
    for plain, spelled, _ in _OPTIONS:
        if plain in kwargs and spelled in kwargs:
            raise TypeError(f"checkpoint_sequential: give {plain}= or {spelled}=, not both")
        if plain in kwargs or spelled in kwargs:
            options[spelled] = kwargs.pop(plain if plain in kwargs else spelled)
    for name in ("context_fn", "determinism_check", "debug", "early_stop"):
        if name in kwargs:
            options[name] = kwargs.pop(name)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start, end, functions):
        def forward(input):
            for j in range(start, end + 1):
                input = functions[j](input)
            return input

        return forward

    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())

    segment_size = len(functions) // segments
    # the last chunk has to be non-volatile
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(
            run_function(start, end, functions), input, use_reentrant=use_reentrant, **options
        )
    last = run_function(end + 1, len(functions) - 1, functions)
    if options.get("replay_state") is not None and torch.is_grad_enabled():
        return checkpoint(last, input, use_reentrant=use_reentrant, **options)
    return last(input)
