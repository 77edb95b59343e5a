"""The drop-in's signature, read from the installed torch's checkpoint.

Note [Drop-in signature]
``torch_replay.checkpoint`` takes what the installed ``torch.utils.checkpoint.checkpoint``
takes, read from its signature when the package is imported rather than written per torch
version: its ``__signature__`` is torch's, torch's keyword options are popped from the
keywords before anything reaches the checkpointed function (a keyword torch's checkpoint
takes is never passed on to the function), and where torch lets ``function`` be omitted
(torch 2.14) ``checkpoint(**options)`` returns a decorator, as there. Options that change
what a segment does are honoured; one this version of torch_replay does not know is
accepted at its default and refused with ``NotImplementedError`` otherwise, rather than
silently ignored. ``preserve_rng_state`` is an option on every torch (torch 2.13 and
older read it from ``**kwargs``; 2.14 names it).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as _tcp

__all__ = ["DropIn", "drop_in_of"]

# The parameters tr.checkpoint names itself (the function, its arguments, and the options
# its own def spells out); every other keyword-only parameter of torch's is an option popped
# from **kwargs.
_NAMED = ("use_reentrant", "context_fn", "determinism_check", "debug", "early_stop")

# The options torch_replay honours (Note [Drop-in signature]).
IMPLEMENTED = frozenset(_NAMED) | {"preserve_rng_state", "respect_saved_tensors_hooks"}

# torch's options passed only with use_reentrant=False, in the order torch names them in
# its error; those the installed torch has are named.
_NON_REENTRANT_ONLY = ("context_fn", "debug", "respect_saved_tensors_hooks")


def _same(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and bool(value == default))


def _listed(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    if len(quoted) <= 2:
        return " or ".join(quoted)
    return ", ".join(quoted[:-1]) + ", or " + quoted[-1]


@dataclasses.dataclass(frozen=True, slots=True)
class DropIn:
    """What a torch checkpoint function takes, as ``torch_replay.checkpoint`` mirrors it."""

    signature: inspect.Signature
    """The torch function's signature (``tr.checkpoint.__signature__``)."""
    options: dict[str, Any]
    """The keyword options beyond ``_NAMED``, with their defaults (popped from
    ``**kwargs``): ``preserve_rng_state`` always, ``respect_saved_tensors_hooks`` on
    torch 2.14."""
    function_optional: bool
    """Whether ``function`` may be omitted, the call then returning a decorator."""
    reentrant_error: str
    """torch's ``ValueError`` text for an option passed with ``use_reentrant=True``."""
    torch_version: str
    """The torch version the signature was read from (for errors)."""

    def pop_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Pops the options out of ``kwargs`` (the function's keywords stay) and returns
        every option's value, the default where it was not given.

        Raises:
            NotImplementedError: an option torch_replay does not implement was given a
                value other than its default.
        """
        values = {name: kwargs.pop(name, default) for name, default in self.options.items()}
        for name, value in values.items():
            default = self.options[name]
            if name not in IMPLEMENTED and not _same(value, default):
                raise NotImplementedError(
                    f"torch_replay.checkpoint: torch {self.torch_version}'s checkpoint takes "
                    f"{name}=, which this version of torch_replay does not implement; "
                    f"leave it at its default ({default!r}) or use "
                    "torch.utils.checkpoint.checkpoint for this segment. Nothing was run."
                )
        return values


def drop_in_of(torch_checkpoint: Callable[..., Any], torch_version: str) -> DropIn:
    """Reads a torch checkpoint function's signature (Note [Drop-in signature]).

    Args:
        torch_checkpoint: ``torch.utils.checkpoint.checkpoint`` (or a function with the
            signature of another torch's, for tests).
        torch_version: that torch's version, named in errors.

    Returns:
        The :class:`DropIn` that ``torch_replay.checkpoint`` follows.
    """
    signature = inspect.signature(torch_checkpoint)
    params = signature.parameters
    options = {
        name: p.default
        for name, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in _NAMED
    }
    options.setdefault("preserve_rng_state", True)
    first = next(iter(params.values()))
    refused = [n for n in _NON_REENTRANT_ONLY if n in params]
    return DropIn(
        signature=signature,
        options=options,
        function_optional=first.default is None,
        reentrant_error=f"Passing {_listed(refused)} is only supported when use_reentrant=False.",
        torch_version=torch_version,
    )


DROP_IN = drop_in_of(_tcp.checkpoint, torch.__version__)


class Checkpointed:
    """``checkpoint(**options)``'s decorator form (where torch has it): calls of the
    wrapped function are checkpointed with the options; a method stays a method."""

    def __init__(self, checkpoint: Callable[..., Any], function: Callable[..., Any], options):
        self.checkpoint = checkpoint
        self.function = function
        self.options = options
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.checkpoint(self.function, *args, **self.options, **kwargs)

    def __get__(self, instance, owner=None):
        bind = getattr(self.function, "__get__", None)
        if instance is None or bind is None:
            return self
        return type(self)(self.checkpoint, bind(instance, owner), self.options)
