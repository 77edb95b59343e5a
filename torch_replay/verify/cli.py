"""The command line ``python -m torch_replay.suites`` and ``run_suite``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

from .cohort import suite_cohort
from .reference import (
    suite_alias_stress,
    suite_bytes,
    suite_complex_step,
    suite_engines,
    suite_numeric,
)
from .report import DEFAULT_SEEDS, DEFAULT_SIZES, QUICK_SIZES, SUITES, SuiteResult, _markdown

# ------------------------------------------------------------------------ CLI

_RUNNERS: dict[str, Callable[[int, int, bool], SuiteResult]] = {
    "numeric": suite_numeric,
    "bytes": suite_bytes,
    "engines": suite_engines,
    "complex-step": suite_complex_step,
    "alias-stress": suite_alias_stress,
    "cohort": suite_cohort,
}


def run_suite(
    name: str, *, seed: int | None = None, programs: int | None = None, quiet: bool = True
) -> SuiteResult:
    """Run one suite.

    Args:
        name: one of :data:`SUITES`.
        seed: first seed (default: 0, the cohort 420000).
        programs: size (default: :data:`DEFAULT_SIZES`).
        quiet: no progress bar.

    Returns:
        The suite's result.

    Raises:
        ValueError: unknown suite name or a size below 1.
    """
    if name not in _RUNNERS:
        raise ValueError(f"suite must be one of {SUITES}, got {name!r}")
    seed = DEFAULT_SEEDS.get(name, 0) if seed is None else seed
    programs = DEFAULT_SIZES[name] if programs is None else programs
    if programs < 1:
        raise ValueError(f"--programs must be at least 1, got {programs}")
    start = time.monotonic()
    result = _RUNNERS[name](seed, programs, quiet)
    result.seconds = time.monotonic() - start
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        0 if every target of every suite run is met, else 1.
    """
    ap = argparse.ArgumentParser(
        prog="python -m torch_replay.suites",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("suite", choices=[*SUITES, "all"])
    ap.add_argument("--seed", type=int, default=None, help="first seed (default per suite)")
    ap.add_argument(
        "--programs",
        type=int,
        default=None,
        help="programs per suite (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_SIZES.items())
        + ")",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the small run: " + ", ".join(f"{k} {v}" for k, v in QUICK_SIZES.items()),
    )
    ap.add_argument(
        "--out", default=None, help="directory to write suites.md and suites_<suite>.json into"
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    command = "python -m torch_replay.suites " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results = []
    for name in names:
        programs = args.programs
        if programs is None and args.quick:
            programs = QUICK_SIZES[name]
        r = run_suite(name, seed=args.seed, programs=programs, quiet=args.quiet)
        results.append(r)
        print(f"{name}: {r.seconds:.1f} s")
        if args.out:
            with open(os.path.join(args.out, f"suites_{name}.json"), "w") as f:
                # The cohort's records are many: one line each keeps the file small.
                json.dump(
                    {"command": command, **r.to_dict()},
                    f,
                    indent=None if r.records else 1,
                    default=str,
                )
        for t in r.targets:
            print(
                f"[{'ok' if t['passed'] else 'FAIL'}] {name}: {t['name']}: {t['measured']} "
                f"(target {t['target']})"
            )
    if args.out:
        with open(os.path.join(args.out, "suites.md"), "w") as f:
            f.write(_markdown(results, command))
        print(f"wrote {os.path.join(args.out, 'suites.md')}")
    return 0 if all(r.passed for r in results) else 1
