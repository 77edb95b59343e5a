"""``tr.checkpoint_wrapper`` / ``tr.apply_activation_checkpointing``: torch.distributed's
wrapper API (``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``) with
``tr.checkpoint`` inside.

Note [Wrapper identity]
FSDP (``fully_shard`` and FSDP1's state-dict code), Lightning's ``FSDPStrategy`` and
accelerate look for torch's ``CheckpointWrapper`` (``isinstance``) and its prefix
``_checkpoint_wrapped_module.`` to unwrap state dicts, and skip their own activation
checkpointing when a model already holds one. So the wrapper here *is* a
``CheckpointWrapper`` (a subclass that only changes the checkpoint function it is built
with): ``__getattr__``, ``named_parameters`` and state-dict hooks are inherited
unchanged, and the state-dict keys are the unwrapped module's, as with torch's wrapper.

Its ``checkpoint_impl`` is *not* torch's ``CheckpointImpl``: it is
:class:`ReplayCheckpointImpl` (``REENTRANT`` / ``NO_REENTRANT``, as ``use_reentrant``).
Torch's value says "torch.utils.checkpoint runs this, and its re-run repeats the
segment's state writes", and code reads it that way: torchtitan's MoE load balancing
(``register_moe_load_balancing_hook``) halves ``tokens_per_expert`` of every block
whose ``checkpoint_impl is CheckpointImpl.NO_REENTRANT``, since torch's re-run counts
the tokens twice. torch_replay's re-run restores the segment's state (declared or
preserved), so the tokens are counted once, as in eager, and halving them moved the
expert bias away from eager's from the second step on. In torch 2.13 the only other
reader of ``checkpoint_impl`` is torch's ``CheckpointWrapper`` itself: its
``__init__`` derives ``use_reentrant`` from it only when no ``checkpoint_fn`` is
given (here one always is), and its ``forward`` packs keyword arguments for the
reentrant variant when it equals ``CheckpointImpl.REENTRANT``, so :meth:`forward`
here does that packing itself (torch's ``_pack_kwargs`` / ``_unpack_kwargs``). FSDP,
Lightning and accelerate look at the class (``isinstance``), never at this value.

The wrapped module is declared state by default (``replay_state="module"``): its
buffers and parameters are preserved for the re-run (BatchNorm statistics,
spectral-norm vectors, quantization observers, router biases), see
``docs/replay_contract.md``. The module object itself is declared, so its tensors are
collected on every call (FSDP2's sharded parameters by their local shard, Note [FSDP
traffic] in ``fsdp.py``).

Note [Nested wrappers]
A stack's own activation checkpointing can wrap again what torch_replay already wraps:
accelerate's FSDP2 plugin with ``activation_checkpointing=True``
(``accelerate.utils.fsdp_utils.fsdp2_apply_ac``) wraps every layer its policy selects
with torch's ``checkpoint_wrapper(layer, preserve_rng_state=False)`` and does not skip
wrapped ones (Lightning's helper does). Its transformer policy looks through
``_checkpoint_wrapped_module`` and walks bottom-up, so the layer inside ours is wrapped:
``ours(torch's(layer))``; a size-based policy wraps ours as well:
``torch's(ours(torch's(layer)))``. Either nest silently gave torch's result. At each
forward (not under ``torch.compile``, whose checkpoint region is one):

- torch's wrapper anywhere *inside* ours (a size-based policy also wraps the layer's
  submodules): ours wins, since our segment keeps nothing inside itself anyway. Its
  ``checkpoint_fn`` becomes a plain call, so it stays in the tree (its FSDP hooks and
  state-dict keys stay) but checkpoints nothing, and a ``UserWarning`` says so, naming
  the setting to turn off.
- ours inside torch's non-reentrant checkpoint (its forward or its re-run: the saved-tensor
  hooks on top are ``torch.utils.checkpoint``'s): torch's re-run would run this segment
  again, state writes and all, and nothing here can undo that, so
  ``UnsupportedReplayError`` names the setting to turn off. (Inside torch's *reentrant*
  checkpoint the forward runs under ``no_grad``, which looks like evaluation: not
  detected.)
"""

from __future__ import annotations

import enum
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as _torch_apply,
)
from torch.distributed.utils import _pack_kwargs, _unpack_kwargs

from ._replay.api import checkpoint
from .errors import UnsupportedReplayError

if TYPE_CHECKING:
    from .layer_budget import LayerPlan

__all__ = [
    "ReplayCheckpointImpl",
    "ReplayCheckpointWrapper",
    "apply_activation_checkpointing",
    "checkpoint_modules",
    "checkpoint_wrapper",
    "resolve_state",
]

_OWN_KEYWORDS = ("state", "engine", "checkpoint_fn", "checkpoint_impl")


def resolve_state(replay_state: Any, owner: torch.nn.Module, word: str) -> Any:
    """The ``state=`` that ``replay_state`` means for ``owner``.

    Args:
        replay_state: ``word`` (``"module"`` or ``"layer"``: the owner itself), ``None``
            (nothing declared), or an iterable of tensors, modules and generators
            (declared as ``state=``).
        owner: the wrapped module or layer.
        word: the string that stands for ``owner``.

    Returns:
        ``[owner]``, ``None`` or ``replay_state`` itself.

    Raises:
        ValueError: another string.
    """
    if isinstance(replay_state, str):
        if replay_state != word:
            raise ValueError(
                f"replay_state must be {word!r} (declare the {word} itself), None "
                f"(declare nothing) or a list of tensors, modules and generators; got "
                f"{replay_state!r}"
            )
        return [owner]
    return replay_state


class ReplayCheckpointImpl(enum.Enum):
    """The ``checkpoint_impl`` of a :class:`ReplayCheckpointWrapper`: the re-run sees
    the forward's state and does not repeat its state writes, unlike torch's
    ``CheckpointImpl`` members, which it deliberately is not (Note [Wrapper
    identity])."""

    REENTRANT = enum.auto()
    NO_REENTRANT = enum.auto()


class ReplayCheckpointWrapper(CheckpointWrapper):
    """torch's ``CheckpointWrapper`` whose checkpoint function is ``tr.checkpoint``
    (Note [Wrapper identity]); built by :func:`checkpoint_wrapper`. Its
    ``checkpoint_impl`` is a :class:`ReplayCheckpointImpl`."""

    def __init__(
        self,
        mod: torch.nn.Module,
        *,
        use_reentrant: bool,
        replay_state: Any,
        replay_engine: str,
        **checkpoint_kwargs: Any,
    ) -> None:
        impl = (
            ReplayCheckpointImpl.REENTRANT if use_reentrant else ReplayCheckpointImpl.NO_REENTRANT
        )
        super().__init__(
            mod,
            impl,
            checkpoint,
            use_reentrant=use_reentrant,
            replay_state=resolve_state(replay_state, mod, "module"),
            replay_engine=replay_engine,
            **checkpoint_kwargs,
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            _refuse_torch_checkpoint_around(self)
            _disarm_torch_wrappers_inside(self)
        module = self._checkpoint_wrapped_module
        if self.checkpoint_impl is ReplayCheckpointImpl.REENTRANT and kwargs:
            # torch's forward does this for CheckpointImpl.REENTRANT: the reentrant
            # checkpoint takes positional arguments only.
            flat_args, kwarg_keys = _pack_kwargs(*args, **kwargs)

            def run(*inputs: Any) -> Any:
                unpacked_args, unpacked_kwargs = _unpack_kwargs(inputs, kwarg_keys)
                return module(*unpacked_args, **unpacked_kwargs)

            return self.checkpoint_fn(run, *flat_args)
        return self.checkpoint_fn(module, *args, **kwargs)


_TURN_OFF = (
    "turn the stack's own activation checkpointing off (accelerate: "
    "FullyShardedDataParallelPlugin(activation_checkpointing=False), "
    "fsdp_activation_checkpointing: false in its config; torch: do not call "
    "apply_activation_checkpointing on a model torch_replay already wraps)"
)


def _run_plainly(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The ``checkpoint_fn`` of a torch wrapper that ours has disarmed."""
    return function(*args, **kwargs)


def _disarm_torch_wrappers_inside(wrapper: ReplayCheckpointWrapper) -> None:
    """Torch's ``CheckpointWrapper`` modules inside ``wrapper`` call their module
    plainly from now on (Note [Nested wrappers])."""
    for inner in wrapper._checkpoint_wrapped_module.modules():
        if (
            isinstance(inner, CheckpointWrapper)
            and not isinstance(inner, ReplayCheckpointWrapper)
            and inner.checkpoint_fn is not _run_plainly
        ):
            inner.checkpoint_fn = _run_plainly
            warnings.warn(
                "torch_replay: torch's CheckpointWrapper was applied inside a module that "
                "torch_replay already checkpoints (accelerate's FSDP plugin with "
                "activation_checkpointing=True does this); torch_replay's checkpoint is "
                "used and torch's wrapper now runs its module without checkpointing. To "
                f"silence this, {_TURN_OFF}.",
                UserWarning,
                stacklevel=4,
            )


def _refuse_torch_checkpoint_around(wrapper: ReplayCheckpointWrapper) -> None:
    """Raises when ``wrapper`` runs inside ``torch.utils.checkpoint``'s non-reentrant
    forward or re-run (Note [Nested wrappers])."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is not None and getattr(hooks[0], "__module__", None) == "torch.utils.checkpoint":
        inner = type(wrapper._checkpoint_wrapped_module).__name__
        raise UnsupportedReplayError(
            f"torch_replay's checkpoint wrapper (around {inner}) runs inside "
            "torch.utils.checkpoint: torch's CheckpointWrapper was applied around a module "
            "torch_replay already wraps (accelerate's FSDP plugin with "
            "activation_checkpointing=True and a size-based policy does this), and torch's "
            "re-run would run torch_replay's segment again, with its state writes. To "
            f"train with torch_replay's checkpoint, {_TURN_OFF}."
        )


def checkpoint_wrapper(
    module: torch.nn.Module,
    *,
    use_reentrant: bool = False,
    replay_state: Any = "module",
    replay_engine: str = "auto",
    **checkpoint_kwargs: Any,
) -> CheckpointWrapper:
    """Wrap ``module`` so that every call runs through :func:`torch_replay.checkpoint`.

    The twin of ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.
    checkpoint_wrapper``: the result is an instance of torch's ``CheckpointWrapper``
    with torch's state-dict keys, so FSDP, Lightning and accelerate recognise and
    unwrap it (Note [Wrapper identity]).

    Args:
        module: the module to checkpoint.
        use_reentrant: ``False`` (default, torch's ``CheckpointImpl.NO_REENTRANT``) or
            ``True`` (``CheckpointImpl.REENTRANT``; keyword arguments of the module are
            packed into positional ones as torch's wrapper does). The wrapper's
            ``checkpoint_impl`` is the :class:`ReplayCheckpointImpl` of that name.
        replay_state: ``"module"`` (default: the module's buffers and parameters are
            declared state), ``None`` (nothing declared) or a list, as ``state=``.
        replay_engine: the preservation engine (``engine=`` of ``tr.checkpoint``).
        **checkpoint_kwargs: the other keywords of :func:`torch_replay.checkpoint`
            (``preserve_rng_state``, ``context_fn``, ``determinism_check``, ``debug``,
            ``early_stop``).

    Returns:
        The wrapped module (a :class:`ReplayCheckpointWrapper`).

    Raises:
        TypeError: ``checkpoint_fn`` / ``checkpoint_impl`` (the function is
            ``tr.checkpoint``; use ``use_reentrant``) or ``state`` / ``engine`` (spelled
            ``replay_state`` / ``replay_engine`` here).
        ValueError: ``replay_state`` is a string other than ``"module"``.
    """
    _refuse_own_keywords(checkpoint_kwargs, "checkpoint_wrapper")
    return ReplayCheckpointWrapper(
        module,
        use_reentrant=use_reentrant,
        replay_state=replay_state,
        replay_engine=replay_engine,
        **checkpoint_kwargs,
    )


def apply_activation_checkpointing(
    model: torch.nn.Module,
    *,
    check_fn: Callable[[torch.nn.Module], bool] = lambda _: True,
    auto_wrap_policy: Callable[..., bool] | None = None,
    budget: int | None = None,
    example_input: Any = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    step_memory: Any = None,
    costs: Any = None,
    calibration: Mapping[str, Any] | None = None,
    **wrapper_kwargs: Any,
) -> LayerPlan | None:
    """Wrap the submodules of ``model`` that ``check_fn`` (or ``auto_wrap_policy``)
    selects with :func:`checkpoint_wrapper`, in place; with ``budget=``, only those the
    exact planner chooses.

    The twin of torch's ``apply_activation_checkpointing``, with the same selection
    (torch's own function does the walk): the root is never wrapped, a policy takes
    precedence over ``check_fn``. With ``budget=`` (Note [Layer plans] in
    ``layer_budget.py``), each distinct selected module is calibrated once on
    ``example_input``, the planner picks per module keep (not wrapped) or checkpoint
    with an engine, and the plan is applied and returned.

    Args:
        model: the model, changed in place.
        check_fn: called with each submodule; ``True`` wraps it (with ``budget=``: makes
            it a candidate; of nested candidates the outermost is planned).
        auto_wrap_policy: an FSDP-style wrap policy (a callable or a ``_Policy``); not
            with ``budget=``.
        budget: memory budget of one training step in bytes (None: wrap every selected
            module, as torch).
        example_input: with ``budget=``: the model's input (a tensor, a tuple of
            arguments or a dict of keyword arguments) for the calibration.
        loss_fn: with ``budget=``: maps the model's output to the loss (default: its
            ``.loss``, else the mean of squares of its first tensor).
        step_memory: with ``budget=``: the persistent bytes, a
            :class:`torch_replay.layer_budget.StepMemory` (default: two optimizer
            slots per trainable parameter, as AdamW; gradients cleared before the step
            and charged per layer from its backward on) or a byte count.
        costs: with ``budget=``: a layer costs file (or dict) written by an earlier
            plan (``calibration={"out": path}``), checked against ``model``.
        calibration: with ``budget=``: ``quick``, ``reps``, ``warmup``, ``options``,
            ``progress`` of :func:`torch_replay.calibrate_model`, and ``out``.
        **wrapper_kwargs: keywords of :func:`checkpoint_wrapper` (``use_reentrant``,
            ``replay_state``, ``replay_engine`` and the checkpoint keywords); a list
            ``replay_state`` is declared for every wrapped module. With ``budget=``, a
            ``replay_engine`` other than ``"auto"`` limits the plan to that engine.

    Returns:
        None (``model`` is modified in place); with ``budget=``, the applied
        :class:`torch_replay.layer_budget.LayerPlan` (a :class:`torch_replay.Plan`).

    Raises:
        TypeError, ValueError: as :func:`checkpoint_wrapper`, before ``model`` changes.
        TypeError: ``example_input``, ``loss_fn``, ``step_memory``, ``costs`` or
            ``calibration`` without ``budget=``; ``budget=`` without ``example_input=``
            or with ``auto_wrap_policy=`` (nothing is changed).
        ValueError: with ``budget=``, ``check_fn`` selects no submodule (nothing is
            changed).
        InfeasibleBudgetError: no plan fits ``budget`` (its ``min_budget`` is the
            smallest feasible budget); the model is not changed.
        CostsMismatchError: ``costs`` were calibrated on another model.
    """
    _refuse_own_keywords(wrapper_kwargs, "apply_activation_checkpointing")
    resolve_state(wrapper_kwargs.get("replay_state", "module"), model, "module")  # check early
    if budget is not None:
        return _apply_budget(
            model,
            check_fn,
            auto_wrap_policy,
            budget=budget,
            example_input=example_input,
            loss_fn=loss_fn,
            step_memory=step_memory,
            costs=costs,
            calibration=calibration,
            **wrapper_kwargs,
        )
    unused = {"example_input": example_input, "loss_fn": loss_fn, "step_memory": step_memory}
    unused.update(costs=costs, calibration=calibration)
    for name, value in unused.items():
        if value is not None:
            raise TypeError(f"torch_replay.apply_activation_checkpointing: {name}= needs budget=")
    _torch_apply(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, **wrapper_kwargs),
        check_fn=check_fn,
        auto_wrap_policy=auto_wrap_policy,
    )


def checkpoint_modules(
    model: torch.nn.Module, modules: Iterable[torch.nn.Module], **wrapper_kwargs: Any
) -> None:
    """Wrap exactly ``modules`` (submodules of ``model``) with :func:`checkpoint_wrapper`
    and leave every other module as it is (the per-layer step a planner applies).

    Args:
        model: the model, changed in place.
        modules: the submodules to checkpoint.
        **wrapper_kwargs: as :func:`apply_activation_checkpointing`.

    Returns:
        None.
    """
    chosen = {id(m) for m in modules}
    apply_activation_checkpointing(model, check_fn=lambda m: id(m) in chosen, **wrapper_kwargs)


def _apply_budget(model, check_fn, auto_wrap_policy, *, budget, example_input, **kwargs):
    """The ``budget=`` path of :func:`apply_activation_checkpointing`."""
    from .layer_budget import outermost

    if auto_wrap_policy is not None:
        raise TypeError(
            "torch_replay.apply_activation_checkpointing: budget= plans the modules check_fn "
            "selects; give check_fn instead of auto_wrap_policy"
        )
    if example_input is None:
        raise TypeError(
            "torch_replay.apply_activation_checkpointing: budget= needs example_input= "
            "(the model's input, to calibrate each distinct module once)"
        )
    plan_kw = {k: kwargs.pop(k) for k in ("loss_fn", "step_memory", "costs", "calibration")}
    replay_state = kwargs.get("replay_state", "module")
    engine = kwargs.pop("replay_engine", "auto")
    candidates = outermost(model, check_fn)
    if not candidates:
        raise ValueError(
            "torch_replay.apply_activation_checkpointing: check_fn selects no submodule of "
            f"{type(model).__name__}, so there is nothing to plan. The model was not changed."
        )
    chosen = plan_budget(
        model, candidates, example_input, budget, replay_state, "module", engine, **plan_kw
    )
    by_engine: dict[str, list[torch.nn.Module]] = {}
    for m, choice in zip(candidates, chosen.choices, strict=True):
        if choice != "eager":
            by_engine.setdefault(choice, []).append(m)
    for name, mods in by_engine.items():
        checkpoint_modules(model, mods, replay_engine=name, **kwargs)
    return chosen


def plan_budget(model, layers, example, budget, replay_state, kind, engine, **plan_kw):
    """The layer plan of a ``budget=`` call (``apply_activation_checkpointing``,
    ``tr_hf.enable``): :func:`~torch_replay.layer_budget.plan_layers` on one step of
    ``example``, each layer's declared state resolved from ``replay_state`` as ``kind``
    (``"module"`` or ``"layer"``, the word its errors use)."""
    from .layer_budget import plan_layers, run_example

    return plan_layers(
        model,
        layers,
        run_example(model, example),
        budget=budget,
        state_of=lambda m: resolve_state(replay_state, m, kind),
        engine=engine,
        **plan_kw,
    )


def _refuse_own_keywords(kwargs: dict[str, Any], where: str) -> None:
    for name in _OWN_KEYWORDS:
        if name in kwargs:
            hint = (
                f"replay_{name}="
                if name in ("state", "engine")
                else "use_reentrant= (the checkpoint function is torch_replay.checkpoint)"
            )
            raise TypeError(f"torch_replay.{where}: {name}= is not taken here; use {hint}")
