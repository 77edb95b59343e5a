"""Error classes of torch_replay.

Every error says what happened and what to do. When one is raised, the user's
tensors, buffers and generators are left exactly as they were before the call
that raised it.
"""

from __future__ import annotations

__all__ = [
    "ReplayError",
    "StateMutationError",
    "RngMismatchError",
    "UnsupportedReplayError",
    "OverlapError",
    "InfeasibleBudgetError",
    "CostsMismatchError",
]


class ReplayError(RuntimeError):
    """Base class: a checkpoint replay could not be made exact."""


class StateMutationError(ReplayError):
    """Declared or detected state changed and cannot be restored for the replay."""


class RngMismatchError(ReplayError):
    """A generator ended the replay at a different position than the forward."""


class UnsupportedReplayError(ReplayError):
    """The request cannot be honoured (for example a float gradient through an integer write)."""


class OverlapError(ReplayError):
    """An operation writes memory that one of its inputs reads through a different view."""


class InfeasibleBudgetError(ReplayError):
    """No plan fits the memory budget; ``min_budget`` is the smallest budget that has one."""

    def __init__(self, message: str, min_budget: int | None = None):
        super().__init__(message)
        self.min_budget = min_budget


class CostsMismatchError(ValueError):
    """A costs file (or dict) was calibrated on another model than the one given.

    Raised by :class:`~torch_replay.PlannedSequential` when the model
    fingerprint stored in the costs (segment classes, parameter and buffer
    shapes and dtypes) differs from the segments it is asked to run, or when
    the number of segments differs. The message names the first difference.
    Calibrate the model you run: :func:`torch_replay.calibrate_model` or
    ``python -m torch_replay.calibrate --model pkg.module:factory --out costs.json``.
    """
