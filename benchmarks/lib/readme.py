"""The benchmarks' table (benchmarks/README.md: script, result files, small run, time) and
its copy in docs/commands.md.

    python -m benchmarks.lib.readme            # exit status 1 if docs/commands.md differs
    python -m benchmarks.lib.readme --write    # copy the table into docs/commands.md

The table is the lines from ``BEGIN`` to ``END`` in both files; docs/commands.md gets it
verbatim (tests/test_bench_readme.py checks that they agree).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from benchmarks.lib.cli import ROOT, make_parser

__all__ = ["BEGIN", "COMMANDS", "END", "README", "Row", "block", "main", "rows", "write"]

README = os.path.join(ROOT, "benchmarks", "README.md")
COMMANDS = os.path.join(ROOT, "docs", "commands.md")
BEGIN = "<!-- benchmarks table -->"
END = "<!-- end of benchmarks table -->"


@dataclass(frozen=True)
class Row:
    """One script's row."""

    module: str
    """What ``python -m`` runs: ``benchmarks.bench_soak``."""
    command: str
    """The command cell, without backticks."""
    results: tuple[str, ...]
    """The result files (repository paths), in the cell's order."""
    small: str
    """The small-run cell."""
    time: str
    """The time cell."""


def block(path: str) -> str:
    """The table of ``path``: its lines from ``BEGIN`` to ``END``, both included."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: no {BEGIN} ... {END} block")
    return text[start : end + len(END)]


def rows(path: str = README) -> list[Row]:
    """The rows of ``path``'s table."""
    out = []
    for line in block(path).splitlines()[3:-1]:  # (the marker, the header and its rule)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            raise ValueError(f"{path}: not four cells: {line}")
        command = cells[0].strip("`")
        module = re.match(r"python -m (\S+)", command)
        if module is None:
            raise ValueError(f"{path}: not a `python -m` command: {line}")
        results = tuple(re.findall(r"`(benchmarks/results/[^`]*)`", cells[1]))
        out.append(Row(module.group(1), command, results, cells[2], cells[3]))
    return out


def write(readme: str = README, commands: str = COMMANDS) -> bool:
    """Copy ``readme``'s table into ``commands`` (in place of its own); True if it changed."""
    with open(commands) as f:
        text = f.read()
    old = block(commands)
    new = block(readme)
    if old == new:
        return False
    with open(commands, "w") as f:
        f.write(text.replace(old, new))
    return True


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__, whole_doc=True)
    p.add_argument("--write", action="store_true", help="copy the table into docs/commands.md")
    args = p.parse_args(argv)
    if args.write:
        print("docs/commands.md: " + ("rewritten" if write() else "already the same"))
        return 0
    same = block(README) == block(COMMANDS)
    print("docs/commands.md: " + ("the same table" if same else "differs; run with --write"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
