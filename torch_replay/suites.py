"""Replay contract suites: generated programs that check the replay contract, rerunnable by anyone.

::

    python -m torch_replay.suites {numeric,bytes,engines,complex-step,alias-stress,cohort,all}
        [--quick] [--seed S] [--programs N] [--out DIR]

Each suite prints a progress bar and a line per target (measured figure and target). With
``--out DIR`` it also writes ``DIR/suites_<suite>.json`` (every measured figure and its target)
and ``DIR/suites.md`` (one table per suite run); without ``--out`` nothing is written.
The default sizes (1,024 programs for numeric and bytes, 1,200 for engines, 96 for
complex-step, 50 for alias-stress and the cohort) take several minutes each on a small CPU;
``--quick`` runs a few programs per suite (:data:`QUICK_SIZES`; a minute or two, most of it
the cohort). The reference suites (numeric,
bytes, engines, complex-step, alias-stress) run the torch-free interpreter of the C++ core's
replay contract; the cohort lowers generated programs to real torch modules and runs them
eagerly, under ``torch.utils.checkpoint`` and under ``torch_replay.checkpoint``.
"""

from __future__ import annotations

from .verify import COHORT_METHODS, SUITES, SuiteResult, main, run_suite

__all__ = ["COHORT_METHODS", "SUITES", "SuiteResult", "main", "run_suite"]

if __name__ == "__main__":
    raise SystemExit(main())
