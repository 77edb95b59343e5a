"""Budget plans for layer-wise models: which layers keep their activations and which are
checkpointed (and with which engine), from measured per-layer costs.

Note [Layer plans]
A layer-wise model (a transformers model's ``GradientCheckpointingLayer`` s, or the blocks
``tr.apply_activation_checkpointing`` selects) is not a ``PlannedSequential``: its layers
take keyword arguments (masks, position embeddings) and the model runs code between them
(embeddings, the head, the loss). :func:`plan_layers` plans it as follows.

1. **Capture.** One forward of the example call, without gradients, records each layer's
   arguments (pre-hooks); buffers, gradients and torch's CPU generator are restored after.
2. **Group.** A layer's fingerprint is its class, parameter and buffer names, shapes and
   dtypes and its arguments' shapes and dtypes (as in a costs file,
   ``torch_replay.calibrate.fingerprint``). Layers with the same fingerprint form a group.
3. **Calibrate** one layer per group with :func:`torch_replay.calibrate_model`'s machinery
   (``measure_segments``): the layer is bound to its captured keyword arguments and run
   as a one-segment workload with every option (``eager`` and the engines); its declared
   state is what the application declares (``replay_state``). Identical layers share the
   group's costs.
4. **Outside bytes.** The model's memory outside its layers is one tracked training step
   with every layer kept and gradients cleared first, in two phases split at the
   gradient of the last layer's output: until then (the forward and the head's backward:
   the logits, their gradient, the loss) ``head = measured - (parameters and buffers +
   outside + sum(eager retained))``; from then on (the layers' backward: the head's
   gradients, what the embeddings keep) ``outside = measured - (parameters and buffers
   + ordered peak of every layer kept)`` (each at least 0). The all-kept prediction is
   then the measured step by construction; the other plans are predicted from the
   layer costs.
5. **Plan** with the exact ordered planner (:func:`torch_replay._planning.layer_order.plan_ordered`,
   Note [Ordered layer peak] in ``csrc/core/ordered_planner.h``). The predicted peak is
   ``step + outside + max(floor, head + sum_j retained_j, max_i (sum_{j<=i} retained_j
   + transient_i + sum_{j>i} grads_j))``, whose terms are:

   * ``step`` (:class:`StepMemory`): parameters and buffers (distinct storages), the
     optimizer's slots (``optimizer_slots x`` the trainable bytes: AdamW's ``exp_avg``
     and ``exp_avg_sq`` exist from the first step on) and ``extra``; gradients only with
     ``grads=True`` (a step that holds them throughout). By default the step clears them
     (``zero_grad(set_to_none=True)``, torch's default), so they are not persistent;
   * ``grads_j``: layer ``j``'s gradients, alive from its backward on. Counting every
     gradient as persistent (as the first version of this planner did) over-predicts the
     peak by the gradients of the layers not yet differentiated at the peak: up to
     all of them (24 MiB of the Llama benchmark's 140 MiB step);
   * ``retained_j``, ``transient_i``: the calibration's costs of the layer's option
     (``measure_segments``, gradients cleared, so a layer's ``transient`` holds the
     gradients its backward creates; a checkpointed layer's ``retained`` is its input
     plus what its engine preserves, its ``transient`` the re-run's activations);
   * ``outside``, ``head``: step 4, the model outside its layers through the layers'
     backward and, in addition, beside every layer's retained bytes before it. The
     model error, tested in ``tests/test_layer_budget.py`` against ``measure_step``:
     the measured peak at most 5 % above the prediction and the prediction at most 5 %
     above it (``docs/integrations.md`` has the benchmark's figures);
   * ``floor``: every gradient, held after the layers' backward, and the temporaries of
     the optimizer's step (:attr:`StepMemory.step_temporaries`); ``outside`` is added
     to it too (it holds the head's gradients), an over-count by what else it holds
     where the optimizer's step is the peak (small models).

   **Engines.** For a layer whose declared state its forward does not write (the
   calibration's engines saw no declared write: a Llama layer's parameters), nothing is
   restored before its re-run, so an engine that keeps more bytes than another valid
   one buys nothing: ``guard`` and ``journal`` keep nothing beyond the layer's input,
   ``snapshot`` and ``readset`` copy the state; such engines are dropped before
   planning, whatever their calibrated times (which differ by noise, not work: tens of
   percent between engines on a shared machine). For a layer that writes its state,
   an engine is dropped where another keeps fewer bytes and is not slower by more than
   :data:`~torch_replay._planning.layer_order.TIME_TOLERANCE`
   (:func:`~torch_replay._planning.layer_order.lean_options`). Times are the thread's
   CPU time when torch computes on one thread (``SegmentRunner.profile_step``), so
   other processes on the machine do not decide between engines. Before that, each
   checkpointed option's time is raised to at least the keep option's time plus the
   layer's forward (its re-run; Note [Re-run floor] in ``torch_replay/planner.py``), so
   noise never makes a re-run look cheaper than keeping: with an ample budget every
   layer keeps its activations. Each journaled layer
   pays its own log (the layers' declared states are their own). An infeasible budget
   raises :class:`~torch_replay.InfeasibleBudgetError` before anything is changed.

The costs (groups, outside bytes, the model's fingerprint) can be written to a file and
given back (``costs=``); costs of another model raise
:class:`~torch_replay.CostsMismatchError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ._planning.layer_costs import (
    LAYER_SCHEMA,
    BoundLayer,
    calibrate_groups,
    capture_layer_inputs,
    costs_doc,
    eager_option,
    first_input,
    floored_options,
    layer_fingerprint,
    layer_grads,
    measure_outside,
    read_layer_costs,
)
from ._planning.layer_order import TIME_TOLERANCE, lean_options, ordered_peak, plan_ordered
from ._planning.peak import default_loss, static_bytes
from .errors import InfeasibleBudgetError
from .planner import Option, Plan

__all__ = [
    "LAYER_SCHEMA",
    "TIME_TOLERANCE",
    "LayerPlan",
    "StepMemory",
    "outermost",
    "plan_layers",
    "run_example",
    "step_loss",
]


@dataclass(kw_only=True, slots=True)
class StepMemory:
    """What the training step holds for its whole length besides activations: the
    persistent bytes of a layer plan (an explicit assumption; state yours).

    The bytes are ``parameters and buffers`` (distinct storages) ``+ grads x trainable
    + optimizer_slots x trainable + extra``, where ``trainable`` is the bytes of the
    parameters that require grad.
    """

    grads: bool = False
    """One ``.grad`` per trainable parameter held through the step (gradient
    accumulation, ``zero_grad(set_to_none=False)``). False (default): the step clears
    them first (``zero_grad(set_to_none=True)``, torch's default) and each layer's
    gradients are charged from its backward on (Note [Layer plans])."""
    optimizer_slots: int = 2
    """Tensors of each trainable parameter's size the optimizer holds: 2 for Adam and
    AdamW (``exp_avg``, ``exp_avg_sq``), 1 for SGD with momentum, 0 for plain SGD."""
    extra: int = 0
    """Any other bytes held throughout (a data batch on the device, a queue)."""
    step_temporaries: int = 2
    """Tensors of the largest trainable parameter's size that ``optimizer.step()``
    allocates at once, beside every gradient: 2 for torch's single-tensor Adam and AdamW
    (the default on CPU), 0 for SGD. A ``foreach`` or fused step allocates per parameter
    list: count those bytes in ``extra``."""

    def floor(self, model: torch.nn.Module) -> int:
        """The bytes held in ``optimizer.step()`` besides the persistent ones: every
        gradient (unless ``grads`` holds them persistently) and the step's temporaries.

        Args:
            model: the whole model.

        Returns:
            Bytes.
        """
        sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
        grads = 0 if self.grads else sum(sizes)
        return grads + self.step_temporaries * max(sizes, default=0)

    def bytes(self, model: torch.nn.Module) -> int:
        """The persistent bytes of ``model`` under this assumption.

        Args:
            model: the whole model.

        Returns:
            Bytes.
        """
        static = static_bytes([*model.parameters(), *model.buffers()])
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        return (
            static
            + (trainable if self.grads else 0)
            + self.optimizer_slots * trainable
            + self.extra
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerPlan(Plan):
    """A :class:`~torch_replay.Plan` over a model's layers (one segment per layer).

    ``choices[i]`` is ``"eager"`` (the layer keeps its activations and is not
    checkpointed) or the engine layer ``i`` is checkpointed with.
    """

    layer_names: list[str] = field(default_factory=list)
    """Each layer's module path in the model."""
    groups: list[int] = field(default_factory=list)
    """Each layer's group (identical layers share one calibration)."""
    step_bytes: int = 0
    """The :class:`StepMemory` part of ``persistent``."""
    outside_bytes: int = 0
    """The model's memory outside its layers (Note [Layer plans]), part of ``persistent``."""
    grads: list[int] = field(default_factory=list)
    """Each layer's gradient bytes, alive from its backward on (0 with
    ``StepMemory(grads=True)``: then they are part of ``step_bytes``)."""
    floor: int = 0
    """Bytes held after the layers' backward besides ``persistent`` (every gradient)."""
    head_bytes: int = 0
    """Bytes beside every layer's retained bytes before the last layer's backward (the
    head's logits, the loss's backward), besides ``persistent``."""
    layer_options: list[list[Option]] = field(default_factory=list)
    """Each layer's options as planned (after dropping the beaten engines)."""

    def __str__(self) -> str:
        fit = "fits" if self.fits else f"OVER by {_mib(self.overshoot)} MiB"
        lines = [
            f"layer plan: predicted peak {_mib(self.peak)} MiB, budget {_mib(self.budget)} MiB "
            f"({fit}), time {self.time * 1e3:.4g} ms; {len(set(self.groups))} distinct "
            f"layer(s) calibrated for {len(self.layer_names)}",
            f"  {'layer':<28}{'group':>6}  {'choice':<24}{'retained MiB':>13}"
            f"{'transient MiB':>14}{'time ms':>9}",
        ]
        for name, g, o in zip(self.layer_names, self.groups, self.options, strict=True):
            what = "kept" if o.name == "eager" else f"checkpointed ({o.name})"
            lines.append(
                f"  {name[-28:]:<28}{g:>6}  {what:<24}{_mib(o.retained):>13}"
                f"{_mib(o.transient):>14}{o.time * 1e3:>9.3f}"
            )
        lines.append(
            f"  peak = step {_mib(self.step_bytes)} + outside the layers "
            f"{_mib(self.outside_bytes)} + max(head {_mib(self.head_bytes)} + retained, over "
            f"layers i: retained up to i + transient of i + gradients after i) "
            f"{_mib(self.peak - self.persistent)} MiB (retained "
            f"{_mib(self.retained)}, max transient {_mib(self.transient)}, gradients "
            f"{_mib(sum(self.grads))}); smallest feasible budget {_mib(self.min_budget)} MiB"
        )
        return "\n".join(lines)

    @property
    def checkpointed(self) -> list[str]:
        """Names of the layers that are checkpointed."""
        return [n for n, c in zip(self.layer_names, self.choices, strict=True) if c != "eager"]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def step_loss(out: Any) -> torch.Tensor:
    """The default loss of a layer plan's example step: ``out.loss`` when the output
    carries one (a transformers model given labels), else the mean of squares of its
    first tensor.

    Args:
        out: the model's output.

    Returns:
        A scalar tensor.
    """
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    while not isinstance(out, torch.Tensor):
        out = out.to_tuple()[0] if hasattr(out, "to_tuple") else out[0]
    return default_loss(out)


# ------------------------------------------------------------------- plan


def plan_layers(
    model: torch.nn.Module,
    layers: Sequence[torch.nn.Module],
    call: Callable[[], Any],
    *,
    budget: int,
    state_of: Callable[[torch.nn.Module], Any],
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    step_memory: StepMemory | int | None = None,
    costs: Any = None,
    calibration: Mapping[str, Any] | None = None,
    drop_cache: bool = False,
    engine: str = "auto",
) -> LayerPlan:
    """Plan which of ``model``'s ``layers`` keep their activations (Note [Layer plans]).

    Nothing is applied and the model comes out as it went in; the entry points
    (``tr.apply_activation_checkpointing(..., budget=)``, ``tr_hf.enable(..., budget=)``)
    apply the returned plan.

    Args:
        model: the whole model (its parameters and the code outside the layers count).
        layers: the layers to plan, in program order, none inside another.
        call: runs the model's forward on the example batch and returns its output.
        budget: memory budget of one training step, in bytes.
        state_of: the declared state of a layer when checkpointed (``replay_state``).
        loss_fn: maps the model's output to the loss (default :func:`step_loss`).
        step_memory: the persistent bytes: a :class:`StepMemory` (default: two
            optimizer slots, as AdamW, gradients cleared before the step) or an exact byte
            count (gradients then charged per layer as cleared).
        costs: a layer costs file (or its dict) written before; checked against the model.
        calibration: keywords of :func:`torch_replay.calibrate_model` (``quick``,
            ``reps``, ``warmup``, ``options``, ``progress``) and ``out`` (write the
            layer costs there).
        drop_cache: calibrate with ``use_cache=False`` / ``past_key_values=None`` as a
            checkpointed transformers layer runs.
        engine: a replay engine: each layer is either kept or checkpointed with it
            (the calibration's ``options`` default to ``["eager", engine]``);
            ``"auto"``: every option.

    Returns:
        The :class:`LayerPlan`.

    Raises:
        InfeasibleBudgetError: no plan fits ``budget``; ``min_budget`` says what does.
        CostsMismatchError: ``costs`` belong to another model.
        ValueError: a layer did not run in the example call, or unreadable costs.
    """
    kw = dict(calibration or {})
    if engine != "auto":
        kw.setdefault("options", ["eager", engine])
    out = kw.pop("out", None)
    kw.setdefault("progress", False)
    if kw.pop("quick", False):  # one warm-up: otherwise the first option measured pays it
        kw.setdefault("reps", 1)
        kw.setdefault("warmup", 1)
    loss_fn = loss_fn or step_loss
    names_of = {id(m): n for n, m in model.named_modules()}
    names = [names_of.get(id(m), f"layer{i}") for i, m in enumerate(layers)]
    calls = capture_layer_inputs(model, layers, call)
    prints = [layer_fingerprint(m, a, k) for m, (a, k) in zip(layers, calls, strict=True)]
    keys = [json.dumps(p, sort_keys=True) for p in prints]
    first = {k: i for i, k in reversed(list(enumerate(keys)))}
    order = sorted(first.values())
    groups = [order.index(first[k]) for k in keys]
    device = next((p.device.type for p in model.parameters()), "cpu")
    if costs is not None:
        doc = read_layer_costs(costs, model, names, prints)
    else:
        bound = [BoundLayer(layers[i], *calls[i], drop_cache) for i in order]
        group_costs = calibrate_groups(
            bound,
            [state_of(layers[i]) for i in order],
            [first_input(*calls[i]) for i in order],
            kw,
        )
        eager = [
            eager_option(g["options"], names[i]) for g, i in zip(group_costs, order, strict=True)
        ]
        base = StepMemory(optimizer_slots=0).bytes(model)
        kept = [eager[g] for g in groups]
        cleared = layer_grads(layers)
        layers_kept = ordered_peak(kept, cleared, floor=StepMemory(step_temporaries=0).floor(model))
        head_phase, rest = measure_outside(model, layers[-1], call, loss_fn)
        low = max(0, rest - base - layers_kept)
        outside = {
            "bytes": low,
            "head": max(0, head_phase - base - low - sum(o.retained for o in kept)),
            "measured_all_kept": max(head_phase, rest),
        }
        doc = costs_doc(model, names, prints, groups, group_costs, outside, device)
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    options = [
        lean_options(
            floored_options(doc["groups"][g], names[groups.index(g)]),
            unwritten=doc["groups"][g].get("written") == 0,
        )
        for g in groups
    ]
    memory = step_memory if isinstance(step_memory, StepMemory) else StepMemory()
    if isinstance(step_memory, int) and not isinstance(step_memory, bool):
        step = step_memory
    else:
        step = memory.bytes(model)
    grads = [0] * len(layers) if memory.grads else layer_grads(layers)
    floor = memory.floor(model)
    outside_bytes = int(doc["outside"]["bytes"])
    head = int(doc["outside"].get("head", 0))
    try:
        chosen = plan_ordered(
            options, grads, budget=budget, persistent=step + outside_bytes, floor=floor, head=head
        )
    except InfeasibleBudgetError as e:
        raise InfeasibleBudgetError(
            f"no layer plan of {type(model).__name__} fits budget={budget} bytes: the "
            f"smallest feasible budget is {e.min_budget} bytes ({e.min_budget / 2**20:.2f} "
            f"MiB), with persistent bytes {step} (StepMemory: parameters, buffers, "
            f"optimizer state{', gradients' if memory.grads else ''}) and {outside_bytes} "
            "outside the layers, for the leanest choice per layer. Raise the budget, or lower "
            "the persistent bytes (a smaller batch, fewer optimizer slots). The model was not "
            "changed.",
            min_budget=e.min_budget,
        ) from None
    return LayerPlan(
        **{f.name: getattr(chosen, f.name) for f in fields(Plan)},
        layer_names=names,
        groups=groups,
        step_bytes=step,
        outside_bytes=outside_bytes,
        grads=grads,
        floor=floor,
        head_bytes=head,
        layer_options=options,
    )


def run_example(model: torch.nn.Module, example: Any) -> Callable[[], Any]:
    """The example call of a layer plan: ``model(**example)`` for a mapping (a
    transformers batch), ``model(*example)`` for a tuple, else ``model(example)``.

    Args:
        model: the model.
        example: its input.

    Returns:
        A function of no arguments that runs the forward and returns the output.
    """
    if isinstance(example, Mapping):
        return lambda: model(**example)
    if isinstance(example, tuple):
        return lambda: model(*example)
    return lambda: model(example)


def outermost(
    model: torch.nn.Module, pick: Callable[[torch.nn.Module], bool]
) -> list[torch.nn.Module]:
    """The submodules ``pick`` selects that are inside no other selected one (program
    order is ``model.modules()``'s); the root is never selected, as torch's
    ``apply_activation_checkpointing``.

    Args:
        model: the model.
        pick: the selection (``check_fn``).

    Returns:
        The modules.
    """
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():
        if m is model or id(m) in inside or not pick(m):
            continue
        found.append(m)
        inside.update(id(s) for s in m.modules())
    return found
