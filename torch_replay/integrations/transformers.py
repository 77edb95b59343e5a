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
``replay_state=`` / ``replay_engine=`` (Note [Option spelling] in ``torch_replay/_replay/api.py``).
:func:`disable` is the model's ``activation_checkpointing_disable``.

Note [HF Trainer route]
``Trainer.train()`` (and TRL's ``SFTTrainer``, whose ``gradient_checkpointing`` is on by
default) calls ``model.activation_checkpointing_enable(activation_checkpointing_kwargs=,
every_n_layers=, offload=)`` when ``TrainingArguments(gradient_checkpointing=True)``,
which installs torch's checkpoint on every layer again. transformers looks that method up
on the instance (``hasattr``), and its own ``gradient_checkpointing_enable`` alias and
``_is_overridden`` treat a function set on the instance as the model's entry point (TRL's
selective checkpointing wraps the instance's method the same way). So :func:`enable`
records what it was asked (a :class:`_Setting` on the model) and sets the instance's
``activation_checkpointing_enable`` to :class:`_EnableAgain`, which calls the method it
replaced (transformers' flags, the input-grad hook, any wrapper) and then installs
``tr.checkpoint`` again, with the call's ``every_n_layers`` / ``offload`` /
``activation_checkpointing_kwargs`` over the recorded options wherever they differ from
transformers' defaults (1, ``False``, none): ``gradient_checkpointing_kwargs=
{"replay_engine": "journal"}`` in ``TrainingArguments`` selects an engine. Nothing of
transformers is patched globally; :func:`disable` removes both.

Order-free route: :func:`trainer_callback` runs :func:`enable` at ``on_train_begin``,
after the Trainer's own enable, with the Trainer's ``activation_checkpointing_kwargs``.

Anything that still installs another function on a layer (``_set_gradient_checkpointing``
called directly, a model object the Trainer made itself) is caught by a forward pre-hook
on the model: the first training forward that finds a checkpointed layer without
``tr.checkpoint`` warns once, naming the function it found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..wrapper import plan_budget, resolve_state
from ._hf_layers import (
    _ENTRY,
    _SETTING,
    _check,
    _check_names,
    _EnableAgain,
    _install,
    _setting,
    layers,
)

if TYPE_CHECKING:
    from ..layer_budget import LayerPlan

__all__ = ["checkpoint_layers", "disable", "enable", "layers", "trainer_callback"]


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
    A later call of the model's ``activation_checkpointing_enable`` (``Trainer.train()``
    with ``gradient_checkpointing=True``) installs the same layers again (Note [HF
    Trainer route]).

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
    engines = [replay_engine if id(m) in picked else None for m in all_layers]
    options = dict(use_reentrant=use_reentrant, replay_state=replay_state, offload=offload)
    options.update(replay_engine=replay_engine, **checkpoint_kwargs)
    _install(model, _setting(model, options=options, every_n_layers=None, engines=engines))


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

    It stays on through the model's own ``activation_checkpointing_enable``: a
    ``transformers.Trainer`` (or TRL's ``SFTTrainer``) with ``gradient_checkpointing=True``
    built before or after this call installs ``tr.checkpoint`` again, with its
    ``gradient_checkpointing_kwargs`` (``every_n_layers``, ``offload``, ``use_reentrant``,
    ``replay_engine``, ...) over these options where they differ from transformers'
    defaults (Note [HF Trainer route]). :func:`trainer_callback` needs no order at all.
    If something installs another function on a checkpointed layer all the same, its
    first training forward warns once, naming that function.

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
    found = _check(model, checkpoint_kwargs)
    resolve_state(replay_state, found[0], "layer")  # refuse a bad value before changing
    options.update(replay_engine=replay_engine, **checkpoint_kwargs)
    # every n-th layer: transformers' count (_set_gradient_checkpointing)
    _install(model, _setting(model, options=options, every_n_layers=every_n_layers, engines=None))


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
        chosen = plan_budget(
            model,
            found,
            example_batch,
            budget,
            replay_state,
            "layer",
            engine,
            drop_cache=True,
            **plan_kw,
        )
    engines = [None if c == "eager" else c for c in chosen.choices]
    options = {**options, "replay_engine": engine, **checkpoint_kwargs}
    _install(model, _setting(model, options=options, every_n_layers=None, engines=engines))
    return chosen


def disable(model: torch.nn.Module) -> None:
    """Turn activation checkpointing off again (the model's
    ``activation_checkpointing_disable``), and remove what :func:`enable` set on the
    model (its ``activation_checkpointing_enable`` is transformers' again).

    Args:
        model: a transformers model.

    Returns:
        None.
    """
    setting = vars(model).pop(_SETTING, None)
    if setting is not None:
        if setting.hook is not None:
            setting.hook.remove()
        if isinstance(vars(model).get(_ENTRY), _EnableAgain):
            del vars(model)[_ENTRY]
    model.activation_checkpointing_disable()


def trainer_callback(**options: Any) -> Any:
    """A ``transformers.TrainerCallback`` that checkpoints the Trainer's model with
    ``tr.checkpoint``, whatever the order of the calls: ``Trainer(...,
    callbacks=[tr_hf.trainer_callback()])`` (also TRL's ``SFTTrainer``).

    At ``on_train_begin`` (after the Trainer's own ``activation_checkpointing_enable``)
    it calls :func:`enable` on the model with ``options``, then the model's
    ``activation_checkpointing_enable`` with the Trainer's ``every_n_layers``, ``offload``
    and ``activation_checkpointing_kwargs`` (Note [HF Trainer route]: those win where they
    differ from transformers' defaults). With the Trainer's ``activation_checkpointing``
    off, only :func:`enable` runs: the callback asks for checkpointing.

    Args:
        **options: keywords of :func:`enable` (``replay_engine=``, ``budget=`` with
            ``example_batch=``, ...).

    Returns:
        The callback.

    Raises:
        ImportError: transformers is not installed.
        TypeError: ``options`` has a keyword :func:`enable` refuses (checked here, before
            training).
    """
    _check_names(options)
    from transformers import TrainerCallback

    class ReplayCallback(TrainerCallback):
        """Runs ``tr_hf.enable`` on the Trainer's model at ``on_train_begin``."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            enable(model, **options)
            if getattr(args, "activation_checkpointing", False):
                trainer_kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None) or {})
                getattr(model, _ENTRY)(
                    activation_checkpointing_kwargs=trainer_kwargs,
                    every_n_layers=trainer_kwargs.pop("every_n_layers", 1),
                    offload=trainer_kwargs.pop("offload", False),
                )

    return ReplayCallback()
