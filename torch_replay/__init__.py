"""torch_replay: replay-safe activation checkpointing and certified peak memory.

See README.md. The public names are fixed by SPEC section 5.
"""

from __future__ import annotations

from . import schedule
from .audit import audit
from .checkpoint import (
    ReplayConfig,
    checkpoint,
    checkpoint_sequential,
    config,
    engine_bytes,
    last_transaction,
)
from .errors import (
    InfeasibleBudgetError,
    OverlapError,
    ReplayError,
    RngMismatchError,
    StateMutationError,
    UnsupportedReplayError,
)
from .planned import PlannedSequential
from .planner import Option, Plan, plan

__version__ = "0.1.0"

__all__ = [
    "InfeasibleBudgetError",
    "Option",
    "OverlapError",
    "Plan",
    "PlannedSequential",
    "ReplayConfig",
    "ReplayError",
    "RngMismatchError",
    "StateMutationError",
    "UnsupportedReplayError",
    "__version__",
    "audit",
    "checkpoint",
    "checkpoint_sequential",
    "config",
    "engine_bytes",
    "last_transaction",
    "plan",
    "schedule",
]
