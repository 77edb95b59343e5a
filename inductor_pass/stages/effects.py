"""The effect check: which storages each unit of a program really writes (on copies).

The profile stage's first run (``inductor_pass/stages/profile.py``): a probe
between statements records which storages every name refers to, and every
unit's reachable storages are hashed around it (Note [Effect check scope]), so a
write a kernel does not declare is found before the pass reorders anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from inductor_pass.program.units import declared_effects
from inductor_pass.program.wrapper_ast import StmtKind, Wrapper, render_region
from inductor_pass.stages.guard import (
    PROBE_PREFIX,
    build_call,
    bytes_view,
    clone_list,
    extension,
    is_opaque,
    opaque_nbytes,
    tensors_in,
    with_rng,
)

__all__ = ["EffectsProfile", "profile_effects", "storage_digest", "unwritten_inputs"]


def storage_digest(st: torch.UntypedStorage) -> tuple[int, int]:
    """128-bit hash of a storage's bytes (``torch.ops.torch_replay.hash_ranges``).

    The effect check compares digests before and after each unit instead of
    copies of every live storage: no extra memory, one read per storage per
    probe. Two different contents hash equal with probability about 2^-128.
    """
    extension()  # loads the extension, which registers the op
    ranges = torch.tensor([[0, st.nbytes()]], dtype=torch.int64)
    h = torch.ops.torch_replay.hash_ranges(bytes_view(st), ranges)
    lo, hi = h.tolist()
    return int(lo), int(hi)


@dataclass(kw_only=True, slots=True)
class EffectsProfile:
    """What one instrumented run recorded (see :func:`profile_effects`)."""

    name_storages: dict[str, frozenset[int]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    external: set[int] = field(default_factory=set)
    changed: dict[int, set[int]] = field(default_factory=dict)
    """Per unit statement: storages whose bytes changed while it ran."""
    problems: list[str] = field(default_factory=list)


def _bound_names_per_position(wrapper: Wrapper, order: list[int]) -> list[list[str]]:
    bound = list(wrapper.input_names)
    out = [list(bound)]
    for k in order:
        st = wrapper.region[k]
        bound = [n for n in bound if n not in st.deletes] + [
            n for n in st.defines if n not in bound
        ]
        out.append(list(bound))
    return out


def _global_tensor_names(wrapper: Wrapper, base_globals: dict[str, Any]) -> list[str]:
    defined = {n for st in wrapper.region for n in st.defines} | set(wrapper.input_names)
    names = []
    for st in wrapper.region:
        for n in st.uses:
            if n not in defined and isinstance(base_globals.get(n), torch.Tensor):
                if n not in names:
                    names.append(n)
    return names


def _probe_lines(num_positions: int) -> dict[int, str]:
    """The probe calls of :func:`profile_effects`: each passes the wrapper's
    ``locals()``, which the probe narrows to the names bound at its position.

    A literal dict of those names at every position (as before) made the
    instrumented source quadratic in the graph's size, and compiling it took
    about 700 MB on a MobileNetV2 training graph (``benchmarks/results/compile_tv.md``);
    ``locals()`` keeps
    it linear.
    """
    return {p: f"{PROBE_PREFIX}({p}, locals())" for p in range(num_positions)}


def _effect_scopes(
    wrapper: Wrapper, resolve: Callable[[str], object] | None
) -> dict[int, frozenset[str] | None]:
    """Per unit statement: the names whose storages the effect check hashes around it.

    Note [Effect check scope]
    The effect check (:func:`profile_effects`) verifies that a unit writes no
    storage it does not declare. A kernel call reaches memory only through its
    arguments: Inductor's C++/Triton kernels receive pointers to their argument
    buffers, and ``extern_kernels`` / ``torch.ops`` calls receive the tensors
    named in the statement. So a unit can write only storages of names it uses
    or binds, and those are the storages hashed before and after it; a write to
    any of them that the kernel signature or schema does not declare is still
    found. A callee with unknown effects (a barrier of :func:`declared_effects`
    that has no schema) gets every live storage hashed, as before. Hashing only
    a unit's own operands makes the check cost the bytes each unit touches
    instead of every live byte per unit (ViT-B/16 inference: 112 s of hashing of
    the weights at every one of its units, measured under torch 2.14).
    """
    return {
        st.index: None
        if _unknown_effects(st, wrapper, resolve)
        else frozenset([*st.uses, *st.defines])
        for st in wrapper.region
        if st.kind is StmtKind.UNIT
    }


def _unknown_effects(st: Any, wrapper: Wrapper, resolve: Callable[[str], object] | None) -> bool:
    """Whether a unit's callee is a barrier without a schema (its effects are unknown)."""
    try:
        if not declared_effects(st, wrapper, resolve)[1]:
            return False
    except Exception:
        return True
    return not _has_schema(st, resolve)


def _has_schema(st: Any, resolve: Callable[[str], object] | None) -> bool:
    """Whether a unit's callee is an operator with a schema (its effects are known)."""
    if resolve is None or not st.callee:
        return False
    try:
        obj = resolve(st.callee)
    except Exception:
        return False
    return getattr(obj, "_schema", None) is not None or (
        getattr(getattr(obj, "default", None), "_schema", None) is not None
    )


def profile_effects(
    wrapper: Wrapper,
    base_globals: dict[str, Any],
    inputs: Sequence[Any],
    *,
    partitions: Any = None,
    check_bytes: bool = True,
    resolve: Callable[[str], object] | None = None,
) -> EffectsProfile:
    """Run the original program once with a probe between statements.

    Records which storages every name refers to, their sizes, and, with
    ``check_bytes``, which storages each unit changed (a 128-bit hash of every
    live storage compared before and after the unit, :func:`storage_digest`),
    for the effect-completeness check. Storages are freed as in a normal run.
    """
    order = list(range(len(wrapper.region)))
    per_pos = _bound_names_per_position(wrapper, order)
    gnames = _global_tensor_names(wrapper, base_globals)
    prof = EffectsProfile()
    # Storages are keyed by their StorageImpl address. A weak reference to each
    # keeps that address from being reused during the run (the intrusive weak
    # count keeps the StorageImpl object, not its bytes), so keys are unique
    # while freed storages really are freed.
    weak: dict[int, Any] = {}
    state: dict[str, Any] = {"snap": None, "prev": None}

    def storages_of(value: Any) -> dict[int, torch.UntypedStorage | None]:
        out: dict[int, torch.UntypedStorage | None] = {}
        for t in tensors_in(value):
            if is_opaque(t):  # Note [Opaque tensors]: keyed by its TensorImpl, never read
                k = t._cdata
                weak.setdefault(k, t)  # held: its address is not reused during the run
                prof.sizes[k] = opaque_nbytes(t)
                out[k] = None
                continue
            st = t.untyped_storage()
            if st.nbytes() == 0:
                continue
            k = st._cdata
            if k not in weak:
                weak[k] = StorageWeakRef(st)
            prof.sizes[k] = st.nbytes()
            out[k] = st
        return out

    def probe(pos: int, scope: dict[str, Any]) -> None:
        bound = {n: scope[n] for n in per_pos[pos]}
        bound.update((n, base_globals[n]) for n in gnames)
        del scope
        live: dict[int, torch.UntypedStorage | None] = {}
        for n, v in bound.items():
            sts = storages_of(v)
            ks = frozenset(sts)
            old = prof.name_storages.get(n)
            if old is not None and old != ks:
                prof.problems.append(f"name {n} changed storage during the run")
            prof.name_storages[n] = ks
            live.update(sts)
        if pos == 0:
            prof.external |= set(live)
        cur: dict[int, tuple[int, int]] = {}

        def digest(k: int) -> tuple[int, int]:
            if k not in cur:
                cur[k] = storage_digest(live[k])  # type: ignore[arg-type]
            return cur[k]

        if state["snap"] is not None:
            prof.changed[state["prev"]] = {
                k for k, before in state["snap"].items() if k not in live or digest(k) != before
            }
            state["snap"] = None
        if pos < len(order) and wrapper.region[order[pos]].kind is StmtKind.UNIT and check_bytes:
            st = wrapper.region[order[pos]]
            names = reach.get(st.index)
            if names is None:  # unknown callee: any live storage (Note [Effect check scope])
                watched = {k: v for k, v in live.items() if v is not None}
            else:
                watched = {}
                for n in names:
                    for k in prof.name_storages.get(n, frozenset()):
                        if live.get(k) is not None:
                            watched[k] = live[k]
            state["snap"] = {k: digest(k) for k in watched}
            state["prev"] = order[pos]

    reach = _effect_scopes(wrapper, resolve) if check_bytes else {}
    src = render_region(wrapper, order, probes=_probe_lines(len(per_pos)))
    call, _ = build_call(src, base_globals, partitions=partitions, probe=probe)
    args = clone_list(inputs)

    def run():
        with torch.no_grad():
            return call(list(args))

    out = with_rng(run)
    # A name bound by a unit keeps the storages seen right after that unit.
    del out
    if check_bytes:
        for st in wrapper.region:
            if st.kind is not StmtKind.UNIT:
                continue
            written_names, barrier = declared_effects(st, wrapper, resolve)
            declared: set[int] = set()
            for n in [*written_names, *st.defines] if not barrier else [*st.uses, *st.defines]:
                declared |= prof.name_storages.get(n, frozenset())
            undeclared = prof.changed.get(st.index, set()) - declared
            if undeclared:
                prof.problems.append(
                    f"undeclared write by statement {st.index} ({st.callee}) to "
                    f"{len(undeclared)} storage(s)"
                )
    return prof


def unwritten_inputs(
    wrapper: Wrapper,
    prof: EffectsProfile,
    resolve: Callable[[str], object] | None,
    owned: Sequence[bool],
) -> list[bool]:
    """Per input: held by the caller, and provably never written by the program.

    Note [Unwritten inputs]
    The pass's runs of a program (memory profile, guard measurements) used to
    copy every input first, so that a write could never reach the caller's
    tensors; for a model's weights that is one more copy of the model per run
    alive at once (compile memory 1.9x Inductor's on ViT-B/16, ``benchmarks/results/compile_tv.md``). After
    the effect profile (on copies) the pass knows, per storage, whether any
    unit changed its bytes (hashed around every unit that can reach it, Note
    [Effect check scope]) and whether any unit declares a write to it. An input
    neither changed nor declared written, in a profile that found no problem,
    is read only by every unit, in any order of the same units, so later runs
    read it in place. Inputs the call owns are still copied (the program frees
    them), and so is everything when the effect check is off or on CUDA.
    """
    written: set[int] = set()
    for ks in prof.changed.values():
        written |= ks
    for st in wrapper.region:
        if st.kind is not StmtKind.UNIT:
            continue
        names, barrier = declared_effects(st, wrapper, resolve)
        for n in [*st.uses, *st.defines] if barrier else [*names, *st.defines]:
            written |= prof.name_storages.get(n, frozenset())
    out = []
    for i, flag in enumerate(owned):
        name = wrapper.input_names[i] if i < len(wrapper.input_names) else None
        ks = prof.name_storages.get(name, frozenset()) if name is not None else frozenset()
        out.append(bool(ks) and not flag and not (ks & written))
    return out
