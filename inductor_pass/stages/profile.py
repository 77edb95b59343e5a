"""The profile stage: run the original program instrumented, and model it.

The pass's first stage (:func:`profile_program`) runs the wrapper's original
program twice on copies of the first call's real inputs: once with a probe
between statements that records which storages every name refers to and, per
unit, which storages changed (the effect check, Note [Effect check scope]),
(``inductor_pass/stages/effects.py``), and once in a counting window that records the live bytes after and the
transient bytes during every statement. The result, :class:`Profiled`, is the
byte-exact :class:`~inductor_pass.program.units.ProgramModel` of the program (Note
[Wrapper memory model] in ``inductor_pass/program/units.py``), checked against the
measured live bytes statement by statement, with what changes with the data
when the program binds unbacked symbols (Note [Data-dependent sizes] in
``inductor_pass/program/unbacked.py``), or the reason the graph is left
unchanged. The search (``inductor_pass/stages/search.py``) and the decision
(``inductor_pass/stages/decide.py``) follow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inductor_pass.program.unbacked import Varying, varying
from inductor_pass.program.units import ProgramModel, simulate
from inductor_pass.program.wrapper_ast import Wrapper, render_region
from inductor_pass.stages.effects import profile_effects, unwritten_inputs
from inductor_pass.stages.guard import (
    PROBE_PREFIX,
    RuntimeArgs,
    build_call,
    counting_window,
    extension,
    with_rng,
)

__all__ = ["Profiled", "profile_memory", "profile_program"]


def profile_memory(
    wrapper: Wrapper,
    base_globals: dict[str, Any],
    inputs: Sequence[Any],
    *,
    partitions: Any = None,
    owned: Sequence[bool] | None = None,
    shared: Sequence[bool] | None = None,
) -> tuple[list[int], list[int], int]:
    """Run the original program in a counting window with a probe between statements.

    Args:
        owned: Per input, whether the call owns it (Note [Input ownership]);
            None: every input is held by the caller.
        shared: Per input, whether the program provably leaves it unchanged, so
            that it is passed as is instead of copied (Note [Unwritten inputs]).

    Returns:
        ``(transient, live_after, peak)``: per region statement the peak
        bytes above the live count while it ran and the live bytes after it
        (owned inputs count from the start), and the peak of the whole run.
    """
    ext = extension()
    n = len(wrapper.region)
    live: list[int] = [0] * (n + 1)
    peak: list[int] = [0] * (n + 1)

    def probe(pos: int) -> None:
        s = ext.counting_stats()
        live[pos] = s["live"]
        peak[pos] = s["peak"]
        ext.counting_reset_peak()

    src = render_region(
        wrapper, list(range(n)), probes={p: f"{PROBE_PREFIX}({p})" for p in range(n + 1)}
    )
    call, _ = build_call(src, base_globals, partitions=partitions, probe=probe)
    args = RuntimeArgs(inputs, owned, shared)

    def run():
        with torch.no_grad(), counting_window():
            out = call(args.take())
        return out

    out = with_rng(run)
    del out
    transient = [peak[p + 1] - live[p] for p in range(n)]
    return transient, live[1:], max(peak)


@dataclass(kw_only=True, slots=True)
class Profiled:
    """The profile stage's result: the program's model, or why it is left unchanged."""

    wrapper: Wrapper
    inputs: list[Any]
    """Detached views of the real inputs (every run copies what it may write)."""
    owned: list[bool]
    """Per input, whether the call owns it (Note [Input ownership] in ``guard.py``)."""
    device: str
    refusal: str | None = None
    """Why the graph is left unchanged (then the fields below are unset)."""
    model: ProgramModel | None = None
    shared: list[bool] | None = None
    """Per input, whether runs read it in place (Note [Unwritten inputs])."""
    profiled_peak: int | None = None
    """Measured peak of the counting run (None on CUDA)."""
    modelled_peak: int | None = None
    """Modelled peak of the original order."""
    live: list[int] = field(default_factory=list)
    """Modelled live bytes after each statement of the original order."""
    varying: Varying | None = None
    """What changes with the data when the program binds unbacked symbols (Note
    [Data-dependent sizes] in ``inductor_pass/program/unbacked.py``); None: every size is static."""

    @property
    def on_cuda(self) -> bool:
        return self.device == "cuda"


def profile_program(
    wrapper: Wrapper,
    base_globals: dict[str, Any],
    real_inputs: Sequence[Any],
    *,
    owned: Sequence[bool] | None,
    partitions: Any,
    check_effects: bool,
    resolve: Callable[[str], object],
) -> Profiled:
    """The profile stage (see the module docstring).

    Raises:
        DynamicShapes: An input is a symbolic integer.
    """
    from inductor_pass.stages.guard import input_views

    inputs = input_views(real_inputs)
    flags = [bool(o) for o in owned] if owned is not None else [False] * len(inputs)
    if len(flags) != len(inputs):
        raise ValueError(f"owned has {len(flags)} flags for {len(inputs)} inputs")
    devices = {x.device.type for x in inputs if isinstance(x, torch.Tensor)}
    device = "cuda" if "cuda" in devices else ("cpu" if devices <= {"cpu"} else "")
    out = Profiled(
        wrapper=wrapper, inputs=inputs, owned=flags, device=device or ",".join(sorted(devices))
    )
    if not devices <= {"cpu", "cuda"}:
        out.refusal = f"device {out.device} has no guard"
        return out
    # The effect profile runs first and is also the warm-up: lazy initialisation
    # (oneDNN primitives, kernel loading) happens here, not in the measured runs.
    prof = profile_effects(
        wrapper,
        base_globals,
        inputs,
        partitions=partitions,
        check_bytes=check_effects,
        resolve=resolve,
    )
    if prof.problems:
        out.refusal = "; ".join(prof.problems[:3])
        return out
    if check_effects and not out.on_cuda:
        out.shared = unwritten_inputs(wrapper, prof, resolve, flags)
    live_after = None
    if out.on_cuda:  # pragma: no cover - needs a GPU
        transient = [0] * len(wrapper.region)
    else:
        transient, live_after, out.profiled_peak = profile_memory(
            wrapper, base_globals, inputs, partitions=partitions, owned=flags, shared=out.shared
        )
    owned_storages: set[int] = set()
    for name, flag in zip(wrapper.input_names, flags, strict=False):
        if flag:
            owned_storages |= prof.name_storages.get(name, frozenset())
    out.model = ProgramModel(
        wrapper=wrapper,
        name_storages=prof.name_storages,
        sizes=prof.sizes,
        external=frozenset(prof.external),
        owned=frozenset(owned_storages) & frozenset(prof.external),
        transient=transient,
    )
    out.modelled_peak, out.live = simulate(out.model, list(range(len(wrapper.region))))
    if live_after is not None and out.live != live_after:
        k = next(i for i, (a, b) in enumerate(zip(out.live, live_after, strict=True)) if a != b)
        st = wrapper.region[k]
        out.refusal = (
            f"ownership record violated at statement {k} "
            f"({st.text.splitlines()[0][:60]!r}): live bytes modelled {out.live[k]}, "
            f"measured {live_after[k]}"
        )
        return out
    vary = varying(out.model, resolve)
    if isinstance(vary, str):
        out.refusal = vary
    else:
        out.varying = vary
    return out
