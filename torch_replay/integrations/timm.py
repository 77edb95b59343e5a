"""timm: ``enable(model)`` makes a timm model's own gradient checkpointing
(``set_grad_checkpointing()``) run ``tr.checkpoint``, for that model only.

Note [timm checkpointing mechanism]
A timm model turns checkpointing on with ``model.set_grad_checkpointing(True)``, which sets
``grad_checkpointing`` on the model (ResNet, ViT) or on its stages (ConvNeXt); the forward
of that module then runs its blocks through ``timm.models._manipulate.checkpoint_seq``
(``checkpoint_seq(self.blocks, x)``, ResNet ``checkpoint_seq([layer1, ..., layer4], x,
flatten=True)``) or timm's ``checkpoint(block, x)``. In timm 1.0 both call
``torch.utils.checkpoint.checkpoint(...)`` through the module attribute at call time, with
``use_reentrant=`` given explicitly (``timm.layers.use_reentrant_ckpt()``, ``False`` by
default); older timm (0.9) model files bound the name with ``from torch.utils.checkpoint
import checkpoint``. timm has no parameter for the checkpoint function.

So :func:`enable` calls ``model.set_grad_checkpointing(True)`` and sets, on the model
instance, ``forward``, ``forward_features`` and ``forward_intermediates`` (those the model
has) to callables that run the class's method inside torch_replay's replacement of torch's
checkpoint (Note [Replacing torch's checkpoint] in ``torch_replay/_replay/replace.py``),
held over ``torch.utils.checkpoint`` and the ``timm`` modules only. The replacement is
chosen per calling context: while this model's forward runs in a thread, that thread's
checkpoint calls are ``tr.checkpoint`` with this model's options; other models (timm's or
not) and other threads keep torch's. Each segment declares the modules it runs
(``replay_state="module"``): the blocks of ``checkpoint_seq``'s chunk, the block timm's
``checkpoint`` is given. :func:`disable` removes the instance attributes and turns timm's
checkpointing off; after the last enabled forward, torch's names are torch's again.

A timm whose checkpointing stopped calling ``torch.utils.checkpoint`` would leave torch's
checkpoint (or none) in place silently; instead the first training forward with a
``grad_checkpointing`` flag set and no checkpoint call through the replacement warns once.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .._replay.replace import Options, activated, active_frames

__all__ = ["disable", "enable", "enabled"]

_SETTING = "_torch_replay_timm"
_METHODS = ("forward", "forward_features", "forward_intermediates")
_SCOPE = ("timm",)  # beside torch.utils.checkpoint, which is always in scope
_UNSET = object()


class _Setting:
    """What :func:`enable` set on a model: the options and the attributes it replaced."""

    def __init__(self, options: Options, previous: dict[str, Any]):
        self.options = options
        self.previous = previous  # instance attributes shadowed (usually none)
        self.warned = False


class _Scoped:
    """A model's method, run inside the replacement of torch's checkpoint with the model's
    options (Note [timm checkpointing mechanism])."""

    def __init__(self, model: torch.nn.Module, name: str, previous: Any):
        self.model = model
        self.name = name
        self.previous = previous

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        setting: _Setting = vars(model)[_SETTING]
        method = (
            self.previous
            if self.previous is not _UNSET
            else getattr(type(model), self.name).__get__(model, type(model))
        )
        # (the outermost of this model's methods checks: forward_features runs in forward)
        outermost = all(f.options is not setting.options for f in active_frames())
        with activated(setting.options, _SCOPE) as frame:
            out = method(*args, **kwargs)
        if (
            outermost
            and frame.calls == 0
            and not setting.warned
            and model.training
            and torch.is_grad_enabled()
            and any(getattr(m, "grad_checkpointing", False) for m in model.modules())
        ):
            setting.warned = True
            warnings.warn(
                f"torch_replay.integrations.timm: {type(model).__name__}.{self.name} ran "
                "with grad_checkpointing set but made no call of "
                "torch.utils.checkpoint.checkpoint, so torch_replay did not checkpoint it; "
                "this timm version checkpoints some other way (the integration knows "
                "timm 1.0's checkpoint_seq and checkpoint). Wrap the blocks with "
                "tr.apply_activation_checkpointing instead.",
                UserWarning,
                stacklevel=2,
            )
        return out


def enable(
    model: torch.nn.Module, *, replay_state: Any = "module", replay_engine: str = "auto"
) -> None:
    """Turn on ``model``'s own gradient checkpointing with ``tr.checkpoint`` underneath.

    The torch_replay twin of ``model.set_grad_checkpointing(True)``: the same blocks are
    checkpointed, with timm's ``use_reentrant`` (``timm.layers.set_reentrant_ckpt``), and
    each segment declares the blocks it runs, so BatchNorm statistics are updated once per
    step, as without checkpointing (torch's checkpoint updates them again in the re-run).
    Only this model is affected, only while its forward runs (Note [timm checkpointing
    mechanism]). Calling it again replaces the options.

    Args:
        model: a timm model (any module with ``set_grad_checkpointing``).
        replay_state: ``"module"`` (default: each segment's blocks are declared),
            ``None`` (nothing declared: a state change before backward is refused by
            name) or a list of tensors, modules and generators declared for every
            segment.
        replay_engine: the preservation engine (``engine=`` of ``tr.checkpoint``).

    Returns:
        None (``model`` is changed in place; undo with :func:`disable`).

    Raises:
        ValueError: the model has no ``set_grad_checkpointing``, or ``replay_state`` is
            another string (nothing is changed).
        TypeError: a ``replay_state`` that is not a list of tensors, modules and
            generators (nothing is changed).
    """
    set_grad = getattr(model, "set_grad_checkpointing", None)
    if not isinstance(model, torch.nn.Module) or not callable(set_grad):
        raise ValueError(
            f"torch_replay.integrations.timm.enable: {type(model).__name__} has no "
            "set_grad_checkpointing(); for a model that does not checkpoint itself use "
            "tr.apply_activation_checkpointing(model, check_fn=...). Nothing was changed."
        )
    options = Options.checked(
        replay_state, replay_engine, "torch_replay.integrations.timm.enable", "replay_state"
    )
    setting = vars(model).get(_SETTING)
    if setting is not None:
        setting.options = options
        setting.warned = False
        set_grad(True)
        return
    set_grad(True)
    previous = {}
    for name in _METHODS:
        if callable(getattr(model, name, None)):
            previous[name] = vars(model).get(name, _UNSET)
    vars(model)[_SETTING] = _Setting(options, previous)
    for name, before in previous.items():
        vars(model)[name] = _Scoped(model, name, before)


def disable(model: torch.nn.Module) -> None:
    """Turn ``model``'s gradient checkpointing off (``set_grad_checkpointing(False)``) and
    remove what :func:`enable` set on it (its methods are its class's again).

    Args:
        model: a model :func:`enable` was called on (anything else: only timm's flag is
            turned off).

    Returns:
        None.
    """
    setting = vars(model).pop(_SETTING, None)
    if setting is not None:
        for name, before in setting.previous.items():
            if isinstance(vars(model).get(name), _Scoped):
                if before is _UNSET:
                    del vars(model)[name]
                else:
                    vars(model)[name] = before
    set_grad = getattr(model, "set_grad_checkpointing", None)
    if callable(set_grad):
        set_grad(False)


def enabled(model: torch.nn.Module) -> bool:
    """Whether :func:`enable` is in effect on ``model``."""
    return _SETTING in vars(model)
