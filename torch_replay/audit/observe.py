"""How the audit observes a run and judges it.

Every operator is seen by the C++ audit recorder (Note [Audit recorder] in
``csrc/aten/audit_recorder.h``): the same RecordFunction callback facts as the
checkpoint observer (written arguments, batch-norm running statistics, random
operators, explicit generators), storage identity held for the whole run, and exact
strided footprints. The tables come to Python once, after the backward; the hazard
rules below ask the recorder for footprint intersections (``RangeSet::overlaps``, the
function the checkpoint's Transaction uses), and the raw-overlap rule is the
Transaction's own, applied per operator in C++.

What RecordFunction cannot give stays here: which candidate segment an operator
belongs to (module forward hooks, which run between operators and mark positions in
the recorder's operator sequence), the names of parameters, buffers, inputs and
generators, and the start of the backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_leaves

from .._ext import require_extension
from .probe import _fresh
from .report import _BACKWARD, _OUTSIDE, SegmentAudit, _cut

# ------------------------------------------------------------------ observation


@dataclass(slots=True)
class _SegState:
    name: str
    kind: str
    arg_keys: set = field(default_factory=set)
    first_args: tuple | None = None
    first_kwargs: dict | None = None
    # [start, end) positions in the recorder's operator sequence, one per call.
    intervals: list = field(default_factory=list)
    grad_output: bool = False
    # Filled by _Auditor.analyse():
    reads: dict = field(default_factory=dict)  # storage -> [access, ...] (not made here)
    first_read: dict = field(default_factory=dict)  # storage -> op of its first read
    writes_pre: dict = field(default_factory=dict)  # storage -> label
    read_acc: dict = field(default_factory=dict)  # storage -> [access, ...] (all)
    write_acc: dict = field(default_factory=dict)
    generators: list = field(default_factory=list)
    dtypes: dict = field(default_factory=dict)  # storage -> set of dtypes
    overlapping: list = field(default_factory=list)
    int_writes: list = field(default_factory=list)


class _Auditor:
    """Names what the model owns, marks segments, and analyses the recorder's tables."""

    def __init__(
        self, root: nn.Module | None, inputs: Sequence[Any], held: Sequence[tuple] = ()
    ) -> None:
        self.rec = require_extension().AuditRecorder()
        self.stack: list[tuple[_SegState, int]] = []  # (segment, interval index)
        self.segments: dict[str, _SegState] = {}
        self.order: list[str] = []
        # (depth, interval index, chain of segment names) per segment call
        self.marks: list[tuple[int, int, tuple[str, ...]]] = []
        self.backward_at: int | None = None
        self.names: dict[int, str] = {}
        self.tensors: dict[int, list[torch.Tensor]] = {}
        self.pre: set[int] = set()
        self.gen_names: dict[int, str] = {}
        self.created_in: dict[int, str] = {}
        self.meta: dict[int, tuple[str, str]] = {}
        # storage -> [(op, access, where)] of every write, backward included
        self.writes: dict[int, list[tuple[int, int, str]]] = {}
        self.access_op: list[int] = []
        if root is not None:
            for n, p in root.named_parameters():
                self._name(p, f"{n} (parameter)")
            for n, b in root.named_buffers():
                if b is not None:
                    self._name(b, f"{n} (buffer)")
            for path, m in root.named_modules():
                for attr, v in vars(m).items():
                    if isinstance(v, torch.Generator):
                        self.gen_names[v._cdata] = f"{path + '.' if path else ''}{attr} (generator)"
        for i, x in enumerate(tree_leaves(list(inputs))):
            if isinstance(x, torch.Tensor):
                self._name(x, f"input[{i}]")
        # What an audited function holds, under its variable names (Note [Naming in
        # errors] in torch_replay/_replay/naming.py): ``table (captured)``, ``net.lin.weight
        # (captured)``, expressions in the caller's scope.
        self.held_generators: dict[str, torch.Generator] = {}
        for label, obj in held:
            if label is None:
                continue
            if isinstance(obj, torch.Tensor):
                self._name(obj, f"{label} (captured)")
            elif isinstance(obj, torch.Generator):
                self.gen_names.setdefault(obj._cdata, f"{label} (captured)")
                self.held_generators[f"{label} (captured)"] = obj
            else:
                for n, t in [*obj.named_parameters(), *obj.named_buffers()]:
                    if t is not None:
                        self._name(t, f"{label}.{n} (captured)")

    def _name(self, t: torch.Tensor, name: str) -> None:
        k = self.rec.storage_id(t)
        if k >= 0:
            self.names.setdefault(k, name)
            self.tensors.setdefault(k, []).append(t)
            self.pre.add(k)

    def name_of(self, k: int) -> str:
        if k in self.names:
            return self.names[k]
        dtype, shape = self.meta.get(k, ("?", "?"))
        where = self.created_in.get(k)
        origin = f"made in {where}" if where else "captured"
        return f"{dtype}[{shape}] tensor ({origin})"

    @contextlib.contextmanager
    def recording(self):
        self.rec.start()
        try:
            yield
        finally:
            self.rec.stop()

    def start_backward(self) -> None:
        self.backward_at = self.rec.position()

    # -- segments (module hooks, between operators; the recorder is paused meanwhile)
    def enter(self, name: str, kind: str, args: tuple, kwargs: dict | None = None) -> None:
        self.rec.paused = True
        try:
            seg = self.segments.get(name)
            if seg is None:
                seg = self.segments[name] = _SegState(name=name, kind=kind)
                self.order.append(name)
            if seg.first_args is None:
                seg.first_args, seg.first_kwargs = _fresh((tuple(args), dict(kwargs or {})))
            for a in tree_leaves([list(args), dict(kwargs or {})]):
                if isinstance(a, torch.Tensor):
                    k = self.rec.storage_id(a)
                    if k >= 0:
                        seg.arg_keys.add(k)
            seg.intervals.append([self.rec.position(), None])
            chain = (*(s.name for s, _ in self.stack), name)
            self.marks.append((len(self.stack), len(seg.intervals) - 1, chain))
            self.stack.append((seg, len(seg.intervals) - 1))
        finally:
            self.rec.paused = False

    def leave(self, output: Any = None) -> None:
        seg, i = self.stack.pop()
        seg.intervals[i][1] = self.rec.position()
        leaves = tree_leaves(output) if output is not None else []
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            seg.grad_output = True

    def inside(self, seg: _SegState, op: int) -> bool:
        """True if forward operator ``op`` ran inside (a call of) segment ``seg``."""
        if self.backward_at is not None and op >= self.backward_at:
            return False
        return any(s <= op < e for s, e in seg.intervals)

    # -- analysis, once, on the recorder's tables
    def analyse(self) -> None:
        rec = self.rec
        end = rec.position()
        bwd = self.backward_at if self.backward_at is not None else end
        for seg in self.segments.values():
            for iv in seg.intervals:
                if iv[1] is None:  # the model raised inside it
                    iv[1] = min(end, bwd)
        # The chain of segments each forward operator runs in, innermost last:
        # painted outermost first (the intervals of nested calls nest).
        chains: list[tuple[str, ...]] = [()] * end
        for _, i, chain in sorted(self.marks, key=lambda m: m[0]):
            s, e = self.segments[chain[-1]].intervals[i]
            chains[s:e] = [chain] * (e - s)
        segs = self.segments

        def where(op: int) -> str:
            if op >= bwd:
                return _BACKWARD
            c = chains[op]
            return c[-1] if c else _OUTSIDE

        dtype_of = rec.dtype_of
        for k, (created, dtype, shape) in enumerate(rec.storages()):
            self.meta[k] = (str(dtype).replace("torch.", ""), "x".join(map(str, shape)))
            if 0 <= created < bwd:
                self.created_in[k] = where(created)
        created_op = {k: c for k, (c, _, _) in enumerate(rec.storages())}
        op_names = rec.op_names()
        ops = rec.ops()
        dtypes: dict[int, torch.dtype] = {}
        by_op: dict[int, list] = {}
        for i, (op, k, w, _nested, rg, fl, dt, _view) in enumerate(rec.accesses().tolist()):
            self.access_op.append(op)
            by_op.setdefault(op, []).append((i, k, w, rg, fl))
            if w:
                self.writes.setdefault(k, []).append((op, i, where(op)))
            if op >= bwd:
                continue
            d = dtypes.get(dt)
            if d is None:
                d = dtypes[dt] = dtype_of(dt)
            for name in chains[op]:
                seg = segs[name]
                seg.dtypes.setdefault(k, set()).add(d)
                (seg.write_acc if w else seg.read_acc).setdefault(k, []).append(i)
                if self.inside(seg, created_op.get(k, -1)):
                    continue  # made by this segment: an activation, not state
                if w:
                    label = self.name_of(k)
                    if k in seg.arg_keys and not label.startswith("input["):
                        label += " (segment input)"
                    seg.writes_pre.setdefault(k, label)
                elif k not in seg.arg_keys:
                    seg.reads.setdefault(k, []).append(i)
                    seg.first_read.setdefault(k, op)
        for op, (name_i, random, generator, device, overlap) in enumerate(ops[:bwd]):
            chain = chains[op]
            if not chain:
                continue
            func = op_names[name_i]
            if random:
                g = (
                    self.gen_names.get(generator, f"explicit generator {generator:#x}")
                    if generator
                    else f"default {device}"
                )
                for name in chain:
                    if g not in segs[name].generators:
                        segs[name].generators.append(g)
            acc = by_op.get(op, [])
            if overlap >= 0:
                k = next(k for i, k, *_ in acc if i == overlap)
                for name in chain:
                    segs[name].overlapping.append(f"{func} on {self.name_of(k)}")
            grad_read = any(rg and fl and not w for _, _, w, rg, fl in acc)
            if grad_read:
                for _, k, w, _, fl in acc:
                    if w and not fl:
                        for name in chain:
                            segs[name].int_writes.append(f"{func} into {self.name_of(k)}")


# ------------------------------------------------------------------- verdicts


def _verdict(a: _Auditor, seg: _SegState) -> SegmentAudit:
    out = SegmentAudit(name=seg.name, kind=seg.kind, needs_grad=seg.grad_output)
    out.mutated_in_forward = sorted(set(seg.writes_pre.values()))
    out.non_input_reads = sorted({a.name_of(k) for k in seg.reads})
    # A read is at risk if something outside the segment writes the storage after it.
    # The bytes decide torch.utils.checkpoint's re-run (exact footprints intersected);
    # any write decides torch_replay.checkpoint's version check (detect="reads").
    later: dict[int, str] = {}
    elsewhere: dict[int, str] = {}
    for k, reads in seg.reads.items():
        t0 = seg.first_read[k]
        for op, i, writer in a.writes.get(k, ()):
            if op <= t0 or a.inside(seg, op):
                continue
            before = [r for r in reads if a.access_op[r] < op]
            if a.rec.overlap(before, [i]):
                later[k] = f"{a.name_of(k)} (by {writer})"
                elsewhere.pop(k, None)
                break
            elsewhere.setdefault(k, f"{a.name_of(k)} (by {writer})")
    out.mutated_after_read = sorted(later.values())
    out.written_elsewhere_after_read = sorted(elsewhere.values())
    out.generators = list(seg.generators)
    for k, dts in seg.dtypes.items():
        if len(dts) > 1:
            names = ", ".join(sorted(str(d).replace("torch.", "") for d in dts))
            out.typed_aliases.append(f"{a.name_of(k)} as {names}")
    for k, writes in seg.write_acc.items():
        if a.rec.overlap(seg.read_acc.get(k, []), writes, True):
            out.view_aliases.append(a.name_of(k))
    out.overlapping_writes = sorted(set(seg.overlapping))
    out.integer_writes_on_grad_path = sorted(set(seg.int_writes))

    reasons = []
    if out.mutated_in_forward:
        reasons.append(
            "double update: torch.utils.checkpoint runs the forward again during backward, "
            "so this state is updated twice per step (BatchNorm statistics move two steps, "
            f"counters count twice): {_cut(out.mutated_in_forward, 3)}"
        )
    if out.mutated_after_read:
        reasons.append(
            "wrong gradient: this state changes between the forward and the backward, and "
            "torch.utils.checkpoint's re-run reads the new value, so the gradient is that of a "
            f"forward that never ran: {_cut(out.mutated_after_read, 3)}"
        )
    explicit = [g for g in out.generators if not g.startswith("default")]
    if explicit:
        reasons.append(
            "wrong gradient: torch.utils.checkpoint restores only the default generators, so "
            f"the re-run draws other random numbers from {_cut(explicit, 3)}"
        )
    if out.overlapping_writes:
        reasons.append(
            "raw overlapping writes (rejected by torch_replay, and by torch if it can tell)"
        )
    out.reasons = reasons
    out.torch_checkpoint_exact = not reasons

    # What to declare: state it writes, state written after it read it (at the bytes it
    # read, or elsewhere: torch_replay's version check refuses both), and generators.
    declared = []
    for k in [*seg.writes_pre, *later, *elsewhere]:
        n = a.name_of(k)
        if k in seg.arg_keys or n.startswith("input["):
            continue  # inputs written in place are preserved automatically
        if n not in declared:
            declared.append(n)
    declared += [g for g in explicit if g not in declared]
    if any(g.startswith("default") for g in out.generators):
        declared.append("torch.default_generator (only if preserve_rng_state=False)")
    out.state = declared
    return out


def _resolve_state(names: list[str], root: nn.Module | None, a: _Auditor) -> list[Any]:
    state: list[Any] = []
    for n in names:
        if n.endswith("(generator)") and root is not None:
            path, attr = n[: -len(" (generator)")].rpartition(".")[::2]
            m = root.get_submodule(path) if path else root
            state.append(getattr(m, attr))
            continue
        if n in a.held_generators:
            state.append(a.held_generators[n])
            continue
        for k, name in a.names.items():
            if name == n:
                state.append(a.tensors[k][0])
                break
    return state


def _default_loss(out: Any) -> torch.Tensor:
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    parts = [t.float().sum() for t in leaves if t.requires_grad]
    if not parts:
        raise ValueError("the model's output has no tensor that requires grad; pass loss_fn=")
    return torch.stack(parts).sum()
