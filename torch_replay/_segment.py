"""What every checkpointed segment runs with: the process-wide settings
(``torch_replay.config``), its C++ Transaction, the naming of its state and errors, and
torch's words and knobs (Note [Drop-in fidelity])."""

from __future__ import annotations

import contextlib
import contextvars
import os
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.utils._pytree import tree_flatten

from . import fsdp as _fsdp
from ._ext import engine_names, require_extension
from ._naming import _module_of, _named_errors, _root_module, _tensor_name  # noqa: F401
from ._observe import DispatchModeObserver, Observer

# The engine names, defined once in C++ (csrc/core/preservation_engine.cpp).
ENGINES: tuple[str, ...] = engine_names()


@dataclass(kw_only=True, slots=True)
class ReplayConfig:
    """Process-wide settings of ``torch_replay.checkpoint``."""

    detect: str = os.environ.get("TORCH_REPLAY_DETECT", "reads")
    """What happens to undeclared state: a tensor that existed before the segment and
    that it read (parameter, buffer, input, captured tensor), changed in place before
    backward. ``"reads"`` (default): the re-run is refused (``StateMutationError``
    naming the tensor, never a wrong gradient), checked by version counters: one weak
    reference and one integer per tensor read, no write watch. ``"preserve"``:
    preserved instead, so the re-run sees the forward's values without ``state=``:
    the segment's reads are journaled copy-on-write, a later in-place write to them
    (outside segments too) first keeps the old bytes of what it overwrites (as
    ``engine="journal"`` for declared state), and nothing is copied if nothing is
    written. While such a segment waits for its backward, every operator of the
    process pays the write watch. A graph kept alive (past its backward with
    ``retain_graph=True``, or never backwarded) keeps at most one copy of what its
    segments read and later steps overwrite, until it is dropped (Note [Region
    journal] in csrc/core/region_journal.h). Writes that bypass the dispatcher (the
    memory of ``.numpy()``, raw pointers) are detected, by hashes, with
    ``verify="bytes"``. ``"saved"``: check only the tensors the forward saved for
    backward (what eager autograd checks); with ``use_reentrant=True``, whose forward
    saves nothing, it means ``"reads"``. Inside ``torch.compile`` every level leaves
    undeclared tensors to autograd's version check, as torch does (Note [Checkpoint
    under torch.compile] in compiled.py). Why ``"reads"`` is the default, with the
    figures: docs/checkpoint_details.md, "Which level is the default";
    benchmarks/results/replay_speed.md gives the cost of each level."""

    verify: str = os.environ.get("TORCH_REPLAY_VERIFY", "dispatcher")
    """What proves that a re-run starts from the forward's bytes and reproduces its
    end state (Note [Verification levels] in csrc/aten/transaction.h).
    ``"dispatcher"`` (default): every write made through PyTorch's dispatcher (any
    operator, in a segment or not, through any alias: ``.data``, views of other
    dtypes, ``set_``) is seen, so declared state is journaled, marked or restored
    from a copy without hashing it; only bytes the forward or the re-run write are
    hashed. ``"bytes"``: also hash every declared (and, under ``detect="preserve"``,
    preserved) byte the segment reads, in the forward and before the re-run, which
    also catches writes that bypass the dispatcher (the memory of ``.numpy()``, a
    raw pointer, a compiled kernel writing an input outside any segment) and
    raises ``StateMutationError`` for them. Like torch's ``determinism_check``, it
    is a check the user turns on; benchmarks/results/observer.md gives its cost."""

    observer: str = os.environ.get("TORCH_REPLAY_OBSERVER", "c++")
    """How the operators of a segment are observed (Note [C++ observer]): ``"c++"``
    (a thread-local RecordFunction callback of the dispatcher, about 1 µs per
    operator) or ``"python"`` (a TorchDispatchMode, about 10 µs per operator; the
    reference implementation). As every setting here but ``heap``, it is read when a
    segment is called: its re-run in backward runs under the same observer."""

    heap: str = os.environ.get("TORCH_REPLAY_HEAP", "steady")
    """glibc's heap under checkpointing (Note [Steady heap] in csrc/core/heap_policy.h).
    ``"steady"`` (default): at the first checkpoint call, set glibc's mmap threshold
    to 32 MiB and its trim threshold to 64 MiB (the values glibc adopts by itself once
    the process frees a 32 MiB block), so that a step does not give the top of the
    heap back to the system and fault it in again in the next one; skipped when the
    user set glibc's malloc thresholds (``MALLOC_*_`` or ``GLIBC_TUNABLES``) or malloc
    is not glibc's. ``heap_setting()`` says what was done. ``"system"``: leave glibc
    as it is (a small model then pays minor page faults every step that torch's
    checkpoint does not; benchmarks/results/replay_speed.md)."""

    observe: bool = True
    """Run the forward and the re-run under the observer (needed for declared
    state, explicit generators, undeclared writes, overlap and integer-write
    checks). Turning it off makes a segment with ``state=None`` behave like
    ``torch.utils.checkpoint`` plus the saved-tensor check."""

    def patch(self, **changes: Any) -> contextlib.AbstractContextManager[ReplayConfig]:
        """These settings for a block, or for each call of a decorated function, put back
        as they were when it ends, however it ends (as ``torch._dynamo.config.patch``)::

            with tr.config.patch(detect="preserve"):
                loss = model(x).sum()  # its segments preserve what they read
            loss.backward()

        A segment keeps the settings its forward ran with until its backward, so the
        backward may run outside the block. The settings are process-wide, as
        ``tr.config`` is: another thread checkpointing meanwhile runs with them too.
        (``heap`` acts once, at the process's first checkpoint call.)

        Args:
            **changes: setting names (the attributes above) and their values. Every one
                is checked before any is set.

        Returns:
            A context manager, also usable as a decorator.

        Raises:
            AttributeError: a name that is not a setting.
            ValueError: a value the setting does not take (the valid ones are named).
        """
        for name, value in changes.items():
            _check_setting(name, value)
        return _patched(self, changes)


config = ReplayConfig()
_DETECT_LEVELS = ("saved", "reads", "preserve")
_VERIFY_LEVELS = ("dispatcher", "bytes")
_OBSERVERS = ("c++", "python")
_HEAP_SETTINGS = ("steady", "system")
# The values each setting takes (``observe``: a bool).
_CHOICES: dict[str, tuple[Any, ...]] = {
    "detect": _DETECT_LEVELS,
    "verify": _VERIFY_LEVELS,
    "observer": _OBSERVERS,
    "heap": _HEAP_SETTINGS,
    "observe": (True, False),
}


def bad_setting(name: str, value: Any) -> ValueError:
    """The error for a value ``config.<name>`` does not take."""
    return ValueError(f"torch_replay.config.{name} must be one of {_CHOICES[name]}, got {value!r}")


def _check_setting(name: str, value: Any) -> None:
    if name not in _CHOICES:
        raise AttributeError(
            f"torch_replay.config has no setting {name!r}; its settings are {tuple(_CHOICES)}"
        )
    # (Types compared too, not ``in``: 1 == True, but observe is a bool.)
    if not any(type(value) is type(c) and value == c for c in _CHOICES[name]):
        raise bad_setting(name, value)


@contextlib.contextmanager
def _patched(cfg: ReplayConfig, changes: dict[str, Any]):
    old = {name: getattr(cfg, name) for name in changes}
    try:
        for name, value in changes.items():
            setattr(cfg, name, value)
        yield cfg
    finally:
        for name, value in old.items():
            setattr(cfg, name, value)


_heap_set = False
_last_txn: weakref.ReferenceType | None = None


def steady_heap() -> None:
    """Apply ``config.heap`` (once per process, at the first checkpoint call)."""
    global _heap_set
    heap = config.heap
    if heap == "steady":
        if not _heap_set:
            require_extension().steady_heap()
            _heap_set = True
    elif heap != "system":
        raise bad_setting("heap", heap)


def heap_setting() -> str:
    """What ``config.heap="steady"`` did to glibc's heap in this process: ``"set: ..."``
    (the thresholds it set), ``"left: ..."`` (why it changed nothing: the user's own
    ``MALLOC_*_`` setting, another allocator) or ``""`` (no checkpoint call under
    ``"steady"`` yet)."""
    return str(require_extension().steady_heap_outcome())


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


def _state_tensors(state: Any) -> list[torch.Tensor]:
    """The tensors a declared state holds: tensors, modules' buffers and parameters,
    nested lists (per-segment state) flattened; generators and None skipped."""
    out: list[torch.Tensor] = []
    for item in state or ():
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, torch.nn.Module):
            out.extend(b for b in item.buffers() if b is not None)
            out.extend(item.parameters())
        elif isinstance(item, (list, tuple)):
            out.extend(_state_tensors(item))
    return out


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
    root = _root_module(function)
    paths = None
    for i, item in enumerate(state):
        if isinstance(item, torch.nn.Module):
            if item is root:
                prefix = ""
            else:
                if paths is None:
                    paths = {id(m): p for p, m in root.named_modules()} if root is not None else {}
                prefix = paths.get(id(item), "")
            prefix = prefix or type(item).__name__
            # FSDP2 / DTensor state is preserved by its local shard (Note [FSDP traffic]).
            buffers, parameters = _module_state(item)
            for n, b in buffers:
                local = _fsdp.local_state(b)
                tensors.append(local)
                names.append(f"{prefix}.{n} (buffer{_shard_word(local, b)})")
            for n, p in parameters:
                local = _fsdp.local_state(p)
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


_TREE_METHODS = ("named_modules", "named_buffers", "named_parameters", "_named_members")
_plain_modules: dict[type, bool] = {}


def _module_state(module: torch.nn.Module):
    """``list(module.named_buffers())`` and ``list(module.named_parameters())``: the
    same names and order, from one walk of the module tree instead of two (a segment
    that declares its layer collects them at every call). A tree with a module class
    that changes how the tree is walked is walked by torch's own methods."""
    order: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        if id(m) in seen:
            continue
        cls = type(m)
        plain = _plain_modules.get(cls)
        if plain is None:
            plain = all(getattr(cls, n) is getattr(torch.nn.Module, n) for n in _TREE_METHODS)
            _plain_modules[cls] = plain
        if not plain:
            return list(module.named_buffers()), list(module.named_parameters())
        seen.add(id(m))
        order.append((prefix, m))
        children = [
            (f"{prefix}.{n}" if prefix else n, c) for n, c in m._modules.items() if c is not None
        ]
        stack.extend(reversed(children))

    def members(kind: str) -> list[tuple[str, torch.Tensor]]:
        out, memo = [], set()
        for prefix, m in order:
            for n, t in getattr(m, kind).items():
                if t is None or id(t) in memo:
                    continue
                memo.add(id(t))
                out.append((f"{prefix}.{n}" if prefix else n, t))
        return out

    return members("_buffers"), members("_parameters")


def _shard_word(local: torch.Tensor, declared: torch.Tensor) -> str:
    return ", local shard" if local is not declared else ""


# -------------------------------------------------------------------- helpers


def _leaves(tree) -> list[Any]:
    """Leaves of ``tree``; a flat tuple/list of tensors and numbers needs no pytree."""
    if isinstance(tree, (tuple, list)) and all(
        isinstance(a, (torch.Tensor, int, float, bool, str, type(None))) for a in tree
    ):
        return list(tree)
    return tree_flatten(tree)[0]


def _device_type(args) -> str:
    """torch's ``_infer_device_type(*args)``, without its pytree walk in the common case
    of arguments that hold no tensor off the CPU (then its answer is the default
    device type; otherwise torch's own function decides, and warns as torch does)."""
    if all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in _leaves(args)):
        return _tcp.DefaultDeviceType.get_device_type()
    return _tcp._infer_device_type(*args)


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


def _unobserved(txn, gate=None):
    return contextlib.nullcontext()


def _observer_of_segment():
    """The observer (a context manager factory taking the transaction and its gate) that
    a segment's forward and every re-run of it run under: chosen from ``config`` once,
    when the segment is called, as every other setting is (a backward run under other
    settings re-runs the segment as its forward ran)."""
    if not config.observe:
        return _unobserved
    if config.observer == "python":
        return DispatchModeObserver
    return Observer


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
        verify_bytes=config.verify == "bytes",
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
