"""Is my model safe to checkpoint? One observed forward and backward, a verdict per segment.

::

    report = tr.audit(model, x)          # each child module is a candidate segment
    print(report)                        # a table, then each segment; report.to_dict() / to_json()

    python -m torch_replay.audit mymodel:make [--json] [--segments a,b.c]

``make()`` returns ``(module_or_fn, example_inputs)``; ``mymodel`` is a module found from
the current directory (or give a file: ``path/to/mymodel.py:make``). For each candidate
segment the report lists the hidden state a checkpoint re-run can get wrong: buffers and
parameters mutated in forward, tensors read that are not inputs (and whether something
writes them later), generators drawn from (default and explicit), storages aliased under
different views or dtypes, overlapping writes, integer writes on gradient paths. The
verdict says whether ``torch.utils.checkpoint`` would be exact and, if not, what goes wrong
(a double update of state, or a wrong gradient), the ``torch_replay.checkpoint`` call to
write (with its ``state=[...]``), which engine ``engine="auto"`` chooses and how many
bytes it keeps (measured by running ``torch_replay.checkpoint`` on the segment; the model's
state is put back afterwards). Exit status: 0 when every segment is exact under
``torch.utils.checkpoint``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves

from .._observe import _op_info

__all__ = ["AuditReport", "SegmentAudit", "audit", "main"]

_ROOT = "<root>"
_OUTSIDE = "<outside segments>"
_BACKWARD = "<backward>"


@dataclass(kw_only=True, slots=True)
class SegmentAudit:
    """What one candidate segment does to state, and the verdict."""

    name: str
    """Module path of the segment (``"fn"`` for a function)."""
    kind: str
    """Type name of the module, or ``"function"``."""
    mutated_in_forward: list[str] = field(default_factory=list)
    """Pre-existing tensors (buffers, parameters, inputs, captured tensors) it writes."""
    non_input_reads: list[str] = field(default_factory=list)
    """Tensors it reads that are not its inputs (parameters, buffers, captured tensors)."""
    mutated_after_read: list[str] = field(default_factory=list)
    """Of those reads, the ones something else writes after this segment read them."""
    generators: list[str] = field(default_factory=list)
    """Generators it draws from (``default cpu`` or an explicit generator's name)."""
    typed_aliases: list[str] = field(default_factory=list)
    """Storages it touches through views of different dtypes."""
    view_aliases: list[str] = field(default_factory=list)
    """Storages it writes through one view and reads through another, overlapping one."""
    overlapping_writes: list[str] = field(default_factory=list)
    """Operators whose written tensor overlaps one they read through another view."""
    integer_writes_on_grad_path: list[str] = field(default_factory=list)
    """Operators writing an integer tensor from values that require grad."""
    torch_checkpoint_exact: bool = True
    """Would ``torch.utils.checkpoint`` (default options) give the eager gradients and state."""
    reasons: list[str] = field(default_factory=list)
    """Why not, one line each."""
    state: list[str] = field(default_factory=list)
    """What to pass as ``state=`` to ``torch_replay.checkpoint``."""
    auto_engine: str | None = None
    """The engine ``engine="auto"`` chose for this segment."""
    retained_bytes: int | None = None
    """Bytes that engine kept from forward to backward."""
    torch_replay_error: str | None = None
    """If ``torch_replay.checkpoint`` refuses the segment, why."""
    needs_grad: bool = True
    """False if no output of the segment required grad in the observed run (it ran under
    ``no_grad``, like a momentum encoder): checkpointing does not apply to it."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: getattr(self, k) for k in self.__slots__}

    def code_state(self, root_var: str = "model") -> list[str]:
        """The ``state=`` entries as Python expressions on the audited model.

        Args:
            root_var: the variable that holds the audited model.

        Returns:
            One expression per declared tensor or generator (``model.head.queue``);
            names that are not attribute paths (captured tensors) are kept as text.
            The default generator is left out (torch_replay preserves it unless
            ``preserve_rng_state=False``).
        """
        out = []
        for n in self.state:
            if n.startswith("torch.default_generator"):
                continue
            out.append(_python_name(n, root_var) or f"<{n}>")
        return out

    def code(self, root_var: str = "model", input_var: str = "x") -> str:
        """The ``torch_replay.checkpoint`` call to write for this segment.

        Args:
            root_var: the variable that holds the audited model.
            input_var: the segment's input.

        Returns:
            One line of Python, e.g. ``tr.checkpoint(model.head, x,
            use_reentrant=False, state=[model.head.queue])``.
        """
        fn = _python_name(f"{self.name} (buffer)", root_var) if self.kind != "function" else None
        fn = fn or (root_var if self.name == "<root>" else self.name)
        state = self.code_state(root_var)
        arg = f", state=[{', '.join(state)}]" if state else ""
        return f"tr.checkpoint({fn}, {input_var}, use_reentrant=False{arg})"


@dataclass(kw_only=True, slots=True)
class AuditReport:
    """Per-segment audits of one forward and backward."""

    target: str
    """What was audited."""
    segments: list[SegmentAudit]
    """One entry per candidate segment, in execution order."""
    outside: list[str] = field(default_factory=list)
    """State written outside every candidate segment (for reference)."""
    error: str | None = None
    """If the model's own forward or backward raised (e.g. a raw overlapping copy), the
    error; the segments then show what was observed up to it."""

    def __getitem__(self, name: str) -> SegmentAudit:
        for s in self.segments:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "target": self.target,
            "segments": [s.to_dict() for s in self.segments],
            "outside": self.outside,
            "error": self.error,
        }

    def to_json(self, indent: int = 1) -> str:
        """The report as JSON."""
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        lines = [f"torch_replay.audit: {self.target}"]
        if self.error:
            lines.append(f"the model itself failed: {self.error}")
        lines.append("")
        head = ("segment", "kind", "torch.utils.checkpoint", "declare in state=", "auto engine")
        table = [head]
        for s in self.segments:
            verdict = "exact" if s.torch_checkpoint_exact else "NOT exact"
            if not s.needs_grad:
                verdict += " (no grad)"
            n = len(s.code_state())
            engine = "refused" if s.torch_replay_error else (s.auto_engine or "-")
            if s.auto_engine and s.retained_bytes is not None and not s.torch_replay_error:
                engine += f", keeps {_fmt_bytes(s.retained_bytes)}"
            table.append((s.name, s.kind, verdict, str(n) if n else "-", engine))
        widths = [max(len(r[c]) for r in table) for c in range(len(head))]
        for r in table:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        for s in self.segments:
            mark = "exact" if s.torch_checkpoint_exact else "NOT exact"
            if not s.needs_grad:
                mark += " (but it runs without grad)"
            lines.append(f"\n[{s.name}] {s.kind}: torch.utils.checkpoint {mark}")
            rows = [
                ("mutated in forward", s.mutated_in_forward),
                ("reads (not inputs)", s.non_input_reads),
                ("written after read", s.mutated_after_read),
                ("generators", s.generators),
                ("typed aliases", s.typed_aliases),
                ("view aliases", s.view_aliases),
                ("overlapping writes", s.overlapping_writes),
                ("int writes on grad path", s.integer_writes_on_grad_path),
            ]
            for label, items in rows:
                if items:
                    lines.append(f"  {label:<24}{_cut(items, 6)}")
            for r in s.reasons:
                lines.append(f"  ! {r}")
            if s.torch_replay_error:
                lines.append(f"  torch_replay refuses: {s.torch_replay_error}")
            else:
                lines.append(f"  write: {s.code()}")
                if s.auto_engine is not None:
                    lines.append(
                        f"  engine auto -> {s.auto_engine}, keeps {s.retained_bytes:,} bytes"
                    )
        if self.outside:
            lines.append("\nwritten outside the segments: " + _cut(self.outside, 8))
        return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _cut(items: Sequence[str], limit: int) -> str:
    """``a, b, c, … (N more)``: at most ``limit`` items, and how many were left out."""
    items = list(items)
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items) - limit} more, {len(items)} in all)"


def _python_name(name: str, root_var: str = "model") -> str | None:
    """``head.bn.running_mean (buffer)`` -> ``model.head.bn.running_mean``; None if not a path."""
    for suffix in (" (buffer)", " (parameter)", " (generator)"):
        if name.endswith(suffix):
            path = name[: -len(suffix)]
            if path and all(part.isidentifier() or part.isdigit() for part in path.split(".")):
                return root_var + "".join(
                    f"[{p}]" if p.isdigit() else f".{p}" for p in path.split(".")
                )
            return None
    return None


# ------------------------------------------------------------------ observation


def _key(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return st.data_ptr() if st.nbytes() > 0 else None


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    lo = t.storage_offset() * size
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else -1
    return lo, lo + (span + 1) * size


def _geometry(t: torch.Tensor) -> tuple:
    return (t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


@dataclass(slots=True)
class _SegState:
    name: str
    kind: str
    arg_keys: set = field(default_factory=set)
    first_args: tuple | None = None
    reads: dict = field(default_factory=dict)  # key -> (time, epoch, name) of first read
    writes_pre: dict = field(default_factory=dict)  # key -> name
    generators: list = field(default_factory=list)
    dtypes: dict = field(default_factory=dict)  # key -> set of dtypes
    written_geoms: dict = field(default_factory=dict)  # key -> list of (geom, range)
    read_geoms: dict = field(default_factory=dict)
    overlapping: list = field(default_factory=list)
    int_writes: list = field(default_factory=list)
    active: int = 0
    grad_output: bool = False


class _AuditMode(TorchDispatchMode):
    """Records, per operator, which storages are read and written by which segment."""

    def __init__(self, auditor: _Auditor) -> None:
        super().__init__()
        self.a = auditor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        keys = self.a.observe(func, args, kwargs)
        out = func(*args, **kwargs)
        self.a.created(out, keys)
        return out


class _Auditor:
    def __init__(self, root: nn.Module | None, inputs: Sequence[Any]) -> None:
        self.time = 0
        self.phase = "forward"
        self.stack: list[_SegState] = []
        self.segments: dict[str, _SegState] = {}
        self.order: list[str] = []
        self.names: dict[int, str] = {}
        self.tensors: dict[int, list[torch.Tensor]] = {}
        self.pre: set[int] = set()
        self.created_in: dict[int, str] = {}  # storage key -> segment name (or outside)
        self.writes: list[tuple[int, int, int, str]] = []  # (time, key, epoch, writer)
        self.epoch: dict[int, int] = {}
        self.meta: dict[int, tuple[str, str]] = {}  # first (dtype, shape) seen per storage
        self.gen_names: dict[int, str] = {}
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

    def _name(self, t: torch.Tensor, name: str) -> None:
        k = _key(t)
        if k is not None:
            self.names.setdefault(k, name)
            self.tensors.setdefault(k, []).append(t)
            self.pre.add(k)

    def name_of(self, k: int, t: torch.Tensor | None = None) -> str:
        if k in self.names:
            return self.names[k]
        if k in self.meta:
            dtype, shape = self.meta[k]
            where = self.created_in.get(k)
            origin = f"made in {where}" if where else "captured"
            return f"{dtype}[{shape}] tensor ({origin})"
        shape = "x".join(map(str, t.shape)) if t is not None else "?"
        dtype = str(t.dtype).replace("torch.", "") if t is not None else "?"
        where = self.created_in.get(k)
        origin = f"made in {where}" if where else "captured"
        return f"{dtype}[{shape}] tensor ({origin})"

    # -- segments
    def enter(self, name: str, kind: str, args: tuple) -> None:
        seg = self.segments.get(name)
        if seg is None:
            seg = self.segments[name] = _SegState(name=name, kind=kind)
            self.order.append(name)
        if seg.first_args is None:
            seg.first_args = tuple(
                a.detach().clone().requires_grad_(a.requires_grad)
                if isinstance(a, torch.Tensor) and a.is_floating_point()
                else (a.detach().clone() if isinstance(a, torch.Tensor) else a)
                for a in args
            )
        for a in tree_leaves(list(args)):
            if isinstance(a, torch.Tensor):
                k = _key(a)
                if k is not None:
                    seg.arg_keys.add(k)
        seg.active += 1
        self.stack.append(seg)

    def leave(self, output: Any = None) -> None:
        seg = self.stack.pop()
        seg.active -= 1
        leaves = tree_leaves(output) if output is not None else []
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            seg.grad_output = True

    def current(self) -> str:
        if self.phase == "backward":
            return _BACKWARD
        return self.stack[-1].name if self.stack else _OUTSIDE

    # -- operators
    def created(self, out: Any, input_keys: set[int]) -> None:
        where = self.current()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                k = _key(t)
                if k is not None and k not in self.pre and k not in input_keys:
                    # A fresh storage (possibly at a reused address): a new epoch.
                    # Only forward creations name a storage's origin: the backward
                    # can reuse an address after the verdict's storage was freed.
                    if self.phase == "forward":
                        self.created_in[k] = where
                        # Name it by the tensor made now, not by an earlier one
                        # freed at the same address.
                        self.meta[k] = (
                            str(t.dtype).replace("torch.", ""),
                            "x".join(map(str, t.shape)),
                        )
                    self.epoch[k] = self.epoch.get(k, 0) + 1

    def inside(self, seg: _SegState, where: str | None) -> bool:
        """True if an operator running in ``where`` belongs to segment ``seg``."""
        if where is None or where in (_OUTSIDE, _BACKWARD):
            return False
        return seg.name == _ROOT or where == seg.name or where.startswith(seg.name + ".")

    def observe(self, func, args, kwargs) -> set[int]:
        self.time += 1
        info = _op_info(func)
        where = self.current()
        tensors: list[tuple[torch.Tensor, bool]] = []
        generator = None
        bn_training = func in _BATCH_NORM and len(args) > 5 and bool(args[5])
        for i, name in enumerate(info.names):
            v = args[i] if i < len(args) else kwargs.get(name)
            w = info.writes[i] and not func.is_view
            if isinstance(v, torch.Tensor):
                tensors.append((v, w or (bn_training and i in (3, 4))))
            elif isinstance(v, (list, tuple)):
                tensors += [(t, w) for t in v if isinstance(t, torch.Tensor)]
            elif isinstance(v, torch.Generator):
                generator = v
        keys = {k for k in (_key(t) for t, _ in tensors) if k is not None}
        # Every segment on the stack sees the operator (a parent contains its children).
        segs = self.stack if self.phase == "forward" else []
        for t, w in tensors:
            k = _key(t)
            if k is None:
                continue
            ep = self.epoch.get(k, 0)
            if k not in self.meta:
                self.meta[k] = (str(t.dtype).replace("torch.", ""), "x".join(map(str, t.shape)))
            if w:
                self.writes.append((self.time, k, ep, where))
            for seg in segs:
                seg.dtypes.setdefault(k, set()).add(t.dtype)
                if func.is_view:
                    continue
                geoms = seg.written_geoms if w else seg.read_geoms
                geoms.setdefault(k, []).append((_geometry(t), _byte_range(t)))
                if self.inside(seg, self.created_in.get(k)):
                    continue  # made by this segment: an activation, not state
                if w:
                    label = self.name_of(k, t)
                    if k in seg.arg_keys and not label.startswith("input["):
                        label += " (segment input)"
                    seg.writes_pre.setdefault(k, label)
                elif k not in seg.arg_keys:
                    seg.reads.setdefault(k, (self.time, ep, self.name_of(k, t)))
        if segs and info.random:
            g = "default " + (tensors[0][0].device.type if tensors else "cpu")
            if generator is not None:
                g = self.gen_names.get(
                    generator._cdata, f"explicit generator {generator._cdata:#x}"
                )
            for seg in segs:
                if g not in seg.generators:
                    seg.generators.append(g)
        # Overlap and integer writes, per operator.
        written = [t for t, w in tensors if w]
        read = [t for t, w in tensors if not w]
        for wt in written:
            kw = _key(wt)
            wr = _byte_range(wt)
            for rt in read:
                if _key(rt) != kw or _geometry(rt) == _geometry(wt):
                    continue
                rr = _byte_range(rt)
                if rr[0] < wr[1] and wr[0] < rr[1]:
                    for seg in segs:
                        seg.overlapping.append(f"{func} on {self.name_of(kw, wt)}")
            if not wt.is_floating_point() and not wt.is_complex():
                if any(r.requires_grad and r.is_floating_point() for r in read):
                    for seg in segs:
                        seg.int_writes.append(f"{func} into {self.name_of(kw, wt)}")
        return keys


_aten = torch.ops.aten
_BATCH_NORM = {_aten.native_batch_norm.default}
for _n in ("cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit"):
    if hasattr(_aten, _n):
        _BATCH_NORM.add(getattr(_aten, _n).default)


# ------------------------------------------------------------------- verdicts


def _verdict(a: _Auditor, seg: _SegState, root: nn.Module | None) -> SegmentAudit:
    out = SegmentAudit(name=seg.name, kind=seg.kind, needs_grad=seg.grad_output)
    out.mutated_in_forward = sorted(set(seg.writes_pre.values()))
    out.non_input_reads = sorted({n for _, _, n in seg.reads.values()})
    later: dict[int, str] = {}
    for k, (t0, ep, n) in seg.reads.items():
        for t, key, wep, writer in a.writes:
            if key == k and wep == ep and t > t0 and not a.inside(seg, writer):
                later[k] = f"{n} (by {writer})"
                break
    out.mutated_after_read = sorted(later.values())
    out.generators = list(seg.generators)
    for k, dts in seg.dtypes.items():
        if len(dts) > 1:
            names = ", ".join(sorted(str(d).replace("torch.", "") for d in dts))
            out.typed_aliases.append(f"{a.name_of(k)} as {names}")
    for k, wg in seg.written_geoms.items():
        for g, r in seg.read_geoms.get(k, []):
            if any(g != g2 and r[0] < r2[1] and r2[0] < r[1] for g2, r2 in wg):
                out.view_aliases.append(a.name_of(k))
                break
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
        reasons.append("raw overlapping writes (rejected by torch and torch_replay)")
    if out.integer_writes_on_grad_path:
        reasons.append("a float gradient through an integer write (unsupported)")
    out.reasons = reasons
    out.torch_checkpoint_exact = not reasons

    # What to declare: state it writes, state written after it read it, and generators.
    declared = []
    for k in [*seg.writes_pre, *later]:
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
        for k, name in a.names.items():
            if name == n:
                state.append(a.tensors[k][0])
                break
    return state


def _probe_engine(
    a: _Auditor, seg: _SegState, fn: Callable, out: SegmentAudit, root: nn.Module | None
) -> None:
    """Run torch_replay.checkpoint on the segment with the recommended state and read the
    engine auto chose and its retained bytes; every tensor and generator is put back."""
    import torch_replay as tr
    from torch_replay.errors import ReplayError

    saved = {k: [t.detach().clone() for t in ts] for k, ts in a.tensors.items()}
    grads = {k: [t.grad for t in ts] for k, ts in a.tensors.items()}
    gens = [torch.get_rng_state()]
    gen_objs = []
    if root is not None:
        for m in root.modules():
            gen_objs += [v for v in vars(m).values() if isinstance(v, torch.Generator)]
    gen_states = [g.get_state() for g in gen_objs]
    state = _resolve_state([s for s in out.state if not s.startswith("torch.default")], root, a)
    try:
        with torch.enable_grad():
            y = tr.checkpoint(
                fn, *seg.first_args, state=state or None, engine="auto", use_reentrant=False
            )
            txn = tr.last_transaction()
            if txn is None:  # nothing saved for backward: the transaction is gone
                out.auto_engine, out.retained_bytes = "none (nothing saved)", 0
            else:
                out.auto_engine, out.retained_bytes = txn.engine, int(txn.retained_bytes)
            leaves = [t for t in tree_flatten(y)[0] if isinstance(t, torch.Tensor)]
            total = sum(t.float().sum() for t in leaves if t.requires_grad)
            if isinstance(total, torch.Tensor):
                total.backward()
    except ReplayError as exc:
        out.torch_replay_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    except RuntimeError as exc:
        out.torch_replay_error = f"RuntimeError: {str(exc).splitlines()[0]}"
    finally:
        with torch.no_grad():
            for k, ts in a.tensors.items():
                for t, s, g in zip(ts, saved[k], grads[k], strict=True):
                    t.copy_(s)
                    t.grad = g
        torch.set_rng_state(gens[0])
        for g, s in zip(gen_objs, gen_states, strict=True):
            g.set_state(s)


def _default_loss(out: Any) -> torch.Tensor:
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    parts = [t.float().sum() for t in leaves if t.requires_grad]
    if not parts:
        raise ValueError("the model's output has no tensor that requires grad; pass loss_fn=")
    return torch.stack(parts).sum()


def audit(
    module_or_fn: nn.Module | Callable,
    *example_inputs: Any,
    segments: Iterable[str] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    probe_engines: bool = True,
) -> AuditReport:
    """Run one forward and backward under observation and audit each candidate segment.

    Args:
        module_or_fn: an ``nn.Module`` (candidate segments: each direct child by default) or
            a function (one candidate segment: the function).
        *example_inputs: its inputs.
        segments: module paths of the candidate segments (``""`` is the whole module).
        loss_fn: maps the output to a scalar to differentiate (default: the sum of every
            output tensor that requires grad).
        probe_engines: also run ``torch_replay.checkpoint`` on each segment to report the
            engine ``auto`` chooses and its retained bytes (the state is put back after).

    Returns:
        An :class:`AuditReport`; ``str(report)`` is readable, ``report.to_dict()`` is data.

    Raises:
        ValueError: a named segment does not exist, or the output cannot be differentiated.

    A ``RuntimeError`` raised by the model itself (for example torch refusing a raw
    overlapping copy) does not propagate: it is in ``report.error`` and the segments show
    what was observed up to it.
    """
    root = module_or_fn if isinstance(module_or_fn, nn.Module) else None
    a = _Auditor(root, example_inputs)
    handles = []
    fns: dict[str, Callable] = {}
    if root is not None:
        names = list(segments) if segments is not None else [n for n, _ in root.named_children()]
        mods = dict(root.named_modules())
        for n in names:
            if n not in mods:
                raise ValueError(f"no submodule named {n!r} in {type(root).__name__}")
            m = mods[n]
            label = n or _ROOT
            fns[label] = m

            def pre(mod, args, label=label):
                a.enter(label, type(mod).__name__, args)

            def post(mod, args, output):
                a.leave(output)

            handles.append(m.register_forward_pre_hook(pre))
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
    error = None
    try:
        with _AuditMode(a):
            out = run(*example_inputs)
            loss = (loss_fn or _default_loss)(out)
            a.phase = "backward"
            loss.backward()
    except RuntimeError as exc:  # the model itself fails: report what was seen up to there
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        for h in handles:
            h.remove()
        while a.stack:
            a.leave()
    report = AuditReport(target=target, segments=[], error=error)
    for name in a.order:
        seg = a.segments[name]
        verdict = _verdict(a, seg, root)
        if error is not None:
            verdict.needs_grad = True  # the forward did not finish: unknown, assume so
        if not verdict.needs_grad:
            verdict.torch_replay_error = "runs without grad: checkpointing does not apply"
        elif probe_engines and error is None and not verdict.overlapping_writes:
            _probe_engine(a, seg, fns[name], verdict, root)
        elif verdict.overlapping_writes:
            verdict.torch_replay_error = "OverlapError: raw overlapping write"
        report.segments.append(verdict)
    report.outside = sorted(
        {a.name_of(k) for _, k, _, w in a.writes if w == _OUTSIDE and k in a.pre}
    )
    return report


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
