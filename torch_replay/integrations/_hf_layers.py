"""How ``tr.checkpoint`` is installed on a transformers model's layers, and installed
again after each later call of the model's ``activation_checkpointing_enable`` (Note [HF
checkpointing mechanism] and Note [HF Trainer route] in ``transformers.py``)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import save_on_cpu

from .._replay.api import checkpoint
from ..errors import UnsupportedReplayError
from ..wrapper import resolve_state

_FUNCTION = "_gradient_checkpointing_func"  # what GradientCheckpointingLayer.forward calls
_REFUSED = ("state", "engine", "gradient_checkpointing_func")
_SETTING = "_torch_replay_setting"  # the model's _Setting (Note [HF Trainer route])
_ENTRY = "activation_checkpointing_enable"  # what the Trainer calls on the model


def _gradient_checkpointing_layer() -> type:
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError as e:  # pragma: no cover - depends on the installed version
        raise ImportError(
            "torch_replay.integrations.transformers needs transformers with "
            "transformers.modeling_layers.GradientCheckpointingLayer (4.53 or newer)"
        ) from e
    return GradientCheckpointingLayer


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's ``GradientCheckpointingLayer`` s, in the order transformers counts
    them for ``every_n_layers`` (``model.modules()``).

    Args:
        model: a transformers model.

    Returns:
        The layers (possibly empty).
    """
    base = _gradient_checkpointing_layer()
    return [m for m in model.modules() if isinstance(m, base)]


def _offload_device_type() -> str:
    # As transformers' offload=True (_activation_checkpointing_enable): its current
    # accelerator, or the CPU (where pinning raises, as it does for transformers).
    from transformers import modeling_utils

    return (modeling_utils.get_current_accelerator() or torch.device("cpu")).type


def _with_offload(function, *args: Any, **kwargs: Any) -> Any:
    with save_on_cpu(pin_memory=True, device_type=_offload_device_type()):
        return checkpoint(function, *args, **kwargs)


def _layer_function(layer, *, use_reentrant, replay_state, replay_engine, offload, **kwargs):
    return functools.partial(
        _with_offload if offload else checkpoint,
        use_reentrant=use_reentrant,
        replay_state=resolve_state(replay_state, layer, "layer"),
        replay_engine=replay_engine,
        **kwargs,
    )


def _check_names(kwargs: Mapping[str, Any]) -> None:
    for name in _REFUSED:
        if name in kwargs:
            hint = {"state": "replay_state=", "engine": "replay_engine="}.get(
                name, "nothing: the checkpoint function is torch_replay.checkpoint"
            )
            raise TypeError(f"torch_replay.integrations.transformers: {name}= is not taken; {hint}")


def _check(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> list[torch.nn.Module]:
    _check_names(kwargs)
    found = layers(model)
    if found and _FUNCTION not in type(found[0]).forward.__code__.co_names:
        raise UnsupportedReplayError(
            f"{type(found[0]).__name__}.forward does not call self.{_FUNCTION} (a "
            "transformers version whose GradientCheckpointingLayer works differently "
            "from the one torch_replay knows, 5.23.0), so torch_replay cannot install "
            "its checkpoint there. Use tr.checkpoint_wrapper on the layers instead. "
            "The model was not changed."
        )
    if not getattr(model, "supports_gradient_checkpointing", False) or not found:
        raise ValueError(
            f"{type(model).__name__} does not support activation checkpointing in "
            "transformers (supports_gradient_checkpointing is False or it has no "
            "GradientCheckpointingLayer), so torch_replay cannot checkpoint its layers "
            "through transformers. Wrap its blocks with tr.checkpoint_wrapper / "
            "tr.apply_activation_checkpointing instead. The model was not changed."
        )
    return found


def _is_ours(function: Any) -> bool:
    return getattr(function, "func", None) in (checkpoint, _with_offload)


def _describe(function: Any) -> str:
    """A layer's checkpoint function as a reader knows it (module.name(keywords))."""
    inner = getattr(function, "func", function)
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"
    keywords = getattr(function, "keywords", None)
    if keywords:
        name += "(" + ", ".join(f"{k}={v!r}" for k, v in keywords.items()) + ")"
    return name


@dataclass(kw_only=True, slots=True)
class _Setting:
    """What :func:`enable` / :func:`checkpoint_layers` were asked on one model, installed
    again after each later call of the model's ``activation_checkpointing_enable``
    (Note [HF Trainer route]); owned by the model (an attribute of the instance)."""

    options: dict[str, Any]
    """``use_reentrant``, ``replay_state``, ``replay_engine``, ``offload`` and the other
    keywords of ``tr.checkpoint``."""
    every_n_layers: int | None
    """The stride (transformers' count), or None where :attr:`engines` says per layer."""
    engines: list[str | None] | None
    """Per layer of :func:`layers`: None (kept) or its engine (a plan, chosen layers)."""
    original: Callable[..., Any]
    """The model's ``activation_checkpointing_enable`` before :class:`_EnableAgain`."""
    hook: Any = None
    """The handle of the forward pre-hook that looks for a replaced function."""
    warned: bool = False
    """The pre-hook warned already (once per model)."""
    layers: list[torch.nn.Module] = field(default_factory=list)
    """The layers last installed."""


class _EnableAgain:
    """The instance's ``activation_checkpointing_enable`` after :func:`enable`: the
    method it replaced, then ``tr.checkpoint`` installed again (Note [HF Trainer route]).
    Same parameters as transformers' method."""

    __slots__ = ("model",)

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(
        self,
        activation_checkpointing_kwargs: Mapping[str, Any] | None = None,
        every_n_layers: int = 1,
        offload: bool = False,
    ) -> None:
        model = self.model
        setting: _Setting = vars(model)[_SETTING]
        kwargs = dict(activation_checkpointing_kwargs or {})
        if kwargs.pop("selective", False):  # TRL's key for its own selective checkpointing
            warnings.warn(
                "torch_replay.integrations.transformers: selective=True (TRL's selective "
                "activation checkpointing) is not applied: torch_replay re-runs whole "
                "layers. Drop it from gradient_checkpointing_kwargs, or tr_hf.disable(model) "
                "to use TRL's.",
                UserWarning,
                stacklevel=2,
            )
        found = _check(model, kwargs)
        options = {**setting.options, **kwargs}
        options["offload"] = bool(options["offload"] or offload)
        stride = setting.every_n_layers
        if every_n_layers != 1:
            if setting.engines is not None:
                raise TypeError(
                    "torch_replay.integrations.transformers: this model's layers were chosen "
                    "(tr_hf.enable(budget=) or checkpoint_layers), so every_n_layers="
                    f"{every_n_layers} of activation_checkpointing_enable (the Trainer's "
                    "activation_checkpointing_kwargs) cannot apply; drop it. The model was "
                    "not changed."
                )
            if every_n_layers < 1:
                raise ValueError(f"every_n_layers must be at least 1, got {every_n_layers}")
            stride = every_n_layers
        resolve_state(options["replay_state"], found[0], "layer")  # before changing
        setting.options, setting.every_n_layers = options, stride
        _install(model, setting)


def _install(model: torch.nn.Module, setting: _Setting) -> None:
    """The model's own enable (flags, input-grad hook), then ``tr.checkpoint`` on each
    layer as ``setting`` says; attaches ``setting`` to the model."""
    found = layers(model)
    options = setting.options
    engine = options["replay_engine"]
    if setting.engines is not None:
        engines = setting.engines
    else:
        n = setting.every_n_layers
        engines = [engine if i % n == 0 else None for i in range(len(found))]
    setting.original(activation_checkpointing_kwargs={"use_reentrant": options["use_reentrant"]})
    for layer, chosen in zip(found, engines, strict=True):
        layer.gradient_checkpointing = chosen is not None
        layer._gradient_checkpointing_func = _layer_function(
            layer, **{**options, "replay_engine": chosen or engine}
        )
    setting.layers = found
    previous = vars(model).get(_SETTING)
    if previous is not setting:
        if previous is not None and previous.hook is not None:
            previous.hook.remove()
        setting.hook = model.register_forward_pre_hook(_watch)
        vars(model)[_SETTING] = setting
        vars(model)[_ENTRY] = _EnableAgain(model)


def _setting(model: torch.nn.Module, **fields: Any) -> _Setting:
    """A new setting of ``model``, keeping the method :class:`_EnableAgain` replaced."""
    previous = vars(model).get(_SETTING)
    original = previous.original if previous is not None else getattr(model, _ENTRY)
    return _Setting(original=original, **fields)


def _watch(model: torch.nn.Module, args: Any) -> None:
    """Forward pre-hook: warn once if a checkpointed layer runs another function."""
    if torch.compiler.is_compiling():
        return
    setting = vars(model).get(_SETTING)
    if setting is None or setting.warned or not model.training:
        return
    for layer in setting.layers:
        function = getattr(layer, _FUNCTION, None)
        if layer.gradient_checkpointing and not _is_ours(function):
            setting.warned = True
            warnings.warn(
                f"torch_replay.integrations.transformers: {type(layer).__name__} layers of "
                f"{type(model).__name__} are checkpointed with {_describe(function)}, not "
                "torch_replay.checkpoint: something installed it after tr_hf.enable (such "
                "as the model's _set_gradient_checkpointing called directly). Call "
                "tr_hf.enable(model) after it, or pass callbacks=[tr_hf.trainer_callback()] "
                "to the Trainer.",
                UserWarning,
                stacklevel=2,
            )
            return
