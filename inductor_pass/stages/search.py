"""The search stage: dependences, the best order and its certificate, recomputation.

After the profile stage (``inductor_pass/stages/profile.py``) has modelled the
program, :func:`search_program` builds the units' dependences
(:func:`inductor_pass.program.units.build_dependences`), searches the best emitted
order with the heuristics and the scheduling core
(:func:`inductor_pass.program.permute.search_order`: lower bounds, exact search,
certificate; with data-dependent sizes only orders no higher at every size,
Note [Data-dependent sizes] in ``inductor_pass/program/unbacked.py``),
optionally the all-writes ablation, and then selective
recomputation (Note [Recomputation in the wrapper] in
``inductor_pass/stages/recompute.py``). The result, :class:`Searched`, is the program
to guard (``inductor_pass/stages/decide.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from inductor_pass.config import PassConfig
from inductor_pass.program.permute import SearchResult, search_order
from inductor_pass.program.unbacked import no_higher_at_every_size, segment_edges
from inductor_pass.program.units import ProgramModel, build_dependences, simulate
from inductor_pass.program.wrapper_ast import Wrapper
from inductor_pass.report import GraphReport
from inductor_pass.stages.profile import Profiled

__all__ = ["Searched", "search_program"]


@dataclass(kw_only=True, slots=True)
class Searched:
    """The search stage's result: the program to guard and how it was found."""

    result: SearchResult
    """The order search (peak, bounds, certificate, candidates)."""
    num_units: int
    ablation_peak: int | None
    """Best peak with every access treated as a write (``PassConfig.ablation``)."""
    wrapper: Wrapper
    """The program to guard: the profiled wrapper, or a recomputed one."""
    order: list[int]
    """Its statement order."""
    peak: int
    """Its modelled peak."""
    model: ProgramModel
    live: list[int]
    """Its modelled live bytes after each statement."""

    recomputed: bool = False
    """Whether recomputation changed the program (then it is not a permutation)."""

    @property
    def unchanged(self) -> bool:
        """Whether the program to guard is the profiled one in its original order."""
        return not self.recomputed and self.order == list(range(len(self.wrapper.region)))


def search_program(
    prof: Profiled,
    *,
    base_globals: dict[str, Any],
    partitions: Any,
    resolve: Callable[[str], object],
    config: PassConfig,
    rep: GraphReport,
) -> Searched:
    """The search stage (see the module docstring); recomputation notes go to ``rep``."""
    model = prof.model
    assert model is not None
    units, edges, attached, tail = build_dependences(model, resolve, all_writes=config.all_writes)
    vary = prof.varying  # Note [Data-dependent sizes] in inductor_pass/program/unbacked.py
    admissible = None if vary is None else partial(no_higher_at_every_size, model, vary)
    extra = None
    if vary is not None:
        within = search_order(
            model,
            units,
            edges | segment_edges(model, vary, units),
            attached,
            tail,
            use_core=config.use_core,
            time_limit_s=config.time_limit_s,
            admissible=admissible,
        )
        extra = {"between data-dependent units": within.unit_order}
    res = search_order(
        model,
        units,
        edges,
        attached,
        tail,
        use_core=config.use_core,
        time_limit_s=config.time_limit_s,
        admissible=admissible,
        extra=extra,
    )
    ablation = None
    if config.ablation:
        aw = build_dependences(model, resolve, all_writes=True)
        ablation = search_order(
            model, *aw, use_core=config.use_core, time_limit_s=config.time_limit_s
        ).peak
        build_dependences(model, resolve, all_writes=config.all_writes)  # restore effects
    wrapper, order, peak, out_model = model.wrapper, res.stmt_order, res.peak, model
    if config.recompute and vary is not None:
        rep.recompute_note = (
            "not with data-dependent sizes (a recomputation is chosen by its peak at one size)"
        )
    elif (
        config.recompute
    ):  # Note [Recomputation in the wrapper] in inductor_pass/stages/recompute.py
        from inductor_pass.stages import recompute

        rep.bounds = res.bounds  # the recomputation adds its bound to the same dict
        wrapper, order, peak, out_model = recompute.in_pass(
            model,
            res.stmt_order,
            res.peak,
            rep,
            base_globals=base_globals,
            inputs=prof.inputs,
            partitions=partitions,
            resolve=resolve,
            config=config,
            on_cuda=prof.on_cuda,
        )
    return Searched(
        result=res,
        num_units=len(units),
        ablation_peak=ablation,
        wrapper=wrapper,
        order=order,
        peak=peak,
        model=out_model,
        live=simulate(out_model, order)[1],
        recomputed=wrapper is not model.wrapper,
    )
