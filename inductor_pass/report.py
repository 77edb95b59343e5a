"""Per-graph reports of the pass."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field

__all__ = ["GraphReport", "reports", "clear_reports", "failed", "record", "dump"]


@dataclass(kw_only=True, slots=True)
class GraphReport:
    """What the pass did to one compiled graph."""

    graph_id: int = 0
    """Sequence number in this process."""
    kind: str = "inference"
    """``"forward"``, ``"backward"`` or ``"inference"``."""
    device: str = "cpu"
    size: str = ""
    """For a graph with symbolic sizes, the call's sizes this report is for (``"s77=16"``;
    Note [Per-size orders] in ``inductor_pass/runtime/per_size.py``); "" for a static graph."""
    deployed: bool = False
    """The permuted program replaced the original."""
    reason: str = ""
    """Why it was (not) deployed or left unchanged."""
    modelled_original_peak: int | None = None
    modelled_permuted_peak: int | None = None
    measured_original_peak: int | None = None
    measured_permuted_peak: int | None = None
    num_inputs: int = 0
    """Tensor inputs of the graph."""
    owned_inputs: int = 0
    """Inputs the call owns (freed at their last use, Note [Input ownership] in
    ``inductor_pass/stages/guard.py``); peaks count them from the start of the call."""
    measured_all_held_peaks: tuple[int, int] | None = None
    """(original, permuted) measured peaks when the caller holds every input
    (only measured when the call owns some)."""
    variant: str = "default"
    """The program deployed: Inductor's default one, or a variant (Note [Program
    variants] in ``inductor_pass/variants/choose.py``)."""
    variants: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per program (``default`` and each variant): modelled and measured peaks,
    lower bound, certificate and the pass's decision on it."""
    ablation_permuted_peak: int | None = None
    """Modelled peak when every access is treated as a write (``PassConfig.ablation``)."""
    byte_exact: bool | None = None
    """Modelled == measured for both programs (CPU)."""
    bitwise_identical: bool | None = None
    """Outputs and final inputs of both programs are bit-identical."""
    lower_bound: int | None = None
    """Best proven lower bound on the modelled peak of any emitted unit order."""
    bounds: dict[str, int] = field(default_factory=dict)
    """``event_cut``, ``forward_trap``, ``reverse_trap`` (and more) from the scheduling core."""
    certified: bool = False
    """The permuted program's peak equals ``lower_bound`` (optimal)."""
    num_statements: int = 0
    num_units: int = 0
    candidate: str = ""
    """Heuristic that found the chosen order."""
    candidates: dict[str, int] = field(default_factory=dict)
    kernel_seconds: dict[str, object] = field(default_factory=dict)
    """CUDA guard: device time per run of the ``original`` and ``permuted`` programs and
    its ``source`` (``"cupti"`` when CUPTI records were read; see
    ``torch_replay/_planning/kernel_timing.py``). Empty on CPU."""
    pass_seconds: float = 0.0
    """Wall-clock time of the pass at the first call (profiling, search and guard of every
    program run, the variant bounds and the choice)."""
    search_seconds: float = 0.0
    """Wall-clock time of the scheduling core (exact search and lower bounds) for this graph."""
    recomputed: list[dict[str, object]] = field(default_factory=list)
    """Recomputed chains (``PassConfig.recompute``): per chain the buffer's names and
    bytes, the re-emitted kernels, their extra MACs and cost, and the late use."""
    recompute_note: str = ""
    """What recomputation did, or why it could not lower the peak."""
    notes: list[str] = field(default_factory=list)
    permuted_source: str | None = field(default=None, repr=False)
    original_source: str | None = field(default=None, repr=False)
    live_original: list[int] = field(default_factory=list, repr=False)
    live_permuted: list[int] = field(default_factory=list, repr=False)
    permuted_order: list[int] | None = field(default=None, repr=False)
    """Region statement order of the permuted program (what the decision cache stores)."""

    def as_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        for k in (
            "permuted_source",
            "original_source",
            "live_original",
            "live_permuted",
            "permuted_order",
        ):
            d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> GraphReport:
        """A report from :meth:`as_dict` output (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and k != "graph_id"}
        if isinstance(kw.get("measured_all_held_peaks"), list):
            kw["measured_all_held_peaks"] = tuple(kw["measured_all_held_peaks"])  # type: ignore[arg-type]
        return cls(**kw)  # type: ignore[arg-type]

    def summary(self) -> str:
        def mib(x: int | None) -> str:
            return "-" if x is None else f"{x / 2**20:.3f} MiB"

        return (
            f"[torch_replay] graph {self.graph_id} ({self.kind}, {self.device}"
            f"{', ' + self.size if self.size else ''}): "
            f"{'DEPLOYED' if self.deployed else 'unchanged'}; modelled "
            f"{mib(self.modelled_original_peak)} -> {mib(self.modelled_permuted_peak)}, "
            f"measured {mib(self.measured_original_peak)} -> "
            f"{mib(self.measured_permuted_peak)}, lower bound {mib(self.lower_bound)}, "
            f"certified={self.certified}, units={self.num_units}, "
            f"owned inputs {self.owned_inputs}/{self.num_inputs}, program {self.variant}; "
            f"{self.reason}"
            + (
                f"; recomputed {len(self.recomputed)} chain(s) (the bound is of permutations)"
                if self.recomputed
                else ""
            )
        )

    def __str__(self) -> str:
        """A short table: the two programs' modelled and measured peaks, the bound, the verdict."""

        def mib(x: int | None) -> str:
            return "-" if x is None else f"{x / 2**20:.3f}"

        status = "DEPLOYED" if self.deployed else "unchanged"
        lines = [
            f"torch_replay graph {self.graph_id} ({self.kind}, {self.device}"
            f"{', ' + self.size if self.size else ''}): {status}, "
            f"program {self.variant}",
            f"  {'peak MiB':<16}{'modelled':>10}{'measured':>10}",
            f"  {'Inductor':<16}{mib(self.modelled_original_peak):>10}"
            f"{mib(self.measured_original_peak):>10}",
            f"  {'permuted':<16}{mib(self.modelled_permuted_peak):>10}"
            f"{mib(self.measured_permuted_peak):>10}",
            f"  {'lower bound':<16}{mib(self.lower_bound):>10}"
            + ("   (certified optimal)" if self.certified else ""),
            f"  byte-exact {self.byte_exact}, bitwise identical {self.bitwise_identical}, "
            f"{self.num_units} units, owned inputs {self.owned_inputs}/{self.num_inputs}",
        ]
        if self.reason:
            lines.append(f"  why: {self.reason}")
        for c in self.recomputed:  # the lower bound above is of permutations only
            lines.append(
                f"  recomputed {c.get('names')} "
                f"({c.get('bytes')} B) before {c.get('late_use')}: {c.get('extra_macs')} MACs"
            )
        if self.recompute_note and not self.recomputed:
            lines.append(f"  recomputation: {self.recompute_note}")
        for note in self.notes[:3]:
            lines.append(f"  note: {note}")
        if len(self.notes) > 3:
            lines.append(f"  … {len(self.notes) - 3} more notes ({len(self.notes)} in all)")
        return "\n".join(lines)


_REPORTS: list[GraphReport] = []


def reports() -> list[GraphReport]:
    """One report per graph compiled through the pass in this process, newest last (for a
    graph with symbolic sizes, one per size: ``GraphReport.size``)."""
    return list(_REPORTS)


def clear_reports() -> None:
    """Forget the reports (tests)."""
    _REPORTS.clear()


def failed(kind: str, source: str | None, exc: BaseException) -> GraphReport:
    """The report of a graph the pass left unchanged because it raised ``exc`` (call it
    in the ``except`` block: the notes keep the traceback)."""
    import traceback

    rep = GraphReport(
        kind=kind,
        original_source=source,
        reason=f"left unchanged: pass failed ({type(exc).__name__}: {exc})",
    )
    rep.notes.append(traceback.format_exc(limit=6))
    return rep


def record(report: GraphReport, *, print_it: bool, dump_dir: str | None) -> None:
    report.graph_id = len(_REPORTS)
    _REPORTS.append(report)
    if print_it:
        print(report.summary(), file=sys.stderr)
    if dump_dir:
        try:
            dump(report, dump_dir)
        except Exception as exc:  # dumping is diagnostics only
            report.notes.append(f"dump failed: {exc}")


def dump(report: GraphReport, directory: str) -> list[str]:
    """Write the original and permuted wrapper sources (and a timeline PNG with matplotlib).

    Returns:
        The paths written.
    """
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"graph{report.graph_id:03d}_{report.kind}")
    written = []
    for suffix, text in (
        ("original", report.original_source),
        ("permuted", report.permuted_source),
    ):
        if text is not None:
            path = f"{stem}_{suffix}.py"
            with open(path, "w") as f:
                f.write(text)
            written.append(path)
    with open(f"{stem}_report.txt", "w") as f:
        f.write(report.summary() + "\n")
    written.append(f"{stem}_report.txt")
    if report.live_original:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception:
            return written
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.step(range(len(report.live_original)), report.live_original, label="original")
        if report.live_permuted:
            ax.step(range(len(report.live_permuted)), report.live_permuted, label="permuted")
        ax.set_xlabel("statement")
        ax.set_ylabel("live bytes (modelled)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{stem}_timeline.png")
        plt.close(fig)
        written.append(f"{stem}_timeline.png")
    return written
