"""How the audit observes a run: operators seen by a TorchDispatchMode, storages, hazards, and
the verdict per segment (with a probe of what ``torch_replay.checkpoint`` does)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves

from .._observe import _op_info
from .report import _BACKWARD, _OUTSIDE, _ROOT, SegmentAudit, _cut

# ------------------------------------------------------------------ observation


# Storage identity for the audit in progress (torch_replay._C.StorageKeys keeps
# every storage it named from being reused as another's key, as the checkpoint's
# Transaction does); None outside audit().
_KEYS = None


def _key(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if st.nbytes() == 0:
        return None
    return _KEYS.key(t) if _KEYS is not None else st.data_ptr()


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
