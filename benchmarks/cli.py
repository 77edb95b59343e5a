"""What every benchmark's command line shares: ``--out`` / ``--quick``, the results tail,
and how a benchmark starts a child process of itself.

Benchmarks run from the repository root as ``python -m benchmarks.NAME``; nothing here
changes ``sys.path``. A benchmark writes into ``benchmarks/results/`` only when ``--out``
names a path there; ``--quick`` is its small run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence

__all__ = [
    "ROOT",
    "add_out_quick",
    "child_env",
    "emit",
    "markdown_table",
    "results_markdown",
    "run_module",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository root (what ``python -m benchmarks.NAME`` runs from)."""


def add_out_quick(
    parser: argparse.ArgumentParser,
    *,
    out: str = "write the Markdown table here (nothing is written without it)",
    quick: str | None = "a small run",
) -> None:
    """Add ``--out PATH`` (default None) and, unless ``quick`` is None, ``--quick``."""
    parser.add_argument("--out", default=None, help=out)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)


def emit(markdown: str, out: str | None) -> int:
    """The results tail: print the table, write it to ``out`` when given; returns 0."""
    print(markdown)
    if out:
        with open(out, "w") as f:
            f.write(markdown)
    return 0


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table's lines: the header, its rule, one line per row (cells as given).

    Args:
        header: Column titles.
        rows: One sequence of cells a row, already formatted (``str()`` is applied).

    Returns:
        The lines, without newlines.
    """
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def results_markdown(
    command: str, about: str, header: Sequence[str], rows: Iterable[Sequence[object]]
) -> str:
    """A results page: the command that made it, what ran where, and the table.

    Args:
        command: The command line, as a reader reruns it.
        about: One paragraph: machine, sizes, rounds.
        header: Column titles.
        rows: Formatted cells, one sequence a row.

    Returns:
        The Markdown text, ending in a newline.
    """
    lines = [f"Command: `{command}`", "", about, "", *markdown_table(header, rows)]
    return "\n".join(lines) + "\n"


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the repository root first on ``PYTHONPATH`` (and ``extra``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_module(module: str, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python -m module *args`` from the repository root, output captured as text."""
    kwargs.setdefault("env", child_env())
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        **kwargs,
    )
