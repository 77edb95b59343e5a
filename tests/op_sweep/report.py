"""Runs a sweep over cases and writes its table (tests/op_sweep/run.py has the rules)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from .cases import load_op_db, make_cases
from .extra import EXTRA_OPS
from .run import BASELINE, MODES, CaseResult, run_case

__all__ = ["RESULTS", "Sweep", "counts", "markdown", "sweep"]

RESULTS = ("right", "refused", "wrong", "error")


class Sweep:
    """The results of a sweep: case results and the samples that gave no case."""

    def __init__(self) -> None:
        self.results: list[CaseResult] = []
        self.skipped: list[tuple[str, str, str]] = []  # (op id, dtype, reason)

    @property
    def ops_covered(self) -> set[str]:
        return {r.case.op_id for r in self.results if not r.skipped}

    def ran(self) -> list[CaseResult]:
        return [r for r in self.results if not r.skipped]


def sweep(
    *,
    only: set[str] | None = None,
    kinds: tuple[str, ...] = ("read", "inplace", "out"),
    progress: Callable[[CaseResult], None] | None = None,
) -> Sweep:
    """Runs every case of op_db and the sweep's own operators (or of ``only``).

    Args:
        only: op ids to run (all if None).
        kinds: the kinds of case to build.
        progress: called with each case's result.

    Returns:
        The Sweep."""
    out = Sweep()
    for case, name, dtype, reason in make_cases(
        load_op_db() + list(EXTRA_OPS), only=only, kinds=kinds
    ):
        if case is None:
            out.skipped.append((name, str(dtype), reason))
            continue
        result = run_case(case)
        out.results.append(result)
        if result.skipped:
            out.skipped.append((name, str(dtype), result.skipped))
        if progress is not None:
            progress(result)
    return out


def counts(results: Iterable[CaseResult]) -> dict:
    """``{(mode label, kind): Counter(result -> cases)}`` plus, under the c++ modes,
    ``"storages"``: the cases whose two observers touched different storages."""
    table: dict = collections.defaultdict(collections.Counter)
    for res in results:
        if res.skipped:
            continue
        kind = res.case.kind
        for run in res.runs:
            table[run.mode.label, kind][run.result] += 1
            table[run.mode.label, "all"][run.result] += 1
        for reentrant, declared, _, _ in res.storage_mismatches():
            for mode in MODES:
                if (mode.observer, mode.reentrant, mode.declared) == ("c++", reentrant, declared):
                    table[mode.label, kind]["storages"] += 1
                    table[mode.label, "all"]["storages"] += 1
    return table


def _row(label: str, c: collections.Counter, observer: str) -> str:
    cases = sum(c[r] for r in RESULTS)
    cells = [str(cases)] + [str(c[r]) for r in RESULTS]
    cells.append(str(c["storages"]) if observer == "c++" else "")
    return f"| {label} | " + " | ".join(cells) + " |"


def markdown(s: Sweep) -> str:
    """The sweep's tables and lists, in markdown."""
    ran = s.ran()
    table = counts(ran)
    kinds = collections.Counter(r.case.kind for r in ran)
    sensitive = sum(1 for r in ran if r.case.kind == "read" and r.sensitive)
    lines = [
        f"ops covered: {len(s.ops_covered)}; cases: {len(ran)} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
        f"read cases whose gradient the state change moves: {sensitive} of {kinds['read']}; "
        f"samples skipped: {len(s.skipped)}",
        "",
        'Undeclared modes run at `tr.config.detect = "preserve"`; declared modes at the default '
        'level (`"reads"`).',
        "",
        "| mode | cases | right | refused | wrong | errors | storages differ (c++ vs python) |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES + BASELINE:
        lines.append(_row(mode.label, table[mode.label, "all"], mode.observer))
    lines += ["", "By kind:", ""]
    lines += [
        "| mode | kind | cases | right | refused | wrong | errors | storages differ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        for kind in sorted(kinds):
            row = _row(mode.label, table[mode.label, kind], mode.observer)
            lines.append(row.replace(f"| {mode.label} |", f"| {mode.label} | {kind} |", 1))
    lines += ["", *_lists(ran, s.skipped)]
    return "\n".join(lines) + "\n"


def _modes(labels: set[str]) -> str:
    """The modes of a list entry, shortly: ``c++ declared x2; python declared x2``."""
    short = collections.Counter(
        " ".join(w for w in label.split() if not w.startswith("reentrant=")) for label in labels
    )
    return "; ".join(f"{k} x{n}" for k, n in sorted(short.items()))


def _lists(ran: list[CaseResult], skipped: list[tuple[str, str, str]]) -> list[str]:
    lines: list[str] = []
    for title, want, modes in (
        ("Silently wrong", "wrong", None),
        ("Errors (not a ReplayError)", "error", None),
        ("Refused although declared", "refused", True),
        ("Refused undeclared (the state changed: a named refusal is right)", "refused", False),
    ):
        by_op: dict = collections.defaultdict(lambda: collections.defaultdict(set))
        for res in ran:
            for run in res.runs:
                if run.mode.observer == "torch":
                    continue
                if run.result == want and (modes is None or run.mode.declared == modes):
                    by_op[res.case.op_id][run.detail].add(run.mode.label)
        lines.append(f"## {title}: {len(by_op)} ops")
        lines.append("")
        for op in sorted(by_op):
            for detail, labels in sorted(by_op[op].items()):
                lines.append(f"- `{op}` ({_modes(labels)}): {detail}")
        lines.append("")
    mism: dict = collections.defaultdict(set)
    for res in ran:
        for reentrant, declared, a, b in res.storage_mismatches():
            mism[res.case.op_id].add(
                f"reentrant={reentrant} declared={declared}: c++ {sorted(a)} python {sorted(b)}"
            )
    lines += [f"## Storages touched differ between the observers: {len(mism)} ops", ""]
    for op in sorted(mism):
        for text in sorted(mism[op]):
            lines.append(f"- `{op}` {text}")
    reasons = collections.Counter(reason.split(":")[0] for _, _, reason in skipped)
    lines += ["", "## Samples skipped, by reason", ""]
    lines += [f"- {n} x {reason}" for reason, n in reasons.most_common()]
    return lines
