"""Verification of the replay contract: the suites behind ``python -m torch_replay.suites``.

* :mod:`.reference`: the reference suites on the C++ interpreter;
* :mod:`.cohort_program`, :mod:`.cohort_jax`, :mod:`.cohort`: the torch (and JAX) cohort;
* :mod:`.report`: results, targets and their Markdown; :mod:`.cli`: the command line.
"""

from __future__ import annotations

from .cli import main, run_suite
from .cohort_program import COHORT_METHODS
from .report import SUITES, SuiteResult

__all__ = ["COHORT_METHODS", "SUITES", "SuiteResult", "main", "run_suite"]
