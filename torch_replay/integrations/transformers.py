"""Hugging Face transformers: ``enable(model)`` checkpoints a model's layers with
``tr.checkpoint``, through transformers' own mechanism.

Note [HF checkpointing mechanism]
Every layer of a transformers model that can be checkpointed is a
``GradientCheckpointingLayer`` (``transformers/modeling_layers.py``). Its ``forward`` is
wrapped at class creation: when ``self.gradient_checkpointing and self.training`` it
drops the KV cache (``use_cache=False``, ``past_key_values=None``) and calls
``self._gradient_checkpointing_func(partial(forward, self, **kwargs), *args)``. The
model's ``_set_gradient_checkpointing`` (``modeling_utils.py``) sets that flag and that
function on every module that has a ``gradient_checkpointing`` attribute, counting only
the ``GradientCheckpointingLayer`` s for ``every_n_layers``; the public
``activation_checkpointing_enable`` also makes the embeddings' output require grad (for
the reentrant variant) and, with ``offload=True``, wraps the function in
``save_on_cpu(pin_memory=True)``. It has no parameter for the checkpoint function.

So :func:`enable` calls the model's own ``activation_checkpointing_enable`` (the flags,
``every_n_layers``, the input-grad hook, a subclass's override), then replaces the
function it installed on each layer with ``tr.checkpoint`` bound to that layer's
options. The layer's forward takes ``**kwargs``, so torch_replay's options are spelled
``replay_state=`` / ``replay_engine=`` (Note [Option spelling] in ``checkpoint.py``).
:func:`disable` is the model's ``activation_checkpointing_disable``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.graph import save_on_cpu

from ..checkpoint import checkpoint
from ..errors import UnsupportedReplayError
from ..wrapper import resolve_state

if TYPE_CHECKING:
    from ..layer_budget import LayerPlan

__all__ = ["checkpoint_layers", "disable", "enable", "layers"]

_FUNCTION = "_gradient_checkpointing_func"  # what GradientCheckpointingLayer.forward calls
_REFUSED = ("state", "engine", "gradient_checkpointing_func")


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


def _check(model: torch.nn.Module, kwargs: dict[str, Any]) -> list[torch.nn.Module]:
    for name in _REFUSED:
        if name in kwargs:
            hint = {"state": "replay_state=", "engine": "replay_engine="}.get(
                name, "nothing: the checkpoint function is torch_replay.checkpoint"
            )
            raise TypeError(f"torch_replay.integrations.transformers: {name}= is not taken; {hint}")
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


def checkpoint_layers(
    model: torch.nn.Module,
    chosen: Iterable[torch.nn.Module],
    *,
    use_reentrant: bool = False,
    replay_state: Any = "layer",
    replay_engine: str = "auto",
    offload: bool = False,
    **checkpoint_kwargs: Any,
) -> None:
    """Checkpoint exactly the layers ``chosen`` with ``tr.checkpoint`` and leave the
    model's other ``GradientCheckpointingLayer`` s unwrapped (what :func:`enable` does
    once it has picked every n-th layer; also for a planner that picks the layers).

    Turns transformers' checkpointing on through the model's own
    ``activation_checkpointing_enable`` (its flags on the other modules, the input-grad
    hook), then sets each layer's flag and function (Note [HF checkpointing mechanism]).

    Args:
        model: a transformers model.
        chosen: layers of ``model`` to checkpoint.
        use_reentrant: as :func:`enable`.
        replay_state: as :func:`enable`.
        replay_engine: as :func:`enable`.
        offload: as :func:`enable`.
        **checkpoint_kwargs: as :func:`enable`.

    Returns:
        None (``model`` is changed in place).

    Raises:
        ValueError: a layer in ``chosen`` is not one of the model's layers, the model
            does not support checkpointing, or ``replay_state`` is a string other than
            ``"layer"`` (nothing is changed).
        TypeError, UnsupportedReplayError: as :func:`enable` (nothing is changed).
    """
    all_layers = _check(model, checkpoint_kwargs)
    resolve_state(replay_state, all_layers[0], "layer")  # refuse a bad value before changing
    picked = {id(m) for m in chosen}
    unknown = picked - {id(m) for m in all_layers}
    if unknown:
        raise ValueError(
            f"{len(unknown)} of the chosen modules are not GradientCheckpointingLayers of "
            f"{type(model).__name__}; pick them from torch_replay.integrations."
            "transformers.layers(model). The model was not changed."
        )
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": use_reentrant}
    )
    for layer in all_layers:
        layer.gradient_checkpointing = id(layer) in picked
        layer._gradient_checkpointing_func = _layer_function(
            layer,
            use_reentrant=use_reentrant,
            replay_state=replay_state,
            replay_engine=replay_engine,
            offload=offload,
            **checkpoint_kwargs,
        )


def enable(
    model: torch.nn.Module,
    *,
    every_n_layers: int = 1,
    use_reentrant: bool = False,
    replay_state: Any = "layer",
    replay_engine: str = "auto",
    offload: bool = False,
    budget: int | None = None,
    example_batch: Mapping[str, Any] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    step_memory: Any = None,
    costs: Any = None,
    calibration: Mapping[str, Any] | None = None,
    **checkpoint_kwargs: Any,
) -> LayerPlan | None:
    """Turn on activation checkpointing of ``model``'s layers with ``tr.checkpoint``.

    The torch_replay twin of ``model.activation_checkpointing_enable(...)`` (Note [HF
    checkpointing mechanism]): the same layers are checkpointed, the KV cache is dropped
    as transformers does, and each layer is declared state by default, so a router bias
    or BatchNorm statistics it holds are preserved for the re-run.

    Args:
        model: a transformers ``PreTrainedModel`` built on ``GradientCheckpointingLayer``.
        every_n_layers: checkpoint every n-th layer (transformers' count).
        use_reentrant: ``False`` (default, as transformers) or ``True``.
        replay_state: ``"layer"`` (default: each checkpointed layer's buffers and
            parameters are declared), ``None`` (nothing declared) or a list of
            tensors, modules and generators declared for every layer.
        replay_engine: the preservation engine (``engine=`` of ``tr.checkpoint``).
        offload: hold the tensors kept for the re-run (the layers' inputs) in pinned
            host memory, as transformers' ``offload=True``.
        budget: memory budget of one training step in bytes (None: checkpoint every
            n-th layer). With it, each distinct layer is calibrated once on
            ``example_batch``, the exact planner picks per layer keep (not
            checkpointed) or checkpoint with an engine, and the plan is applied (Note
            [Layer plans] in ``torch_replay/layer_budget.py``).
        example_batch: with ``budget=``: the model's keyword arguments for one step
            (``input_ids``, ``labels``, ...); the model runs in the mode it is in.
        loss_fn: with ``budget=``: maps the output to the loss (default: ``.loss``,
            else the mean of squares of the first tensor).
        step_memory: with ``budget=``: the persistent bytes, a
            :class:`torch_replay.layer_budget.StepMemory` (default: two optimizer
            slots per trainable parameter, as AdamW; gradients cleared before the step
            and charged per layer from its backward on) or a byte count.
        costs: with ``budget=``: a layer costs file (or dict) from an earlier plan
            (``calibration={"out": path}``), checked against ``model``.
        calibration: with ``budget=``: ``quick``, ``reps``, ``warmup``, ``options``,
            ``progress`` of :func:`torch_replay.calibrate_model`, and ``out``.
        **checkpoint_kwargs: other keywords of :func:`torch_replay.checkpoint`
            (``preserve_rng_state``, ``context_fn``, ``determinism_check``, ``debug``,
            ``early_stop``).

    Returns:
        None (``model`` is changed in place; undo with :func:`disable`); with
        ``budget=``, the applied :class:`torch_replay.layer_budget.LayerPlan` (a
        :class:`torch_replay.Plan`).

    Raises:
        ValueError: the model does not support checkpointing, or ``replay_state`` is a
            string other than ``"layer"`` (nothing is changed).
        UnsupportedReplayError: the installed transformers' layers do not call the
            function transformers installs (a version this does not know).
        TypeError: ``state=`` / ``engine=`` (spelled ``replay_state=`` /
            ``replay_engine=`` here) or ``gradient_checkpointing_func=``; ``example_batch``,
            ``loss_fn``, ``step_memory``, ``costs`` or ``calibration`` without ``budget=``;
            ``budget=`` without a dict ``example_batch=`` or with ``every_n_layers=``
            (nothing is changed).
        InfeasibleBudgetError: no plan fits ``budget`` (its ``min_budget`` is the
            smallest feasible budget); the model is not changed.
        CostsMismatchError: ``costs`` were calibrated on another model.
    """
    options = dict(use_reentrant=use_reentrant, replay_state=replay_state, offload=offload)
    if budget is not None:
        if every_n_layers != 1:
            raise TypeError(
                "torch_replay.integrations.transformers: budget= plans every layer; drop every_n_layers="
            )
        plan_kw = dict(
            loss_fn=loss_fn, step_memory=step_memory, costs=costs, calibration=calibration
        )
        return _enable_budget(
            model, budget, example_batch, plan_kw, replay_engine, options, checkpoint_kwargs
        )
    unused = dict(example_batch=example_batch, loss_fn=loss_fn, step_memory=step_memory)
    unused.update(costs=costs, calibration=calibration)
    for name, value in unused.items():
        if value is not None:
            raise TypeError(f"torch_replay.integrations.transformers: {name}= needs budget=")
    if every_n_layers < 1:
        raise ValueError(f"every_n_layers must be at least 1, got {every_n_layers}")
    checkpoint_layers(
        model,
        layers(model)[::every_n_layers],  # transformers' count (_set_gradient_checkpointing)
        replay_engine=replay_engine,
        **options,
        **checkpoint_kwargs,
    )


@contextlib.contextmanager
def _not_checkpointed(found: Iterable[torch.nn.Module]):
    """Layers run plainly inside (an earlier enable() undone for the calibration)."""
    saved = [(m, m.__dict__.get("gradient_checkpointing", _UNSET)) for m in found]
    for m, _ in saved:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m, flag in saved:
            if flag is _UNSET:
                del m.gradient_checkpointing
            else:
                m.gradient_checkpointing = flag


_UNSET = object()


def _enable_budget(model, budget, example_batch, plan_kw, engine, options, checkpoint_kwargs):
    """The ``budget=`` path of :func:`enable`."""
    from ..layer_budget import plan_layers, run_example

    found = _check(model, checkpoint_kwargs)
    replay_state = options["replay_state"]
    resolve_state(replay_state, found[0], "layer")  # refuse a bad value before changing
    if not isinstance(example_batch, Mapping):
        raise TypeError(
            "torch_replay.integrations.transformers: budget= needs example_batch= (the "
            "model's keyword arguments for one step, a dict such as {'input_ids': ids, "
            f"'labels': ids}}), got {type(example_batch).__name__}"
        )
    with _not_checkpointed(found):
        chosen = plan_layers(
            model,
            found,
            run_example(model, example_batch),
            budget=budget,
            state_of=lambda m: resolve_state(replay_state, m, "layer"),
            drop_cache=True,
            engine=engine,
            **plan_kw,
        )
    picked = [m for m, c in zip(found, chosen.choices, strict=True) if c != "eager"]
    checkpoint_layers(model, picked, **options, **checkpoint_kwargs)
    for layer, choice in zip(found, chosen.choices, strict=True):
        if choice != "eager":
            layer._gradient_checkpointing_func = _layer_function(
                layer, replay_engine=choice, **options, **checkpoint_kwargs
            )
    return chosen


def disable(model: torch.nn.Module) -> None:
    """Turn activation checkpointing off again (the model's
    ``activation_checkpointing_disable``).

    Args:
        model: a transformers model.

    Returns:
        None.
    """
    model.activation_checkpointing_disable()
