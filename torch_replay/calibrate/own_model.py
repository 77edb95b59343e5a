"""Calibrating your own model: ``calibrate_model`` and ``workload_from``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..planner import OPTION_NAMES
from .config import SCHEMA, ConfigError
from .fingerprint import Kept, machine_info
from .measure import _Progress, measure_segments, measurement_count
from .workloads import Workload

# ------------------------------------------------------------ your own model


def _as_workload(made: Any, where: str) -> Workload:
    if isinstance(made, Workload) or (
        type(made).__name__ == "Workload" and hasattr(made, "make_input")
    ):
        return made
    if isinstance(made, Mapping):
        made = dict(made)
        try:
            segs, x = made.pop("segments"), made.pop("example_input")
        except KeyError as e:
            raise ConfigError(f"{where} returned a dict without {e.args[0]!r}") from None
        return workload_from(segs, x, **made)
    if isinstance(made, tuple) and len(made) in (2, 3):
        return workload_from(*made)
    raise ConfigError(
        f"{where} must return a torch_replay.calibrate.Workload, a tuple (segments, "
        f"example_input) or (segments, example_input, state), or a dict with keys "
        f"'segments', 'example_input' (and optionally 'state', 'loss_fn'); got "
        f"{type(made).__name__}"
    )


def workload_from(
    segments: Any,
    example_input: Any,
    state: Any = None,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    description: str = "",
) -> Workload:
    """A :class:`Workload` from your segments and one example input.

    Args:
        segments: an ``nn.Sequential`` or a list of modules, in program order.
        example_input: the first segment's input (a tensor: a detached clone
            is passed at every step, requiring grad when it is floating
            point), or a callable returning a fresh input.
        state: the declared state (tensors, modules, generators), as for
            :class:`~torch_replay.PlannedSequential`.
        loss_fn: maps the last output to a scalar loss (default: mean of squares).
        description: one line for reports (default: the segment classes).

    Returns:
        The :class:`Workload`.
    """
    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    if callable(example_input) and not isinstance(example_input, torch.Tensor):
        make_input = example_input
    elif isinstance(example_input, torch.Tensor):
        x0 = example_input.detach().clone()

        def make_input() -> torch.Tensor:
            x = x0.clone()
            return x.requires_grad_(True) if x.is_floating_point() else x

    else:
        raise TypeError(
            "example_input must be a tensor or a callable returning the first segment's "
            f"input, got {type(example_input).__name__}"
        )
    if not description:
        kinds = [type(m).__name__ for m in mods]
        description = f"{len(mods)} segments: " + ", ".join(_cut(kinds, 6))
    return Workload(
        segments=mods,
        state=list(state) if state is not None else [],
        make_input=make_input,
        loss_fn=loss_fn,
        description=description,
    )


def _cut(items: Sequence[str], limit: int) -> list[str]:
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… ({len(items) - limit} more, {len(items)} in all)"]


def calibrate_model(
    segments: Any,
    example_input: Any = None,
    *,
    state: Any = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    options: Sequence[str] | None = None,
    reps: int = 3,
    warmup: int = 1,
    quick: bool = False,
    device: str | None = None,
    progress: bool = True,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Measure the options of each segment of **your** model; return (and write) its costs.

    Every option of ``options`` runs one training step per repetition on the
    whole sequence (forward, ``loss_fn``, backward); ``guard`` is tried one
    segment at a time where the snapshot run saw no write to declared state.
    Buffers, declared state, gradients and torch's CPU generator are restored
    afterwards. The costs carry the model's fingerprint (segment names,
    classes, parameter and buffer shapes and dtypes, each segment's input
    shape and dtype) and the machine (torch version, CPU, GPU), which
    :class:`~torch_replay.PlannedSequential` checks.

    Args:
        segments: an ``nn.Sequential`` or a list of modules, or a
            :class:`Workload` (then ``example_input``, ``state`` and
            ``loss_fn`` come from it).
        example_input: the first segment's input (tensor or callable).
        state: the declared state, as for ``PlannedSequential``.
        loss_fn: maps the last output to a scalar (default: mean of squares).
            Put there what your training step does between forward and
            backward (an in-place queue update), so the options are measured
            and refused as your step would run them.
        options: option names (default: all five).
        reps: timed steps per option (median kept).
        warmup: untimed steps before them.
        quick: the small run: one timed step, no warm-up (noisier times,
            the same byte counts).
        device: ``"cpu"`` or ``"cuda"`` (default: where the first parameter lives).
        progress: draw a progress bar on stderr.
        out: also write the costs JSON there.

    Returns:
        The costs document (:data:`SCHEMA`); give it, or the file, to
        ``PlannedSequential(costs=...)``.

    Raises:
        ConfigError: an unknown option name or a bad count.
    """
    if isinstance(segments, Workload):
        w = segments
    else:
        if example_input is None:
            raise TypeError("calibrate_model needs example_input (the first segment's input)")
        w = workload_from(segments, example_input, state, loss_fn=loss_fn)
    opts = list(options) if options is not None else list(OPTION_NAMES)
    for o in opts:
        if o not in OPTION_NAMES:
            raise ConfigError(f"unknown option {o!r}; options are {OPTION_NAMES}")
    if "eager" not in opts:
        raise ConfigError("options must include 'eager' (the planner needs a valid option)")
    if quick:
        reps, warmup = 1, 0
    if reps < 1 or warmup < 0:
        raise ConfigError("reps must be >= 1 and warmup >= 0")
    if device is None:
        device = "cpu"
        for m in w.segments:
            if isinstance(m, torch.nn.Module):
                p = next(m.parameters(), None)
                if p is not None:
                    device = p.device.type
                    break
    bar = _Progress(measurement_count(opts, len(w.segments)), progress)
    with Kept(w.segments, w.state):
        res = measure_segments(
            w, opts, reps=reps, warmup=warmup, device=device, progress=bar.update
        )
    doc = {
        "schema": SCHEMA,
        "config": {"options": opts, "reps": reps, "warmup": warmup, "device": device},
        "machine": machine_info(device),
        "time_unit": "s",
        "grid": [],
        "model": {"factory": None, "kwargs": {}, "description": w.description, **res},
    }
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc
