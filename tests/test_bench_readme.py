"""benchmarks/README.md's table (script, result files, small run, time) against the
scripts, the committed results and its copy in docs/commands.md; and every script's
parser from the one CLI helper (benchmarks/lib/cli.py's ``make_parser``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from benchmarks.lib.readme import COMMANDS, README, block, rows

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def test_docs_commands_has_the_readme_table_verbatim():
    assert block(COMMANDS) == block(README), (
        "docs/commands.md's benchmarks table differs from benchmarks/README.md's: "
        "run python -m benchmarks.lib.readme --write"
    )


def test_every_bench_script_has_a_row_and_every_row_a_script():
    modules = [r.module for r in rows()]
    assert len(modules) == len(set(modules)), modules
    scripts = {f"benchmarks.{p.stem}" for p in BENCH.glob("bench_*.py")}
    assert scripts - set(modules) == set(), "bench_*.py without a row in benchmarks/README.md"
    for m in modules:
        rel = Path(*m.split("."))
        assert (ROOT / rel.with_suffix(".py")).is_file() or (
            ROOT / rel / "__main__.py"
        ).is_file(), m


def test_every_result_file_of_the_table_is_committed():
    for r in rows():
        for path in r.results:
            assert (ROOT / path).exists(), f"{r.module}: {path}"
        assert r.small and r.time, r


def test_every_benchmark_command_of_docs_commands_has_a_row():
    text = Path(COMMANDS).read_text().replace(block(COMMANDS), "")
    named = set(re.findall(r"python -m (benchmarks\.[\w.]+)", text))
    named.discard("benchmarks.lib.readme")  # (the command that copies the table)
    assert named <= {r.module for r in rows()}, named - {r.module for r in rows()}


def _calls(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def test_every_script_parses_its_arguments_through_make_parser():
    """A script (a module run as ``__main__``) builds its parser with ``make_parser``, or is
    a profiler's entry point (it runs ``benchmarks.profilers.NAME.main``); only
    benchmarks/lib/cli.py makes an ``ArgumentParser``."""
    for path in sorted(BENCH.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        calls = _calls(tree)
        rel = path.relative_to(ROOT).as_posix()
        if rel != "benchmarks/lib/cli.py":
            assert "ArgumentParser" not in calls, rel
        is_script = path.name == "__main__.py" or "__main__" in path.read_text()
        if not is_script:
            continue
        entry = any(
            isinstance(n, ast.ImportFrom) and (n.module or "").startswith("benchmarks.profilers.")
            for n in ast.walk(tree)
        )
        assert "make_parser" in calls or entry, f"{rel}: no make_parser"
