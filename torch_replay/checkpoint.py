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
import uuid
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._ext import require_extension
from ._observe import Observer
from .errors import ReplayError, UnsupportedReplayError

__all__ = [
    "ENGINES",
    "ReplayConfig",
    "checkpoint",
    "checkpoint_sequential",
    "config",
    "last_transaction",
]

ENGINES = ("auto", "snapshot", "journal", "readset", "guard")


@dataclass(kw_only=True, slots=True)
class ReplayConfig:
    """Process-wide settings of ``torch_replay.checkpoint``."""

    detect: str = "reads"
    """What undeclared state is checked (by version counters) before a re-run.
    ``"reads"`` (default): every tensor that existed before the segment and that it
    read (parameters, buffers, inputs, captured tensors), plus what it saved for
    backward; one weak reference and one integer per tensor. ``"saved"``: only the
    tensors the forward saved for backward (what eager autograd checks).
    ``use_reentrant=True`` always uses ``"reads"``, since its forward saves nothing."""

    observe: bool = True
    """Run the forward and the re-run under the observer (needed for declared
    state, explicit generators, undeclared writes, overlap and integer-write
    checks). Turning it off makes a segment with ``state=None`` behave like
    ``torch.utils.checkpoint`` plus the saved-tensor check."""


config = ReplayConfig()
_last_txn: weakref.ReferenceType | None = None


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
            for n, b in item.named_buffers():
                if b is not None:
                    tensors.append(b)
                    names.append(f"{prefix}.{n} (buffer)")
            for n, p in item.named_parameters():
                tensors.append(p)
                names.append(f"{prefix}.{n} (parameter)")
        elif isinstance(item, torch.Tensor):
            tensors.append(item)
            names.append(_tensor_name(item, root) or f"state[{i}]")
        elif isinstance(item, torch.Generator):
            gens.append(item)
            gen_names.append(f"state[{i}] (torch.Generator on {item.device})")
        else:
            raise TypeError(
                f"state[{i}] is a {type(item).__name__}; state= takes tensors, "
                "nn.Modules (their buffers and parameters) and torch.Generators only"
            )
    return tensors, names, gens, gen_names


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


def _rng_devices(args, preserve: bool) -> list[torch.device]:
    """Non-CPU devices whose default generator torch would stash (devices of the
    tensor arguments, when that device type is initialised)."""
    if not preserve:
        return []
    out: list[torch.device] = []
    for a in tree_flatten(args)[0]:
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


def _observer(txn):
    return Observer(txn) if config.observe else contextlib.nullcontext()


def _new_transaction(state, function, engine, preserve_rng_state, watch_reads):
    C = require_extension()
    tensors, names, gens, gen_names = _collect_state(state, function)
    txn = C.Transaction(engine, tensors, names, gens, gen_names, preserve_rng_state, watch_reads)
    global _last_txn
    _last_txn = weakref.ref(txn)
    return txn


def _metadata(x: torch.Tensor) -> dict[str, Any]:
    return {"shape": x.shape, "dtype": x.dtype, "device": x.device}


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
    ``_CheckpointFrame``), driving the segment's C++ Transaction on replay."""

    def __init__(self, txn, run, early_stop: bool, metadata_fn):
        self.txn = txn
        self.run = run
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.weak_holders: list[weakref.ReferenceType] = []
        self.metas: list[Any] = []
        self.recomputed: defaultdict[int, weakref.WeakKeyDictionary] = defaultdict(
            weakref.WeakKeyDictionary
        )
        self.counter: defaultdict[int, int] = defaultdict(int)
        self.done: defaultdict[int, bool] = defaultdict(bool)

    def pack(self, x: torch.Tensor) -> _Holder:
        holder = _Holder()
        self.weak_holders.append(weakref.ref(holder))
        if self.metadata_fn is not None:
            with torch.no_grad():
                self.metas.append(self.metadata_fn(x))
        self.txn.record_saved(x)
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        gid = torch._C._current_graph_task_id()
        if gid == -1:
            gid = int(uuid.uuid4())
        if not self.done[gid]:
            self.recompute(gid)
        if gid not in holder.handles:
            raise _tcp.CheckpointError(
                "torch_replay.checkpoint: a saved tensor was not recomputed (the re-run "
                "saved fewer tensors than the forward)"
            )
        if holder.handles[gid] is None:
            raise _tcp.CheckpointError(
                "torch_replay.checkpoint: unpack is being triggered for a tensor that was "
                "already unpacked once. If you are calling ctx.saved_tensors in backward, "
                "make sure to do so only once."
            )
        ret = self.recomputed[gid][holder.handles[gid]]
        holder.handles[gid] = None
        return ret

    def _recompute_pack(self, gid):
        txn = self.txn

        def pack(x):
            x = x.detach() if x.requires_grad else x
            if txn.overwritten_later(x):
                x = x.clone()  # the segment overwrites these bytes after saving them
            idx = self.counter[gid]
            self.counter[gid] += 1
            if idx >= len(self.weak_holders):
                raise _tcp.CheckpointError(
                    "torch_replay.checkpoint: trying to save more tensors during "
                    "recomputation than during the original forward pass."
                )
            holder = self.weak_holders[idx]()
            if holder is not None:
                holder.handles[gid] = _Handle()
                self.recomputed[gid][holder.handles[gid]] = x
            if self.early_stop and self.counter[gid] == len(self.weak_holders):
                raise _StopRecompute
            return x

        return pack

    def recompute(self, gid: int) -> None:
        txn = self.txn
        # A stateful segment runs to the end so that its end state is verified.
        self.early_stop = self.early_stop and not txn.stateful
        txn.begin_replay()
        try:
            completed = True
            try:
                with (
                    torch.autograd.graph.saved_tensors_hooks(self._recompute_pack(gid), _no_unpack),
                    torch.enable_grad(),
                ):
                    self.run()
            except _StopRecompute:
                completed = False
            if completed:
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

    def _check_metadata(self, gid: int) -> None:
        if self.metadata_fn is None:
            return
        if self.counter[gid] != len(self.weak_holders) and not self.early_stop:
            raise _tcp.CheckpointError(
                "torch_replay.checkpoint: a different number of tensors was saved during "
                f"the original forward ({len(self.weak_holders)}) and recomputation "
                f"({self.counter[gid]})."
            )
        for idx, wh in enumerate(self.weak_holders):
            holder = wh()
            if holder is None or holder.handles.get(gid) is None:
                continue
            got = self.metadata_fn(self.recomputed[gid][holder.handles[gid]])
            if got != self.metas[idx]:
                raise _tcp.CheckpointError(
                    "torch_replay.checkpoint: recomputed values have different metadata "
                    f"than during the forward pass: tensor at position {idx}: saved "
                    f"{self.metas[idx]}, recomputed {got}."
                )


def _no_unpack(x):
    return x


def _checkpoint_nonreentrant(
    function, args, kwargs, txn, preserve, context_fn, determinism_check, debug, early_stop
):
    unpack_error_cb = None
    if debug and hasattr(_tcp, "_get_debug_context_and_cb"):
        if context_fn is not None:
            raise ValueError("debug=True is incompatible with a non-default context_fn")
        context_fn, unpack_error_cb = _tcp._get_debug_context_and_cb()
    if determinism_check == "default":
        metadata_fn = _metadata
    elif determinism_check == "none":
        metadata_fn = None
    else:
        raise ValueError(
            f"determinism_check should be one of ['default', 'none'], but got {determinism_check}"
        )
    forward_ctx, recompute_ctx = (context_fn or _tcp.noop_context_fn)()
    device_type = _tcp._infer_device_type(*args)
    autocast = _autocast_state(device_type)
    if torch.is_grad_enabled() and early_stop is True:
        early_stop = (
            _tcp._enable_checkpoint_early_stop
            if _tcp._enable_checkpoint_early_stop is not None
            else True
        )

    def run():
        with autocast(), recompute_ctx, _observer(txn):
            function(*args, **kwargs)

    frame = _Frame(txn, run, bool(early_stop), metadata_fn)

    def unpack(holder):
        with _named_errors(function, args):
            if unpack_error_cb is None:
                return frame.unpack(holder)
            try:
                return frame.unpack(holder)
            except _tcp.CheckpointError as e:
                unpack_error_cb(e)

    tensor_args = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    txn.begin_forward(tensor_args, _rng_devices(args, preserve))
    try:
        with torch.autograd.graph.saved_tensors_hooks(frame.pack, unpack), forward_ctx:
            with _observer(txn):
                out = function(*args, **kwargs)
        _require_grad_output(out)
        txn.end_forward()
    except BaseException:
        txn.abort_forward()
        raise
    return out


def _require_grad_output(out) -> None:
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(out)[0]):
        raise UnsupportedReplayError(
            "the checkpointed segment returned no tensor that requires grad, so there is "
            "nothing to recompute for (with use_reentrant=True this also happens when no "
            "input requires grad, and parameters would silently get no gradient). Call the "
            "function directly, run it under torch.no_grad(), or pass inputs that require grad."
        )


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
    runner = _ReentrantRunner(function, args, txn, preserve)
    inputs = [args[i] for i in runner.tensor_idx]
    outputs = require_extension().apply_segment(runner, inputs)
    result = runner.rebuild(outputs)
    try:
        _require_grad_output(result)
    except UnsupportedReplayError:
        txn.abort_forward()
        raise
    return result


# ------------------------------------------------------------------ public API


def checkpoint(
    function: Callable,
    *args: Any,
    state: Iterable[Any] | None = None,
    engine: str = "auto",
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
    debug: bool = False,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Checkpoint ``function(*args, **kwargs)`` so that its re-run is exact.

    A drop-in for :func:`torch.utils.checkpoint.checkpoint`: every torch keyword keeps
    its meaning, and for a pure segment outputs and gradients are bitwise equal and the
    same activations are dropped.

    Args:
        function: the segment to run now and re-run in backward.
        *args: its positional arguments.
        state: tensors, ``nn.Module`` s (all their buffers and parameters) and
            ``torch.Generator`` s that the segment may read or write and that may change
            before the re-run. The re-run sees their forward-time bytes and positions;
            afterwards they are exactly as they were before it.
        engine: how declared state is preserved: ``"snapshot"`` (copy every declared
            storage at the start), ``"journal"`` (old bytes of each destructive write in a
            shared log, undone in reverse and redone; every write to the state until
            backward must happen inside torch_replay segments), ``"readset"`` (the bytes
            the segment touches, saved at first touch), ``"guard"`` (keep nothing, prove by
            hashes that nothing changed or raise) or ``"auto"`` (guard if the segment
            touched no declared state, otherwise read-set, which is the snapshot when it
            touched everything).
        use_reentrant: run the segment through the C++ autograd Function (reentrant
            backward) instead of saved-tensor hooks.
        preserve_rng_state: stash and restore the default generators (and undeclared
            explicit generators) for the re-run, as torch does. Declared generators are
            always preserved.
        determinism_check: ``"default"`` (compare shapes, dtypes and devices of recomputed
            saved tensors) or ``"none"``.
        debug: on a determinism error, print operator traces (as torch).
        context_fn: returns two context managers for the forward and the re-run.
        early_stop: stop the re-run once every saved tensor is recomputed (only for
            segments that touched no state and drew no random numbers; stateful segments
            always re-run to the end so their end state can be verified).
        **kwargs: keyword arguments of ``function`` (``use_reentrant=False`` only).

    Returns:
        What ``function`` returns.

    Raises:
        StateMutationError: state the re-run depends on changed and cannot be restored.
        RngMismatchError: the re-run left a generator at another position than the forward.
        UnsupportedReplayError: e.g. a float gradient through an integer write.
        OverlapError: the segment copies between overlapping views of one memory.
        TypeError, ValueError: bad arguments (nothing is run, or state is rolled back).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if context_fn is not None or debug:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
    if not torch.is_grad_enabled():
        # Nothing will be differentiated: run plainly (as torch does).
        _collect_state(state, function)  # still refuse malformed state
        return function(*args, **kwargs)
    watch_reads = use_reentrant or config.detect == "reads"
    if config.detect not in ("saved", "reads"):
        raise ValueError(
            f"torch_replay.config.detect must be 'saved' or 'reads', got {config.detect!r}"
        )
    if not config.observe and state is not None:
        # Without the observer nothing reports what the segment touches: only the
        # whole snapshot preserves declared state then.
        if engine not in ("auto", "snapshot"):
            raise ValueError(
                f"engine={engine!r} needs the observer (torch_replay.config.observe=False); "
                "use engine='snapshot' or turn the observer back on"
            )
        engine = "snapshot"
    txn = _new_transaction(state, function, engine, preserve_rng_state, watch_reads)
    with _named_errors(function, args):
        if use_reentrant:
            return _checkpoint_reentrant(function, args, txn, preserve_rng_state)
        return _checkpoint_nonreentrant(
            function,
            args,
            kwargs,
            txn,
            preserve_rng_state,
            context_fn,
            determinism_check,
            debug,
            early_stop,
        )


def checkpoint_sequential(
    functions,
    segments: int,
    input: Any,
    state: Iterable[Any] | None = None,
    engine: str = "auto",
    use_reentrant: bool = False,
    **kwargs: Any,
) -> Any:
    """Checkpoint a sequential model in ``segments`` chunks (as
    :func:`torch.utils.checkpoint.checkpoint_sequential`); every chunk but the last is
    run through :func:`checkpoint` with the same ``state`` and ``engine``.

    Args:
        functions: an ``nn.Sequential`` or a list of modules / functions.
        segments: number of chunks.
        input: the input of the first function.
        state, engine, use_reentrant: as for :func:`checkpoint`.
        **kwargs: ``preserve_rng_state`` and the other keywords of :func:`checkpoint`.

    Returns:
        The output of the last function.
    """
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    if segments < 1 or segments > max(len(functions), 1):
        raise ValueError(f"segments must be in [1, {len(functions)}], got {segments}")

    def run_function(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x

        return forward

    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(
            run_function(start, end),
            input,
            state=state,
            engine=engine,
            use_reentrant=use_reentrant,
            **kwargs,
        )
    return run_function(end + 1, len(functions) - 1)(input)
