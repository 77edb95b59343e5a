"""torchtitan: its activation checkpointing (``FullAC``, ``SelectiveAC``), chosen by the
trainer's config, with torch_replay's wrapper underneath.

One line of config, through torchtitan's own override mechanism::

    config.override.imports.append("torch_replay.integrations.torchtitan.replay_ac")
    # or on the command line: --override.imports torch_replay.integrations.torchtitan.replay_ac

or, for code that builds torchtitan's policies itself (Flux's ``apply_ac``, a script):
``enable()`` (a context manager too).

Note [torchtitan checkpointing mechanism]
torchtitan 0.3 selects activation checkpointing by config: ``Trainer.Config.
activation_checkpoint`` holds ``FullAC.Config``, ``SelectiveAC.Config``,
``MemoryBudgetAC.Config`` or ``None``; the model's ``parallelize_fn`` calls
``ac_config.build(dump_folder=...).apply(model)``, which replaces each block of
``model.layers`` by ``self._wrap_block(block)``. ``FullAC._wrap_block`` and
``SelectiveAC._wrap_block`` build torch's wrapper through the module-level name
``ptd_checkpoint_wrapper`` of ``torchtitan.distributed.activation_checkpoint`` (torch's
``checkpoint_wrapper`` imported under that name), with ``preserve_rng_state``,
``determinism_check``, ``early_stop=False``, ``debug`` and, for selective AC, a
``context_fn`` with torchtitan's op policy. Flux's ``apply_ac``
(``torchtitan.models.flux.parallelize``) calls its own ``ptd_checkpoint_wrapper``.

There is no parameter for the wrapper, so:

- :func:`replay_ac` is an ``@override`` factory (``torchtitan.config.override``, applied
  by ``Trainer.__init__`` to the whole config tree before anything is built): it
  replaces a ``FullAC.Config`` / ``SelectiveAC.Config`` by :class:`ReplayFullAC` /
  :class:`ReplaySelectiveAC`'s config (``derive``: every field copied, plus
  ``replay_engine``). Their ``_wrap_block`` runs torchtitan's own with
  ``ptd_checkpoint_wrapper`` bound, for that call, to a function that builds
  :func:`torch_replay.checkpoint_wrapper` from the same keywords, so torchtitan's
  selection, op policy and options are used unchanged. The block is declared state
  (``replay_state="module"``): MoE token counts and the expert bias, and any buffer a
  block writes, are preserved for the re-run. A block that comes back not wrapped by
  torch_replay (a torchtitan whose ``_wrap_block`` no longer calls
  ``ptd_checkpoint_wrapper``) raises ``UnsupportedReplayError`` instead of training with
  torch's checkpoint.
- :func:`enable` binds that name in torchtitan's modules until :func:`disable` or the
  end of its ``with`` block: every policy and Flux's ``apply_ac`` then build
  torch_replay's wrapper. It must be in effect while the model is wrapped (the
  wrappers stay after it ends).

MoE load balancing (``register_moe_load_balancing_hook``) halves ``tokens_per_expert``
of blocks whose ``checkpoint_impl is CheckpointImpl.NO_REENTRANT``, because torch's
re-run counts tokens twice. torch_replay's re-run counts them once, and its wrapper's
``checkpoint_impl`` is a ``ReplayCheckpointImpl`` (Note [Wrapper identity] in
``torch_replay/wrapper.py``), so the hook sees the count eager training sees.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl
from torchtitan.config import derive, override
from torchtitan.distributed import activation_checkpoint as _titan_ac

from .._replay.replace import Options
from ..errors import UnsupportedReplayError
from ..wrapper import ReplayCheckpointWrapper, checkpoint_wrapper

__all__ = [
    "ReplayFullAC",
    "ReplaySelectiveAC",
    "disable",
    "enable",
    "enabled",
    "replay_ac",
]

_NAME = "ptd_checkpoint_wrapper"
# Modules that call torch's wrapper through a module-level ``ptd_checkpoint_wrapper``.
_MODULES = ("torchtitan.distributed.activation_checkpoint", "torchtitan.models.flux.parallelize")
_LOCK = threading.RLock()
_ORIGINAL: dict[str, Any] = {}  # module name -> torchtitan's own function, while enabled
_GENERATION = [0]  # disable() ends every handle handed out before it


def _checked_engine(replay_engine: str, where: str) -> str:
    Options.checked("module", replay_engine, where, "replay_state")
    return replay_engine


def _builder(replay_engine: str) -> Callable[..., torch.nn.Module]:
    """A stand-in for torch's ``checkpoint_wrapper`` that builds torch_replay's."""

    def ptd_checkpoint_wrapper(
        module: torch.nn.Module,
        checkpoint_impl: CheckpointImpl = CheckpointImpl.NO_REENTRANT,
        checkpoint_fn: Callable[..., Any] | None = None,
        **checkpoint_kwargs: Any,
    ) -> torch.nn.Module:
        if checkpoint_fn is not None:
            raise UnsupportedReplayError(
                "torch_replay.integrations.torchtitan: torchtitan asked for its own "
                f"checkpoint_fn ({checkpoint_fn!r}) around {type(module).__name__}; "
                "torch_replay's wrapper runs torch_replay.checkpoint and cannot take "
                "another. Turn the torch_replay route off for this policy."
            )
        return checkpoint_wrapper(
            module,
            use_reentrant=checkpoint_impl is CheckpointImpl.REENTRANT,
            replay_engine=replay_engine,
            **checkpoint_kwargs,
        )

    ptd_checkpoint_wrapper.torch_replay_engine = replay_engine  # type: ignore[attr-defined]
    return ptd_checkpoint_wrapper


@contextlib.contextmanager
def _bound(module_name: str, function: Callable[..., Any]) -> Iterator[None]:
    module = importlib.import_module(module_name)
    with _LOCK:
        if not hasattr(module, _NAME):
            raise UnsupportedReplayError(
                f"torch_replay.integrations.torchtitan: {module_name} has no {_NAME} (this "
                "torchtitan builds its checkpoint wrapper some other way; the integration "
                "knows torchtitan 0.3). Wrap the blocks with "
                "tr.apply_activation_checkpointing(model.layers, ...) instead."
            )
        before = getattr(module, _NAME)
        setattr(module, _NAME, function)
        try:
            yield
        finally:
            setattr(module, _NAME, before)


def _wrap_with_replay(
    policy: _titan_ac.ActivationCheckpointing,
    wrap_block: Callable[..., torch.nn.Module],
    module: torch.nn.Module,
    base_fqn: str | None,
) -> torch.nn.Module:
    """torchtitan's ``_wrap_block`` with torch_replay's wrapper underneath."""
    engine = policy.config.replay_engine  # type: ignore[attr-defined]
    with _bound(_titan_ac.__name__, _builder(engine)):
        wrapped = wrap_block(module, base_fqn=base_fqn)
    if not isinstance(wrapped, ReplayCheckpointWrapper):
        raise UnsupportedReplayError(
            f"torch_replay.integrations.torchtitan: {type(policy).__name__}._wrap_block "
            f"returned a {type(wrapped).__name__}, not torch_replay's wrapper: this "
            f"torchtitan no longer builds it through {_titan_ac.__name__}.{_NAME} (the "
            "integration knows torchtitan 0.3). Nothing silently runs torch's checkpoint: "
            "wrap the blocks with tr.apply_activation_checkpointing(model.layers, ...) "
            "instead, with the config's activation_checkpoint set to None."
        )
    return wrapped


class ReplayFullAC(_titan_ac.FullAC):
    """torchtitan's ``FullAC`` (every block re-run in the backward) with torch_replay's
    wrapper (Note [torchtitan checkpointing mechanism])."""

    @dataclass(kw_only=True, slots=True)
    class Config(_titan_ac.FullAC.Config):
        replay_engine: str = "auto"
        """torch_replay's preservation engine for each block (``engine=`` of
        ``tr.checkpoint``)."""

    def _wrap_block(self, module: torch.nn.Module, *, base_fqn: str | None = None):
        return _wrap_with_replay(self, super()._wrap_block, module, base_fqn)


class ReplaySelectiveAC(_titan_ac.SelectiveAC):
    """torchtitan's ``SelectiveAC`` (its per-op save policy, as ``context_fn``) with
    torch_replay's wrapper (Note [torchtitan checkpointing mechanism])."""

    @dataclass(kw_only=True, slots=True)
    class Config(_titan_ac.SelectiveAC.Config):
        replay_engine: str = "auto"
        """torch_replay's preservation engine for each block (``engine=`` of
        ``tr.checkpoint``)."""

    def _wrap_block(self, module: torch.nn.Module, *, base_fqn: str | None = None):
        return _wrap_with_replay(self, super()._wrap_block, module, base_fqn)


_REPLACEMENTS = {
    _titan_ac.FullAC.Config: ReplayFullAC.Config,
    _titan_ac.SelectiveAC.Config: ReplaySelectiveAC.Config,
    ReplayFullAC.Config: ReplayFullAC.Config,
    ReplaySelectiveAC.Config: ReplaySelectiveAC.Config,
}


@override(
    target=_titan_ac.ActivationCheckpointing.Config,
    description="torch_replay's checkpoint wrapper under torchtitan's activation checkpointing",
)
def replay_ac(
    config: _titan_ac.ActivationCheckpointing.Config, *, replay_engine: str = "auto"
) -> _titan_ac.ActivationCheckpointing.Config:
    """torchtitan override: the trainer's full or selective activation checkpointing
    with torch_replay's wrapper. Activate it with one line of config::

        config.override.imports.append("torch_replay.integrations.torchtitan.replay_ac")

    (``--override.imports torch_replay.integrations.torchtitan.replay_ac`` on the
    command line; ``'...replay_ac={"replay_engine": "journal"}'`` chooses the engine).

    Args:
        config: the matched ``activation_checkpoint`` config.
        replay_engine: the preservation engine (``engine=`` of ``tr.checkpoint``).

    Returns:
        A :class:`ReplayFullAC` or :class:`ReplaySelectiveAC` config with every field of
        ``config`` and ``replay_engine``.

    Raises:
        ValueError: ``config`` is ``MemoryBudgetAC`` (no wrapper: torch.compile's
            partitioner recomputes) or a subclass of torchtitan's policies with a
            policy of its own (use :func:`enable` around building the model instead),
            or ``replay_engine`` is not an engine.
    """
    replay_engine = _checked_engine(replay_engine, "torch_replay.integrations.torchtitan.replay_ac")
    target = _REPLACEMENTS.get(type(config))
    if target is None:
        what = (
            "MemoryBudgetAC wraps nothing (torch.compile's partitioner chooses what to "
            "recompute), so torch_replay has no wrapper to replace: choose full or "
            "selective activation checkpointing, or drop the override"
            if isinstance(config, _titan_ac.MemoryBudgetAC.Config)
            else "its policy class is not torchtitan's FullAC or SelectiveAC, and "
            "replacing its config would drop that class's own code: build the model "
            "inside torch_replay.integrations.torchtitan.enable() instead"
        )
        raise ValueError(
            f"torch_replay.integrations.torchtitan.replay_ac: activation_checkpoint is "
            f"{type(config).__qualname__}; {what}."
        )
    return derive(config, target, replay_engine=replay_engine)


class _Enabled:
    """What :func:`enable` returns: a context manager that ends it."""

    def __init__(self, previous: dict[str, Any]):
        self._previous = previous
        self._generation = _GENERATION[0]
        self._open = True

    def __enter__(self) -> _Enabled:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Put back what was bound before this :func:`enable` (its ``with`` block's end)."""
        with _LOCK:
            if not self._open or self._generation != _GENERATION[0]:
                return  # closed already, or ended by disable()
            self._open = False
            for name, before in self._previous.items():
                setattr(importlib.import_module(name), _NAME, before)
            if all(getattr(importlib.import_module(n), _NAME) is f for n, f in _ORIGINAL.items()):
                _ORIGINAL.clear()  # the outermost enable() ended


def enable(*, replay_engine: str = "auto") -> _Enabled:
    """Make torchtitan's activation checkpointing build torch_replay's wrapper: every
    ``FullAC`` / ``SelectiveAC`` policy (and subclasses that call
    ``ptd_checkpoint_wrapper``) and Flux's ``apply_ac``, until :func:`disable` or the end
    of the ``with`` block (Note [torchtitan checkpointing mechanism]). Wrappers built
    meanwhile stay torch_replay's.

    For a trainer driven by its config, the one line is the override
    (:func:`replay_ac`); ``enable`` is for code that builds torchtitan's policies
    itself::

        with tr_titan.enable():
            FullAC.Config().build().apply(model)

    Args:
        replay_engine: the preservation engine (``engine=`` of ``tr.checkpoint``).

    Returns:
        A handle: ``with enable(): ...`` or ``handle.close()`` puts back what was there
        before this call (calls nest).

    Raises:
        UnsupportedReplayError: this torchtitan has no ``ptd_checkpoint_wrapper`` to
            replace (nothing is changed).
        ValueError: ``replay_engine`` is not an engine.
    """
    _checked_engine(replay_engine, "torch_replay.integrations.torchtitan.enable")
    function = _builder(replay_engine)
    with _LOCK:
        modules = {}
        for name in _MODULES:
            try:
                modules[name] = importlib.import_module(name)
            except ImportError:
                if name == _MODULES[0]:
                    raise
        missing = [name for name, m in modules.items() if not hasattr(m, _NAME)]
        if missing:
            raise UnsupportedReplayError(
                f"torch_replay.integrations.torchtitan.enable: {', '.join(missing)} has no "
                f"{_NAME} (this torchtitan builds its checkpoint wrapper some other way; "
                "the integration knows torchtitan 0.3). Nothing was changed."
            )
        previous = {name: getattr(m, _NAME) for name, m in modules.items()}
        for name, before in previous.items():
            _ORIGINAL.setdefault(name, before)
            setattr(modules[name], _NAME, function)
    return _Enabled(previous)


def disable() -> None:
    """End every :func:`enable`: torchtitan's modules call torch's
    ``checkpoint_wrapper`` again. Wrappers already built are left as they are."""
    with _LOCK:
        for name, original in _ORIGINAL.items():
            setattr(importlib.import_module(name), _NAME, original)
        _ORIGINAL.clear()
        _GENERATION[0] += 1


def enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return bool(_ORIGINAL)
