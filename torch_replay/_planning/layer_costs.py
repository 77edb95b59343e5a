"""What a layer plan measures and reads back: each layer's captured arguments, its
one-segment calibration, the bytes outside the layers, and the layer costs file
(``torch_replay.layer_costs/3``) with its checks against the model."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ..calibrate.fingerprint import (
    Kept,
    describe_segment,
    describe_value,
    first_difference,
    machine_info,
    read_costs,
)
from ..errors import CostsMismatchError
from .options import Option, rerun_floor
from .peak import LiveBytesTracker, static_bytes

LAYER_SCHEMA = "torch_replay.layer_costs/3"
"""Version tag of a layer costs file (2: outside bytes measured with gradients cleared;
3: each group's ``forward``, the keep option's forward time, for the re-run floor)."""


CACHE_KEYWORDS = {"use_cache": False, "past_key_values": None, "layer_past": None}


# ----------------------------------------------------------------- capture


def capture_layer_inputs(
    model: torch.nn.Module, layers: Sequence[torch.nn.Module], call: Callable[[], Any]
) -> list[tuple[tuple, dict]]:
    """Each layer's (args, kwargs) in one no-grad run of ``call``; model state restored."""
    seen: list[tuple[tuple, dict] | None] = [None] * len(layers)

    def keep(v: Any) -> Any:
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    def hook_for(i: int):
        def hook(module, args, kwargs):
            if seen[i] is None:
                seen[i] = (tree_map(keep, tuple(args)), tree_map(keep, dict(kwargs)))

        return hook

    handles = [
        m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(layers)
    ]
    try:
        with Kept([model], None), torch.no_grad():
            call()
    finally:
        for h in handles:
            h.remove()
    missing = [i for i, s in enumerate(seen) if s is None]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(layers)} layers did not run in the example call "
            f"(first: layer {missing[0]}); give an example input that runs every layer"
        )
    return seen  # type: ignore[return-value]


class BoundLayer(torch.nn.Module):
    """A layer bound to its captured arguments: ``forward(x)`` calls it with ``x`` as its
    first input and returns its first tensor output (a one-segment workload)."""

    def __init__(self, layer: torch.nn.Module, args: tuple, kwargs: dict, drop_cache: bool) -> None:
        super().__init__()
        self.layer = layer
        self.rest = args[1:]
        self.kwargs = dict(kwargs)
        if drop_cache:  # as GradientCheckpointingLayer does for a checkpointed layer
            self.kwargs.update({k: v for k, v in CACHE_KEYWORDS.items() if k in kwargs})
        self.keyword = None if args else next(iter(kwargs))
        if self.keyword is not None:
            self.kwargs.pop(self.keyword)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.keyword is None:
            out = self.layer(x, *self.rest, **self.kwargs)
        else:
            out = self.layer(**{self.keyword: x}, **self.kwargs)
        while isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
            out = out[0]
        return out


def first_input(args: tuple, kwargs: dict) -> torch.Tensor:
    x = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"a layer's first argument is a {type(x).__name__}, not a tensor: the layers "
            "a budget plans must take the hidden state first"
        )
    return x


def layer_fingerprint(layer: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    return {**describe_segment(layer), "input": describe_value([list(args), kwargs])}


def model_digest(model: torch.nn.Module, names: Sequence[str]) -> str:
    described = {"model": describe_segment(model), "layers": list(names)}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


# -------------------------------------------------------------- calibration


def calibrate_groups(
    reps: Sequence[BoundLayer], states: Sequence[Any], inputs: Sequence[torch.Tensor], kw: dict
) -> list[dict[str, Any]]:
    from ..calibrate import calibrate_model

    out = []
    for bound, state, x in zip(reps, states, inputs, strict=True):
        with torch.enable_grad():
            doc = calibrate_model([bound], x, state=state, **kw)
        runs = [r for r in doc["model"]["options"].values() if r.get("written_bytes")]
        written = max((r["written_bytes"][0] for r in runs), default=None)
        forward = doc["model"].get("eager_forward")
        out.append(
            {"options": doc["model"]["segments"][0], "config": doc["config"]}
            | {"written": written, "forward": forward[0] if forward else None}
        )
    return out


def measure_outside(
    model: torch.nn.Module,
    last: torch.nn.Module,
    call: Callable[[], Any],
    loss_fn: Callable[[Any], torch.Tensor],
) -> tuple[int, int]:
    """Tracked peaks of one training step with every layer kept, gradients cleared first
    (they count from their creation on): (until the gradient of ``last``'s output, the
    head's phase; from there on), each with the parameters and buffers."""
    with Kept([model], None):
        for p in model.parameters():
            p.grad = None
        static = static_bytes([*model.parameters(), *model.buffers()])
        tracker = LiveBytesTracker()
        split: list[int] = []

        def at_output_grad(grad: torch.Tensor) -> None:
            if not split:
                tracker.sample()
                split.append(tracker.peak)
                tracker.mark()

        def on_output(module, args, out) -> None:
            found = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if found and found[0].requires_grad:
                found[0].register_hook(at_output_grad)

        handle = last.register_forward_hook(on_output)
        try:
            with torch.enable_grad(), tracker:
                loss_fn(call()).backward()
        finally:
            handle.remove()
        tracker.sample()
        if not split:  # the hook did not run: one phase
            return static + tracker.peak, static + tracker.peak
        return static + split[0], static + tracker.window_peak


def costs_doc(model, names, prints, groups, group_costs, outside, device) -> dict[str, Any]:
    return {
        "schema": LAYER_SCHEMA,
        "machine": machine_info(device),
        "model": {
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "digest": model_digest(model, names),
            "structure": describe_segment(model),
            "layers": [
                {"name": n, "group": g, "fingerprint": f}
                for n, g, f in zip(names, groups, prints, strict=True)
            ],
        },
        "groups": group_costs,
        "outside": outside,
    }


RECALIBRATE = (
    "Plan without costs= (each distinct layer is calibrated on the example), and write "
    "the new costs with calibration={'out': 'layer_costs.json'}."
)


def read_layer_costs(costs: Any, model, names, prints) -> Mapping[str, Any]:
    doc, source = read_costs(costs, what="layer costs", remedy=RECALIBRATE)
    schema = str(doc.get("schema"))
    if schema != LAYER_SCHEMA and schema.startswith(LAYER_SCHEMA.rsplit("/", 1)[0] + "/"):
        raise ValueError(
            f"{source} are layer costs of another version ({schema}, this torch_replay "
            f"reads {LAYER_SCHEMA}: each layer's forward time for the re-run floor). "
            f"{RECALIBRATE}"
        )
    if doc.get("schema") != LAYER_SCHEMA:
        raise ValueError(
            f"{source} is not a {LAYER_SCHEMA} document (schema={doc.get('schema')!r}): "
            f"a PlannedSequential costs file describes segments, not a model's layers. "
            f"{RECALIBRATE}"
        )
    entry = doc.get("model") or {}
    want = entry.get("layers") or []
    what = entry.get("class", "another model")
    if len(want) != len(names):
        raise CostsMismatchError(
            f"{source} describe {len(want)} layers of {what}; this model has {len(names)} "
            f"selected layers: the costs belong to another model. {RECALIBRATE}"
        )
    if entry.get("digest") != model_digest(model, names):
        for i, (w, name, have) in enumerate(zip(want, names, prints, strict=True)):
            w_s = {k: w["fingerprint"].get(k) for k in ("class", "parameters", "buffers")}
            h_s = {k: have.get(k) for k in ("class", "parameters", "buffers")}
            if w["name"] != name or w_s != h_s:
                why = (
                    f"it is {w['name']!r} there, {name!r} here"
                    if w["name"] != name
                    else first_difference(w["fingerprint"], have)
                )
                raise CostsMismatchError(
                    f"{source} were calibrated on another model ({what}): layer {i} "
                    f"differs: {why}. {RECALIBRATE}"
                )
        why = first_difference(entry.get("structure") or {}, describe_segment(model))
        raise CostsMismatchError(
            f"{source} were calibrated on another model ({what}): outside its layers, "
            f"{why}. {RECALIBRATE}"
        )
    moved = [n for w, n, h in zip(want, names, prints, strict=True) if w["fingerprint"] != h]
    if moved:
        warnings.warn(
            f"{source} were measured with other layer inputs (first: {moved[0]}): bytes and "
            "times scale with the batch, so the plan may not fit the budget; calibrate with "
            "the batch you train with",
            stacklevel=4,
        )
    return doc


def layer_grads(layers: Sequence[torch.nn.Module]) -> list[int]:
    """Each layer's gradient bytes (its trainable parameters)."""
    return [
        sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad) for m in layers
    ]


def floored_options(group: Mapping[str, Any], name: str) -> list[Option]:
    """A group's options with the re-run floor (Note [Re-run floor] in
    ``torch_replay/planner.py``): with an ample budget every layer keeps its
    activations, whatever noise the calibrated times carry."""
    options = [Option(**o) for o in group["options"]]
    eager_option(group["options"], name)  # the floor needs the keep option
    forward = group.get("forward")
    if forward is None:
        raise ValueError(
            f"layer {name}: its costs have no forward time of the keep option (the "
            f"re-run floor needs it). {RECALIBRATE}"
        )
    return rerun_floor(options, forward)


def eager_option(options: Sequence[Mapping[str, Any]], name: str) -> Option:
    for o in options:
        if o["name"] == "eager":
            return Option(**o)
    raise ValueError(f"layer {name}: the calibration has no 'eager' option; include it")
