"""The audit's probe: each candidate segment run alone, from the model's state before
the audit, under eager PyTorch, ``torch.utils.checkpoint`` and
``torch_replay.checkpoint``; and the snapshot that puts the model back exactly as it
was (bytes, ``.grad``, version counters, generators) after the audit and between runs.

Note [Audit probe]
The recorder sees what a segment reads and writes; whether torch's re-run reads other
values (a spectral norm's power iteration, an observer's running range, anything the
segment writes and reads again) shows in the gradient, so the probe measures it: the
gradient of the segment's inputs and of every parameter under
``torch.utils.checkpoint`` against eager's, both from the same start state; any
difference above eager's own run-to-run difference (eager run twice: zero where the
kernels are deterministic) is a wrong gradient. The same
gradient under ``torch_replay.checkpoint`` (with the state the audit recommends, spelled
``replay_state=``, which always means torch_replay's option: Note [Option spelling] in
_replay/api.py) is measured too, and its refusal, if any, is its verdict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_map

from .report import SegmentAudit

_FAILS = (RuntimeError, TypeError, ValueError)  # the segment cannot run alone this way
_NOISE = 4.0  # a gradient differs if max |g - eager| > _NOISE x eager's own run-to-run


class _Snapshot:
    """The bytes, ``.grad`` (its tensor and values) and version counter of every given
    tensor, the plain tensor attributes of every given module (spectral norm's computed
    ``weight``: a forward leaves its own there, holding that forward's graph), and the
    state of every given generator and of the default ones; ``restore`` puts them back
    exactly."""

    def __init__(
        self,
        tensors: list[torch.Tensor],
        generators: list[torch.Generator],
        modules: list[nn.Module] = (),
    ) -> None:
        self.attributes = [
            (m, n, v) for m in modules for n, v in vars(m).items() if isinstance(v, torch.Tensor)
        ]
        tensors = [*tensors, *(v for *_, v in self.attributes if v.layout == torch.strided)]
        seen: set[int] = set()
        self.tensors = [t for t in tensors if not (id(t) in seen or seen.add(id(t)))]
        self.layouts = [_layout(t) for t in self.tensors]
        self.storages = [t.untyped_storage().clone() for t in self.tensors]
        self.grads = [
            (t.grad, None if t.grad is None else t.grad.detach().clone()) for t in self.tensors
        ]
        # Inference tensors have no version counter to put back.
        self.versioned = [t for t in self.tensors if not t.is_inference()]
        self.versions = [t._version for t in self.versioned]
        self.generators = [(g, g.get_state()) for g in generators]
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        for m, n, v in self.attributes:
            if vars(m).get(n) is not v:
                vars(m)[n] = v
        with torch.no_grad():
            for t, layout, storage, (g, gv) in zip(
                self.tensors, self.layouts, self.storages, self.grads, strict=True
            ):
                if _layout(t) == layout:
                    t.untyped_storage().copy_(storage)
                else:  # resized (an observer's first step): its old storage and view back
                    t.set_(storage.clone(), layout[2], layout[0], layout[1])
                if t.grad is not g:
                    t.grad = g
                if g is not None:
                    g.copy_(gv)
        # The writes above may count as versions; the values are the old ones, and so are
        # the versions then (an autograd graph of the user's that saved them stays valid).
        torch._C._autograd._unsafe_set_version_counter(self.versioned, self.versions)
        for g, s in self.generators:
            g.set_state(s)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _layout(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes())


def _fresh(tree: Any) -> Any:
    """A copy of the recorded arguments: new leaf tensors (requiring grad as recorded)."""

    def one(a):
        if not isinstance(a, torch.Tensor):
            return a
        c = a.detach().clone()
        return c.requires_grad_(a.requires_grad) if c.is_floating_point() else c

    return tree_map(one, tree)


def _grads(
    fn: Callable, args: tuple, kwargs: dict, params: list[torch.Tensor], how: Callable
) -> list[torch.Tensor | None]:
    """Gradients of the sum of the float outputs of ``how(fn, *args, **kwargs)`` with
    respect to the float inputs and ``params``."""
    args, kwargs = _fresh(args), _fresh(kwargs)
    for p in params:
        p.grad = None
    with torch.enable_grad():
        y = how(fn, *args, **kwargs)
        parts = [t.float().sum() for t in tree_flatten(y)[0] if isinstance(t, torch.Tensor)]
        parts = [t for t in parts if t.requires_grad]
        if parts:
            torch.stack(parts).sum().backward()
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    out = [None if t.grad is None else t.grad.clone() for t in leaves if t.requires_grad]
    return out + [None if p.grad is None else p.grad.clone() for p in params]


def _difference(got: list, eager: list) -> float:
    """``max |got - eager|`` over all gradients (None counts as 0)."""
    diff = 0.0
    for g, e in zip(got, eager, strict=True):
        if g is None and e is None:
            continue
        g = torch.zeros_like(e) if g is None else g
        e = torch.zeros_like(g) if e is None else e
        if g.numel():
            diff = max(diff, float((g.double() - e.double()).abs().max()))
    return diff


def probe(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    state: list[Any],
    out: SegmentAudit,
    snap: _Snapshot,
    params: list[torch.Tensor],
) -> None:
    """Run the segment alone three ways from ``snap``'s state (Note [Audit probe]) and
    fill ``out``: the measured gradient errors, the engine ``auto`` chose and its
    retained bytes, or torch_replay's refusal. The state is put back after each run."""
    from .._replay.api import checkpoint
    from .._replay.replace import torch_checkpoint as torchs
    from .._replay.segment import last_transaction
    from ..errors import ReplayError

    def eager(f, *a, **k):
        return f(*a, **k)

    def torch_checkpoint(f, *a, **k):
        # torch's own, also inside tr.replace_torch_checkpoint()
        return torchs(f, *a, use_reentrant=False, **k)

    def replay(f, *a, **k):
        y = checkpoint(
            f, *a, use_reentrant=False, replay_state=state or None, replay_engine="auto", **k
        )
        txn = last_transaction()
        if txn is None:  # nothing saved for backward: the transaction is gone
            out.auto_engine, out.retained_bytes = "none (nothing saved)", 0
        else:
            out.auto_engine, out.retained_bytes = txn.engine, int(txn.retained_bytes)
        return y

    def run(how):
        snap.restore()
        try:
            return _grads(fn, args, kwargs, params, how)
        finally:
            snap.restore()

    try:
        reference = run(eager)
        # Eager against itself: the run-to-run noise of the segment's kernels (zero
        # where they are deterministic, as on the CPU), below which nothing is wrong.
        noise = _NOISE * _difference(run(eager), reference)
    except _FAILS:
        reference = None  # eager itself fails alone: nothing to measure against
    if reference is not None:
        with contextlib.suppress(*_FAILS):
            diff = out.torch_checkpoint_grad_error = _difference(run(torch_checkpoint), reference)
            if diff > noise:
                out.torch_checkpoint_exact = False
                out.reasons.append(
                    "wrong gradient: torch.utils.checkpoint's re-run of this segment reads "
                    "other values than its forward did (state the segment changes and reads "
                    "again, or draws it cannot repeat): measured max |grad - eager| = "
                    f"{diff:.2e} on the segment alone"
                )
    try:
        got = run(replay)
    except ReplayError as exc:
        out.torch_replay_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    except _FAILS as exc:
        out.torch_replay_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        if reference is not None:
            diff = out.torch_replay_grad_error = _difference(got, reference)
            if diff > noise:
                out.torch_replay_error = (
                    "torch_replay.checkpoint's gradient differs from eager's on this segment "
                    f"(max |grad - eager| = {diff:.2e}): a bug, please report it"
                )


def model_tensors(
    root: nn.Module | None, held: list[tuple], inputs: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[nn.Module]]:
    """What the snapshot keeps: the model's parameters and buffers, the inputs, and the
    tensors an audited function holds (and its modules'); the modules whose plain
    tensor attributes it keeps."""
    out = list(inputs)
    modules = [] if root is None else list(root.modules())
    for _, obj in held:
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, nn.Module):
            modules += list(obj.modules())
    for m in modules:
        out += [*m.parameters(recurse=False), *m.buffers(recurse=False)]
    return [t for t in out if t is not None and t.layout == torch.strided], modules
