"""Which model and machine a costs file describes, and the check that refuses another model's costs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._replay.segment import state_tensors
from .workloads import Workload

# --------------------------------------------------------------- fingerprint


def describe_value(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (list, tuple)):
        return [describe_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): describe_value(x) for k, x in v.items()}
    return type(v).__name__


def describe_segment(m: Any) -> dict[str, Any]:
    cls = type(m)
    out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    if isinstance(m, torch.nn.Module):
        out["parameters"] = [
            [n, list(p.shape), str(p.dtype).replace("torch.", "")] for n, p in m.named_parameters()
        ]
        out["buffers"] = [
            [n, list(b.shape), str(b.dtype).replace("torch.", "")]
            for n, b in m.named_buffers()
            if b is not None
        ]
    elif hasattr(m, "__qualname__"):
        out["class"] = f"{getattr(m, '__module__', '?')}.{m.__qualname__}"
    return out


def _segment_names(segments: Any) -> list[str]:
    if isinstance(segments, torch.nn.Sequential):
        return [n for n, _ in segments.named_children()]
    return [str(i) for i in range(len(list(segments)))]


def model_fingerprint(segments: Any, inputs: Sequence[Any] | None = None) -> dict[str, Any]:
    """What identifies the model a costs file was measured on.

    Args:
        segments: the segments (a list of modules or an ``nn.Sequential``).
        inputs: each segment's input as seen during calibration, already
            described (shapes and dtypes), or None.

    Returns:
        ``{"digest", "segments": [{"name", "class", "parameters",
        "buffers", "input"}]}``; ``digest`` is a SHA-256 over the segments'
        classes, parameter and buffer names, shapes and dtypes (not the
        inputs: the batch may change), so two models with the same digest
        have the same structure.
    """
    import hashlib

    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    names = _segment_names(segments)
    described = [describe_segment(m) for m in mods]
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    segs = []
    for i, d in enumerate(described):
        entry = {"name": names[i], **d}
        if inputs is not None and i < len(inputs):
            entry["input"] = inputs[i]
        segs.append(entry)
    return {"digest": digest, "segments": segs}


class Kept:
    """Restores buffers, declared state, gradients and torch's CPU generator on exit.

    Calibration runs training steps; the user's model must come out as it went in.
    """

    def __init__(self, segments: Sequence[Any], state: Any) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.params: list[torch.nn.Parameter] = []
        for m in segments:
            if isinstance(m, torch.nn.Module):
                for b in m.buffers():
                    if b is not None:
                        self.tensors[id(b)] = b
                self.params.extend(m.parameters())
        for t in state_tensors(state):
            self.tensors[id(t)] = t
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.grads: list[Any] = []
        self.rng = None

    def __enter__(self) -> Kept:
        self.copies = [(t, t.detach().clone()) for t in self.tensors.values()]
        self.grads = [p.grad for p in self.params]
        self.rng = torch.get_rng_state()
        return self

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for t, c in self.copies:
                t.copy_(c)
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g
        torch.set_rng_state(self.rng)


def _record_inputs(workload: Workload) -> list[Any]:
    """Each segment's input (described) in one no-grad forward; state restored after."""
    seen: list[Any] = []
    with Kept(workload.segments, workload.state), torch.no_grad():
        h = workload.make_input()
        for seg in workload.segments:
            seen.append(describe_value(h))
            h = seg(h)
    return seen


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """The machine a calibration ran on (written into every costs file).

    Args:
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        ``{"torch", "python", "platform", "cpu", "cpus", "threads", "device"}``
        and ``"gpu"`` on CUDA.
    """
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def first_difference(want: Mapping[str, Any], have: Mapping[str, Any]) -> str:
    if want.get("class") != have.get("class"):
        return f"it is a {want.get('class')} in the costs, a {have.get('class')} here"
    for kind in ("parameters", "buffers"):
        a = {n: (s, d) for n, s, d in want.get(kind, [])}
        b = {n: (s, d) for n, s, d in have.get(kind, [])}
        for n in [*a, *(n for n in b if n not in a)]:  # registration order
            if n not in b:
                return f"{kind[:-1]} {n!r} is in the costs, not here"
            if n not in a:
                return f"{kind[:-1]} {n!r} is here, not in the costs"
            if a[n] != b[n]:
                return (
                    f"{kind[:-1]} {n!r} is {a[n][1]} {tuple(a[n][0])} in the costs, "
                    f"{b[n][1]} {tuple(b[n][0])} here"
                )
    return "their structure differs"


_RECALIBRATE = (
    "Calibrate the model you run: tr.calibrate_model(segments, example_input, state=..., "
    "out='costs.json'), `python -m torch_replay.calibrate --model pkg.module:factory "
    "--out costs.json`, or PlannedSequential(..., costs='auto')."
)


def read_costs(costs: Any, *, what: str, remedy: str) -> tuple[Mapping[str, Any], str]:
    """A costs document, loaded from its JSON file unless it is one already.

    Args:
        costs: a loaded costs document (a mapping) or the path of its JSON file.
        what: what the document holds, for messages (``"costs"``, ``"layer costs"``).
        remedy: the sentence that ends the message of an unreadable file (how to
            write a new one).

    Returns:
        The document and how messages name it (``"the costs"`` or the file).

    Raises:
        ValueError: the file cannot be read.
    """
    if isinstance(costs, Mapping):
        return costs, f"the {what}"
    source = f"{what} file {os.fspath(costs)!r}"
    try:
        return json.loads(Path(costs).read_text()), source
    except OSError as e:
        raise ValueError(f"cannot read {source}: {e}. {remedy}") from None


def check_costs(doc: Mapping[str, Any], segments: Any, *, source: str = "the costs") -> None:
    """Check that a costs document was calibrated on ``segments``, on this machine.

    Args:
        doc: a costs document (:data:`SCHEMA`) with a ``model`` section.
        segments: the segments that will run (modules or an ``nn.Sequential``).
        source: how to name the costs in messages (a file name).

    Raises:
        CostsMismatchError: another number of segments, or a segment whose
            class, parameter or buffer names, shapes or dtypes differ.

    Warns:
        UserWarning: the costs carry no fingerprint (written before it
            existed: nothing can be checked), or were measured with another
            torch version or on another CPU or GPU (costs may be stale).
    """
    import warnings

    from ..errors import CostsMismatchError

    mods = list(segments.children() if isinstance(segments, torch.nn.Sequential) else segments)
    entry = doc.get("model") or {}
    n_costs = len(entry.get("segments") or [])
    what = entry.get("description") or entry.get("factory") or "another model"
    if n_costs != len(mods):
        raise CostsMismatchError(
            f"{source} describe {n_costs} segments ({what}); this model has {len(mods)}: "
            f"the costs belong to another model. {_RECALIBRATE}"
        )
    fp = entry.get("fingerprint")
    if not fp:
        warnings.warn(
            f"{source} carry no model fingerprint (written by an older torch_replay), so "
            "they cannot be checked against this model; recalibrate to get one",
            stacklevel=3,
        )
        return
    have = model_fingerprint(mods)
    if fp.get("digest") != have["digest"]:
        for i, (want, got) in enumerate(zip(fp["segments"], have["segments"], strict=True)):
            want_s = {k: want.get(k) for k in ("class", "parameters", "buffers")}
            got_s = {k: got.get(k) for k in ("class", "parameters", "buffers")}
            if want_s != got_s:
                raise CostsMismatchError(
                    f"{source} were calibrated on another model ({what}): segment {i}"
                    + (f" ({want['name']})" if want.get("name", str(i)) != str(i) else "")
                    + f" differs: {first_difference(want, got)}. "
                    f"{_RECALIBRATE}"
                )
    machine = doc.get("machine") or {}
    here = machine_info(machine.get("device", "cpu"))
    stale = [
        f"{k} {machine[k]!r} there, {here.get(k)!r} here"
        for k in ("torch", "cpu", "gpu")
        if k in machine and machine[k] != here.get(k)
    ]
    if stale:
        warnings.warn(
            f"{source} were measured elsewhere ({'; '.join(stale)}): the plan follows those "
            "times and bytes; recalibrate on this machine for a plan that fits it",
            stacklevel=3,
        )
