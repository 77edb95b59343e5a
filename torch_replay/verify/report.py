"""What a suite returns and how it is reported: sizes, SuiteResult, progress, targets, Markdown."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._ext import require_extension
from ..planner import OPTION_NAMES

SUITES = ("numeric", "bytes", "engines", "complex-step", "alias-stress", "cohort")
DEFAULT_SIZES = {
    "numeric": 1024,
    "bytes": 1024,
    "engines": 1200,
    "complex-step": 96,
    "alias-stress": 50,
    "cohort": 50,
}
QUICK_SIZES = {
    "numeric": 64,
    "bytes": 64,
    "engines": 64,
    "complex-step": 8,
    "alias-stress": 4,
    "cohort": 2,
}
"""Sizes of ``--quick`` (the small run)."""
DEFAULT_SEEDS = {"cohort": 420000}
REFERENCE_ENGINES = OPTION_NAMES
"""The engines the reference interpreter runs: every planner option."""


@dataclass(kw_only=True, slots=True)
class SuiteResult:
    """What one suite measured."""

    suite: str
    """Suite name."""
    params: dict[str, Any]
    """Seed, size and knobs."""
    measured: dict[str, Any]
    """Every figure, by name."""
    targets: list[dict[str, Any]]
    """One row per target: ``name``, ``target``, ``measured``, ``passed``."""
    seconds: float = 0.0
    """Wall time."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """One record per execution (cohort only)."""
    table: list[list[str]] = field(default_factory=list)
    """Extra markdown table rows (cohort summary), first row the header."""

    @property
    def passed(self) -> bool:
        """True if every target is met."""
        return all(t["passed"] for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "passed": self.passed, "seconds": round(self.seconds, 3)}


class _Progress:
    """A one-line progress bar on stderr (silent when ``quiet``)."""

    def __init__(self, label: str, total: int, quiet: bool) -> None:
        self.label, self.total, self.quiet = label, max(total, 1), quiet
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self.last < 0.1 and done < self.total):
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total)
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\r{self.label:<13}[{bar}] {done}/{self.total} {now - self.start:6.1f}s")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _target(name: str, target: str, measured: Any, passed: bool) -> dict[str, Any]:
    return {"name": name, "target": target, "measured": measured, "passed": bool(passed)}


def _all_of(name: str, target: str, counts: tuple[int, int], verb: str) -> dict[str, Any]:
    """A target met when every one of ``counts[1]`` cases is ``verb`` (``counts[0]`` were)."""
    done, total = counts
    return _target(name, target, f"{done}/{total} {verb}", done == total)


def _knobs(seed: int) -> dict[str, Any]:
    """Per-program generator knobs, varied with the seed so a suite covers the space."""
    r = random.Random(seed * 7919 + 17)
    ops = r.randint(3, 16)
    return {
        "buffers": r.randint(2, 5),
        "ops": ops,
        "segments": r.randint(1, min(4, ops)),
        "alias_rate": r.choice([0.0, 0.3, 0.6]),
        "overlap_rate": r.choice([0.0, 0.3, 0.6]),
        "rng_rate": r.choice([0.0, 0.3, 0.6]),
        "int_write_rate": r.choice([0.0, 0.1, 0.2]),
    }


def _program(seed: int, **extra: Any):
    C = require_extension()
    knobs = _knobs(seed)
    knobs.update(extra)
    return C.contract.generate_program(seed, **knobs)


def _markdown(results: list[SuiteResult], command: str) -> str:
    lines = [
        "# Replay contract suites",
        "",
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores.",
        "",
    ]
    for r in results:
        lines += [
            f"## {r.suite} ({'PASS' if r.passed else 'FAIL'}, {r.seconds:.1f} s)",
            "",
            f"Parameters: `{json.dumps(r.params)}`",
            "",
            "| target | required | measured | ok |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {t['name']} | {t['target']} | {t['measured']} | {'yes' if t['passed'] else 'NO'} |"
            for t in r.targets
        ]
        if r.suite == "cohort":
            lines += [
                "",
                f"JAX: {r.measured['jax']}. Records: {r.measured['records']} "
                f"({r.measured['programs']} programs): torch {r.measured['torch_records']}, "
                f"JAX {r.measured.get('jax_records', 0)}.",
            ]
        if r.table:
            lines += ["", "| " + " | ".join(r.table[0]) + " |", "|" + "---|" * len(r.table[0])]
            lines += ["| " + " | ".join(row) + " |" for row in r.table[1:]]
        lines.append("")
    return "\n".join(lines)
