"""Is my model safe to checkpoint? One observed forward and backward, a verdict per segment.

::

    report = tr.audit(model, x)          # each child module is a candidate segment
    print(report)                        # a table, then each segment; report.to_dict() / to_json()

    python -m torch_replay.audit mymodel:make [--json] [--segments a,b.c]

``make()`` returns ``(module_or_fn, example_inputs)``; ``mymodel`` is a module found from
the current directory (or give a file: ``path/to/mymodel.py:make``). For each candidate
segment the report lists the hidden state a checkpoint re-run can get wrong: buffers and
parameters mutated in forward, tensors read that are not inputs (and whether something
writes them later: at the bytes read, or elsewhere in their storage), generators drawn from (default and explicit), storages aliased under
different views or dtypes, overlapping writes, integer writes on gradient paths. The
verdict says whether ``torch.utils.checkpoint`` would be exact and, if not, what goes wrong
(a double update of state, or a wrong gradient, measured by running the segment alone under
eager and under ``torch.utils.checkpoint``: Note [Audit probe] in ``probe.py``), the
``torch_replay.checkpoint`` call to write (with its ``state=[...]``, spelled
``replay_state=`` where the segment takes ``**kwargs``), which engine ``engine="auto"``
chooses and how many bytes it keeps. The model is left exactly as it was (bytes, ``.grad``,
version counters, generators). Operators are seen by a C++ recorder on the checkpoint
observer's facts and judged with its exact byte footprints (Note [Audit recorder] in
``csrc/aten/audit_recorder.h``), so the audit and ``torch_replay.checkpoint`` agree on what
overlaps and what is written. Exit status: 0 when every segment is exact under
``torch.utils.checkpoint``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from .._replay.naming import accepts_keyword, held_objects
from .observe import _Auditor, _default_loss, _resolve_state, _verdict
from .probe import _Snapshot, model_tensors, probe
from .report import _OUTSIDE, _ROOT, AuditReport, SegmentAudit

__all__ = ["AuditReport", "SegmentAudit", "audit", "main"]


def audit(
    module_or_fn: nn.Module | Callable,
    *example_inputs: Any,
    segments: Iterable[str] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    probe_engines: bool = True,
) -> AuditReport:
    """Run one forward and backward under observation and audit each candidate segment.

    Args:
        module_or_fn: an ``nn.Module`` (candidate segments: each direct child by default,
            the elements of an ``nn.ModuleList`` / ``nn.ModuleDict`` child in its place) or
            a function (one candidate segment: the function).
        *example_inputs: its inputs.
        segments: module paths of the candidate segments (``""`` is the whole module).
        loss_fn: maps the output to a scalar to differentiate (default: the sum of every
            output tensor that requires grad).
        probe_engines: also run each segment alone under eager PyTorch,
            ``torch.utils.checkpoint`` and ``torch_replay.checkpoint`` (Note [Audit probe]
            in probe.py): the gradient error of each against eager, the engine ``auto``
            chooses and its retained bytes.

    Returns:
        An :class:`AuditReport`; ``str(report)`` is readable, ``report.to_dict()`` is data.

    Raises:
        ValueError: a named segment does not exist, or the output cannot be differentiated.

    The model is left exactly as it was: the bytes, ``.grad`` and version counters of
    its parameters and buffers (and of the inputs and of the tensors a function holds),
    and the default and the model's explicit generators.

    A ``RuntimeError`` raised by the model itself (for example torch refusing a raw
    overlapping copy) does not propagate: it is in ``report.error`` and the segments show
    what was observed up to it.
    """
    return _audit(module_or_fn, example_inputs, segments, loss_fn, probe_engines)


def _audit(module_or_fn, example_inputs, segments, loss_fn, probe_engines) -> AuditReport:
    root = module_or_fn if isinstance(module_or_fn, nn.Module) else None
    held = (
        held_objects(module_or_fn, (nn.Module, torch.Tensor, torch.Generator))
        if root is None
        else []
    )
    a = _Auditor(root, example_inputs, held)
    handles = []
    fns: dict[str, Callable] = {}
    if root is not None:
        names = list(segments) if segments is not None else _candidate_segments(root)
        mods = dict(root.named_modules())
        for n in names:
            if n not in mods:
                raise ValueError(f"no submodule named {n!r} in {type(root).__name__}")
            m = mods[n]
            label = n or _ROOT
            fns[label] = m

            def pre(mod, args, kwargs, label=label):
                a.enter(label, type(mod).__name__, args, kwargs)

            def post(mod, args, output):
                a.leave(output)

            # First in, last out: the module's own hooks (spectral norm's power
            # iteration, an observer's) run inside the segment, as they do under a
            # checkpoint of the module.
            handles.append(m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
            handles.append(m.register_forward_hook(post))
        target = type(root).__name__
        run = root
    else:
        fn = module_or_fn
        label = getattr(fn, "__name__", "fn")
        fns[label] = fn

        def run(*args):
            a.enter(label, "function", args)
            out = None
            try:
                out = fn(*args)
                return out
            finally:
                a.leave(out)

        target = label
    inputs = [t for t in tree_leaves(list(example_inputs)) if isinstance(t, torch.Tensor)]
    tensors, modules = model_tensors(root, held, inputs)
    gens = _generators(root) + [g for _, g in held if isinstance(g, torch.Generator)]
    snap = _Snapshot(tensors, gens, modules)
    error = None
    try:
        with a.recording():
            out = run(*example_inputs)
            loss = (loss_fn or _default_loss)(out)
            a.start_backward()
            loss.backward()
    except RuntimeError as exc:  # the model itself fails: report what was seen up to there
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        for h in handles:
            h.remove()
        while a.stack:
            a.leave()
        snap.restore()  # the model as it was: the observed step leaves nothing behind
    report = AuditReport(target=target, segments=[], error=error)
    try:
        a.analyse()
        params = [t for t in snap.tensors if t.requires_grad and t.is_leaf]
        for name in a.order:
            seg = a.segments[name]
            verdict = _verdict(a, seg)
            fn = fns[name]
            verdict.inputs, verdict.keywords = len(seg.first_args), sorted(seg.first_kwargs)
            if accepts_keyword(fn, "state") is not False:
                verdict.state_keyword = "replay_state"
            if error is not None:
                verdict.needs_grad = True  # the forward did not finish: unknown, assume so
            if not verdict.needs_grad:
                verdict.torch_replay_error = "runs without grad: checkpointing does not apply"
            elif probe_engines and error is None and not verdict.overlapping_writes:
                state = _resolve_state(
                    [s for s in verdict.state if not s.startswith("torch.default")], root, a
                )
                probe(fn, seg.first_args, seg.first_kwargs, state, verdict, snap, params)
            elif verdict.overlapping_writes:
                verdict.torch_replay_error = "OverlapError: raw overlapping write"
            report.segments.append(verdict)
    finally:
        snap.restore()
    report.outside = sorted(
        {a.name_of(k) for k, ws in a.writes.items() if k in a.pre for *_, w in ws if w == _OUTSIDE}
    )
    return report


def _generators(root: nn.Module | None) -> list[torch.Generator]:
    """The explicit generators the model's modules hold as attributes."""
    if root is None:
        return []
    return [v for m in root.modules() for v in vars(m).values() if isinstance(v, torch.Generator)]


def _candidate_segments(root: nn.Module, prefix: str = "") -> list[str]:
    """The default candidate segments: each direct child, except that a container
    that is never called itself (``nn.ModuleList``, ``nn.ModuleDict``) stands for
    its children (``blocks.0``, ``blocks.1``, ...), recursively."""
    names = []
    for n, child in root.named_children():
        path = f"{prefix}{n}"
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            names += _candidate_segments(child, path + ".")
        else:
            names.append(path)
    return names


def _import_target(target: str) -> Any:
    """Import ``pkg.module`` from the current directory, or a ``.py`` file by path."""
    import os

    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(target))[0], target
        )
        if spec is None or spec.loader is None:
            raise SystemExit(f"error: cannot load {target}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(target)


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_replay.audit pkg.module:factory [--json] [--segments a,b]``.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        0 if every segment is exact under ``torch.utils.checkpoint``, else 1.
    """
    ap = argparse.ArgumentParser(
        prog="python -m torch_replay.audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "factory",
        help="pkg.module:callable (from the current directory) or path/to/file.py:callable, "
        "returning (model_or_fn, example_inputs)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument(
        "--segments",
        default=None,
        help="comma-separated module paths to audit (default: the model's children)",
    )
    args = ap.parse_args(argv)
    target, _, attr = args.factory.rpartition(":")
    if not target or not attr:
        ap.error("factory must be given as pkg.module:callable or path/to/file.py:callable")
    made = getattr(_import_target(target), attr)()
    model, inputs = made
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    segs = args.segments.split(",") if args.segments else None
    report = audit(model, *inputs, segments=segs)
    print(report.to_json() if args.json else report)
    return 0 if all(s.torch_checkpoint_exact for s in report.segments) else 1
