"""Replay-safe activation checkpointing: a drop-in for ``torch.utils.checkpoint``.

The re-run of a segment sees exactly the state its forward saw. Declared state
(``state=``) is preserved by a preservation engine written in C++ (whole snapshot,
region journal, read-set, or guard); undeclared state is checked; the replay is
verified byte for byte (``P(B0, R0) = (B_T, R_T)``) and is invisible afterwards.
See Note [Replay protocol] in ``csrc/aten/transaction.h`` for the protocol and
``README.md`` ("What is detected") for what is and is not caught.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.utils.checkpoint as _tcp

from .._ext import require_extension
from . import fsdp as _fsdp
from .call import SegmentCall
from .compiled import checkpoint_compiled, constant_under_compile
from .config import DETECT_LEVELS, ENGINES, OBSERVERS, VERIFY_LEVELS, bad_setting, config
from .drop_in import DROP_IN, Checkpointed
from .naming import accepts_keyword
from .nonreentrant import checkpoint_nonreentrant
from .reentrant import checkpoint_reentrant
from .segment import (
    USE_REENTRANT_WARNING,
    USE_REENTRANT_WARNING_SEQUENTIAL,
    collect_state,
    metadata_fn_of,
    named_errors,
    new_transaction,
    steady_heap,
)

__all__ = ["checkpoint", "checkpoint_sequential"]

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


# Whether the function takes a keyword (defined beside the error naming, which respells
# the options by it: Note [Naming in errors]); Dynamo treats the answer as a constant.
_takes_keyword_constant = constant_under_compile(accepts_keyword)

# torch < 2.13's Dynamo folds a constant-marked call only when every argument is a Python
# constant, which a module is not (2.13 passes such an object through, guarded by its
# identity); there a module without a forward of its own is asked about by its class's
# forward, a constant with the same signature.
_CONSTANT_ARGS_ONLY = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13)


def _takes_keyword(function, plain: str) -> bool | None:
    if (
        _CONSTANT_ARGS_ONLY
        and isinstance(function, torch.nn.Module)
        and "forward" not in function.__dict__
    ):
        return _takes_keyword_constant(type(function).forward, plain)
    return _takes_keyword_constant(function, plain)


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


# ------------------------------------------------------------------ public API


def checkpoint(
    function: Callable | None = None,
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
    outputs and gradients are bitwise equal and the same activations are dropped. The
    signature is the installed torch's, read when the package is imported, and so are the
    keyword options (Note [Drop-in signature]): a keyword torch's checkpoint takes is
    never passed on to ``function``.

    Args:
        function: the segment to run now and re-run in backward. Where the installed
            torch lets it be omitted (torch 2.14), ``checkpoint(**options)`` returns a
            decorator whose calls are checkpointed with those options.
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
            generators are always preserved), the installed torch's other keyword
            options (torch 2.14: ``respect_saved_tensors_hooks``, whether the tensors
            selective checkpointing saves go through the surrounding
            ``saved_tensors_hooks``; ``use_reentrant=False`` only), and torch_replay's
            two options:

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
            backward; otherwise the guard). The journal, the guard and ``auto`` cannot
            undo a write that bypasses the dispatcher: one that moves the version
            counter (a ``torch.compile``'d in-place update) is refused with
            ``StateMutationError`` saying so, one that does not (the memory of
            ``.numpy()``, a raw pointer) only under ``tr.config.verify = "bytes"``;
            ``"readset"`` and ``"snapshot"`` restore their copies at every re-run and
            survive both (docs/engines.md, "What each engine survives").

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
        NotImplementedError: a keyword option of the installed torch's checkpoint that
            this version of torch_replay does not implement, given a value other than
            its default (nothing is run).
    """
    if function is None and not args:
        return _decorator(kwargs, use_reentrant, context_fn, determinism_check, debug, early_stop)
    if not ENGINES:  # the extension is unavailable: say why (Note [Extension loading])
        require_extension()
    options = DROP_IN.pop_options(kwargs)
    preserve = options.pop("preserve_rng_state")
    compiling = torch.compiler.is_compiling()
    if use_reentrant is None and not compiling:
        # (Inside torch.compile, as torch there, an omitted use_reentrant is not warned
        # about and torch's default applies in the region.)
        warnings.warn(USE_REENTRANT_WARNING, stacklevel=2)
        use_reentrant = True
    state, engine = _replay_options(function, kwargs)
    if kwargs and use_reentrant and not compiling:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    metadata_fn = None
    if use_reentrant and not compiling:
        hooks = options.get("respect_saved_tensors_hooks")
        if context_fn is not _tcp.noop_context_fn or debug is not False or hooks is not None:
            raise ValueError(DROP_IN.reentrant_error)
    elif not compiling:
        metadata_fn = metadata_fn_of(determinism_check)
    call = SegmentCall(
        function=function,
        use_reentrant=use_reentrant,
        context_fn=context_fn,
        determinism_check=determinism_check,
        metadata_fn=metadata_fn,
        debug=debug,
        early_stop=early_stop,
        preserve_rng_state=preserve,
        torch_options=options,
        state=state,
        engine=engine,
    )
    if compiling:
        # Dynamo's checkpoint region (Note [Checkpoint under torch.compile] in
        # compiled.py), not the eager transaction.
        return checkpoint_compiled(call, args, kwargs, eager=checkpoint)
    if config.detect not in DETECT_LEVELS:
        raise bad_setting("detect", config.detect)
    if config.verify not in VERIFY_LEVELS:
        raise bad_setting("verify", config.verify)
    if config.observer not in OBSERVERS:
        raise bad_setting("observer", config.observer)
    steady_heap()  # Note [Steady heap]
    _fsdp.install()  # FSDP2's unshard/reshard is not the segment's (Note [FSDP traffic])
    if not torch.is_grad_enabled():
        # Nothing will be differentiated: run plainly (as torch does).
        collect_state(state, function)  # still refuse malformed state
        return function(*args, **kwargs)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # loaded once anything compiled
    if eval_frame is not None and isinstance(function, eval_frame.OptimizedModule):
        # A compiled block: its kernels write memory the observer cannot see (and
        # Inductor allocates buffers outside the dispatcher). Compile the segment
        # instead, with the block's own compile settings, so it becomes Dynamo's
        # checkpoint region around the original module (Note [Checkpoint under
        # torch.compile] in compiled.py).
        original = function._orig_mod
        keywords = call.keywords()

        def segment(*a, **k):
            return checkpoint(original, *a, **keywords, **k)

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
        call = replace(call, engine="snapshot")
    txn = new_transaction(call, watch_reads)
    with named_errors(function, args, kwargs):
        if use_reentrant:
            return checkpoint_reentrant(call, args, txn)
        return checkpoint_nonreentrant(
            call, args, kwargs, txn, child=lambda: new_transaction(call, watch_reads, last=False)
        )


# torch_replay's own options, which the decorator form takes as well as torch's.
_REPLAY_KEYWORDS = frozenset(name for option in _OPTIONS for name in option[:2])


def _decorator(kwargs, use_reentrant, context_fn, determinism_check, debug, early_stop):
    """``checkpoint(**options)`` without a function: a decorator, where torch has the form
    (Note [Drop-in signature])."""
    if not DROP_IN.function_optional:
        raise TypeError("checkpoint() missing 1 required positional argument: 'function'")
    options = DROP_IN.pop_options(kwargs)
    unexpected = [k for k in kwargs if k not in _REPLAY_KEYWORDS]
    if unexpected:
        raise ValueError("Unexpected keyword arguments: " + ",".join(unexpected))
    options.update(
        kwargs,
        use_reentrant=use_reentrant,
        context_fn=context_fn,
        determinism_check=determinism_check,
        debug=debug,
        early_stop=early_stop,
    )
    return functools.partial(Checkpointed, checkpoint, options=options)


# The installed torch's signature (Note [Drop-in signature]).
checkpoint.__signature__ = DROP_IN.signature  # type: ignore[attr-defined]


# The keywords of checkpoint that checkpoint_sequential passes on to each chunk.
_SEQUENTIAL_OPTIONS = (
    "context_fn",
    "determinism_check",
    "debug",
    "early_stop",
    *(name for name in DROP_IN.options if name != "preserve_rng_state"),
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
            keyword options of :func:`checkpoint` (``context_fn``, ``determinism_check``,
            ``debug``, ``early_stop``, and those of the installed torch's checkpoint).

    Returns:
        The output of the last function.

    Raises:
        ValueError: an unknown keyword (torch's text).
    """
    if use_reentrant is None:
        warnings.warn(USE_REENTRANT_WARNING_SEQUENTIAL, stacklevel=2)
        use_reentrant = True
    options = {"preserve_rng_state": kwargs.pop("preserve_rng_state", True)}
    for plain, spelled, _ in _OPTIONS:
        if plain in kwargs and spelled in kwargs:
            raise TypeError(f"checkpoint_sequential: give {plain}= or {spelled}=, not both")
        if plain in kwargs or spelled in kwargs:
            options[spelled] = kwargs.pop(plain if plain in kwargs else spelled)
    for name in _SEQUENTIAL_OPTIONS:
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
