"""What every checkpointed segment runs with: the process-wide settings
(``torch_replay.config``), its C++ Transaction, the naming of its state and errors, and
torch's words and knobs (Note [Drop-in fidelity])."""

from __future__ import annotations

import contextlib
import contextvars
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from torch.utils._pytree import tree_flatten

from .._ext import require_extension
from . import fsdp as _fsdp
from .call import SegmentCall
from .config import bad_setting, config
from .naming import module_of, named_errors, root_module, tensor_name  # noqa: F401
from .observe import DispatchModeObserver, Observer

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


def state_tensors(state: Any) -> list[torch.Tensor]:
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
            out.extend(state_tensors(item))
    return out


def collect_state(state, function):
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
    root = root_module(function)
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
            names.append((tensor_name(item, root) or f"state[{i}]") + _shard_word(local, item))
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


def flat_leaves(tree) -> list[Any]:
    """Leaves of ``tree``; a flat tuple/list of tensors and numbers needs no pytree."""
    if isinstance(tree, (tuple, list)) and all(
        isinstance(a, (torch.Tensor, int, float, bool, str, type(None))) for a in tree
    ):
        return list(tree)
    return tree_flatten(tree)[0]


def device_type_of(args) -> str:
    """torch's ``_infer_device_type(*args)``, without its pytree walk in the common case
    of arguments that hold no tensor off the CPU (then its answer is the default
    device type; otherwise torch's own function decides, and warns as torch does)."""
    if all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in flat_leaves(args)):
        return _tcp.DefaultDeviceType.get_device_type()
    return _tcp._infer_device_type(*args)


def rng_devices_of(args, preserve: bool) -> list[torch.device]:
    """Non-CPU devices whose default generator torch would stash (devices of the
    tensor arguments, when that device type is initialised)."""
    if not preserve:
        return []
    out: list[torch.device] = []
    for a in flat_leaves(args):
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            mod = getattr(torch, a.device.type, None)
            if getattr(mod, "_initialized", False) and a.device not in out:
                out.append(a.device)
    return out


def autocast_state(device_type: str):
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


def observer_of_segment():
    """The observer (a context manager factory taking the transaction and its gate) that
    a segment's forward and every re-run of it run under: chosen from ``config`` once,
    when the segment is called, as every other setting is (a backward run under other
    settings re-runs the segment as its forward ran)."""
    if not config.observe:
        return _unobserved
    if config.observer == "python":
        return DispatchModeObserver
    return Observer


def new_transaction(call: SegmentCall, watch_reads: bool, last: bool = True):
    """The C++ Transaction of one run of ``call``'s segment (``last``: the one
    ``last_transaction()`` and ``collect_transactions()`` report)."""
    C = require_extension()
    tensors, names, gens, gen_names = collect_state(call.state, call.function)
    txn = C.Transaction(
        call.engine,
        tensors,
        names,
        gens,
        gen_names,
        call.preserve_rng_state,
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


def tensor_metadata(x: torch.Tensor) -> dict[str, Any]:
    return {"shape": x.shape, "dtype": x.dtype, "device": x.device}


# ------------------------------------------------------- torch's words and knobs
# Note [Drop-in fidelity]
# Where torch.utils.checkpoint is right, torch_replay behaves the same: the same
# signature and defaults, the same warnings, torch's global knobs
# (set_checkpoint_early_stop, set_checkpoint_debug_enabled, GraphExecGroup) and
# torch's error texts as the start of ours, so code that matches on them keeps
# working. PyTorch's own checkpoint tests are run with torch_replay swapped in
# (scripts/torch_checkpoint_tests.py).

DEBUG_TIP = getattr(_tcp, "_debug_tip_msg", "")
USE_REENTRANT_WARNING = (
    "torch.utils.checkpoint: the use_reentrant parameter should be "
    "passed explicitly. Starting in PyTorch 2.9, calling checkpoint "
    "without use_reentrant will raise an exception. use_reentrant=False is "
    "recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants."
)
USE_REENTRANT_WARNING_SEQUENTIAL = (
    "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant "
    "parameter should be passed explicitly. "
    "In version 2.9 we will raise an exception if use_reentrant "
    "is not passed. use_reentrant=False is "
    "recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more "
    "details on the differences between the two variants."
)


def early_stop_on(local: bool) -> bool:
    knob = getattr(_tcp, "_enable_checkpoint_early_stop", None)
    return bool(knob if knob is not None else local)


def debug_on(local: bool) -> bool:
    knob = getattr(_tcp, "_checkpoint_debug_enabled", None)
    return bool(knob if knob is not None else local)


def graph_task_id():
    group = getattr(_tcp, "GraphExecGroup", None)
    gid = group._get_current_group() if group is not None else None
    if gid is None:
        gid = torch._C._current_graph_task_id()
        if gid == -1:
            # Unpacked outside of a backward call: a fresh id.
            gid = int(uuid.uuid4())
    return gid


def in_graph_exec_group() -> bool:
    get = getattr(torch._C, "_get_graph_exec_group", None)
    return get is not None and get() is not None


# ------------------------------------------------ torch's knobs of a non-reentrant segment


def metadata_fn_of(determinism_check: str):
    checks = getattr(_tcp, "_allowed_determinism_checks_to_fns", None)
    if checks is None:
        checks = {"default": tensor_metadata, "none": lambda _: None}
    if determinism_check not in checks:
        raise ValueError(
            f"determinism_check should be one of {list(checks.keys())}, but got {determinism_check}"
        )
    return checks[determinism_check]


def device_context():
    """The DeviceContext mode the forward runs under (the re-run respects it)."""
    return next(
        (m for m in reversed(_get_current_function_mode_stack()) if isinstance(m, DeviceContext)),
        contextlib.nullcontext(),
    )


# torch 2.14's saved-tensor hooks of checkpoint itself: selective checkpointing looks
# through them (and only them) for the user's hooks, which its saved tensors then go
# through (respect_saved_tensors_hooks). Where torch has them, the segment's hooks are
# marked the same way, so that the user's hooks, not the segment's, are found.
TORCH_INTERNAL_HOOKS = getattr(_tcp, "_checkpoint_internal_hook", None)


def internal_hooks(pack, unpack):
    if TORCH_INTERNAL_HOOKS is None:
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def internal_pack(x):
        return pack(x)

    internal_pack._checkpoint_internal = True  # type: ignore[attr-defined]
    return TORCH_INTERNAL_HOOKS(internal_pack, unpack)
