"""What every benchmark's command line shares: its parser (:func:`make_parser`), ``--out`` /
``--quick`` (:func:`add_out_quick`), the results tail, and how a benchmark starts a child
process of itself.

Every script under ``benchmarks/`` (``bench_*.py``, ``integrations_stacks.py``, ``moco``
and the profilers of ``benchmarks/profilers/``) builds its parser with :func:`make_parser`;
tests/test_bench_readme.py checks that. Benchmarks run from the repository root as
``python -m benchmarks.NAME``; nothing here changes ``sys.path``. A benchmark writes into
``benchmarks/results/`` only when ``--out`` names a path there; ``--quick`` is its small
run.
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
    "make_parser",
    "child_env",
    "emit",
    "markdown_table",
    "results_markdown",
    "run_module",
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root (what ``python -m benchmarks.NAME`` runs from)."""


def make_parser(
    doc: str | None,
    *,
    whole_doc: bool = False,
    formatter: type[argparse.HelpFormatter] | None = None,
    prog: str | None = None,
) -> argparse.ArgumentParser:
    """A benchmark's argument parser, described by its module docstring ``doc``.

    Args:
        doc: The script's ``__doc__``.
        whole_doc: Describe with the whole docstring, as written (``--help`` keeps its
            lines); otherwise with its first line.
        formatter: The help formatter (default: ``RawDescriptionHelpFormatter`` with
            ``whole_doc``, argparse's own without).
        prog: The program name ``--help`` shows (default: argparse's).
    """
    description = (doc or "") if whole_doc else (doc or "").split("\n")[0]
    if formatter is None and whole_doc:
        formatter = argparse.RawDescriptionHelpFormatter
    kwargs = {"formatter_class": formatter} if formatter is not None else {}
    return argparse.ArgumentParser(prog=prog, description=description, **kwargs)


def add_out_quick(
    parser: argparse.ArgumentParser,
    *,
    out: str | None = "write the Markdown table here (nothing is written without it)",
    quick: str | None = "a small run",
    **out_options,
) -> None:
    """Add ``--out PATH`` (default None) and, unless ``quick`` is None, ``--quick``.

    Args:
        parser: The parser of :func:`make_parser`.
        out: ``--out``'s help text.
        quick: ``--quick``'s help text; None: the script has no ``--quick``.
        out_options: More of ``--out``'s ``add_argument`` keywords (``type``, ``default``,
            ``required``).
    """
    out_options.setdefault("default", None)
    parser.add_argument("--out", help=out, **out_options)
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


def child_env(*, root: str = ROOT, **extra: str) -> dict[str, str]:
    """This environment with ``root`` (default: the repository root) first on
    ``PYTHONPATH``, and ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_module(
    module: str,
    args: list[str],
    *,
    python: str | None = None,
    root: str | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """``python -m module *args`` from the repository root, output captured as text.

    Args:
        module: The module to run.
        args: Its arguments.
        python: The interpreter (default: this one).
        root: Run from this copy of the tree instead (its ``module``, its
            ``torch_replay`` and the extension built there), with it first on
            ``PYTHONPATH``.
        kwargs: More ``subprocess.run`` keywords (``env`` replaces :func:`child_env`'s).
    """
    root = root or ROOT
    kwargs.setdefault("env", child_env(root=root))
    return subprocess.run(
        [python or sys.executable, "-m", module, *args],
        cwd=root,
        capture_output=True,
        text=True,
        **kwargs,
    )
