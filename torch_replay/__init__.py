"""torch_replay: replay-safe activation checkpointing and certified peak memory.

The public names are listed in ``__all__``; the user's guide is in ``docs/``. The rooms,
in the order a call travels:

- ``checkpoint()`` (``_replay/``): ``api`` parses torch's and torch_replay's options into
  one ``call.SegmentCall`` under the settings of ``config``; ``segment`` builds its C++
  Transaction from the declared state; ``nonreentrant`` or ``reentrant`` runs it under
  the observer (``observe``) and drives the re-run in backward, or ``compiled`` hands it
  to Dynamo's checkpoint region; ``naming`` names tensors in errors; ``fsdp`` hides
  FSDP2's traffic; ``drop_in`` reads the installed torch's signature; ``replace``
  (``replace_torch_checkpoint``) routes code that calls ``torch.utils.checkpoint``
  itself to ``checkpoint()`` for one block.
- Wrapping modules: ``wrapper`` (``checkpoint_wrapper``, ``apply_activation_checkpointing``)
  and ``integrations/`` (transformers, timm), over ``checkpoint()``.
- Planning (``_planning/``): ``planner.plan`` on the option model (``options``);
  ``planned.PlannedSequential`` and ``layer_budget.plan_layers`` measure with ``runner``,
  ``peak``, ``layer_costs`` and ``kernel_timing``, and plan with ``layer_order``;
  ``calibrate/`` measures costs files; ``schedule`` and ``step_peak`` stand apart.
- Checking: ``audit/`` (is a model safe to checkpoint), ``verify/`` (the replay-contract
  suites, ``suites``), ``testing`` (for users' test suites).

``calibrate_model`` is imported on first use, so that ``python -m
torch_replay.calibrate`` runs its module only once.
"""

from __future__ import annotations

from . import schedule
from ._replay.api import checkpoint, checkpoint_sequential
from ._replay.config import ENGINES, ReplayConfig, config
from ._replay.replace import replace_torch_checkpoint
from ._replay.segment import engine_bytes, heap_setting, last_transaction
from .audit import audit
from .errors import (
    CostsMismatchError,
    InfeasibleBudgetError,
    OverlapError,
    ReplayError,
    RngMismatchError,
    StateMutationError,
    UnsupportedReplayError,
)
from .planned import PlannedSequential
from .planner import Option, Plan, plan
from .wrapper import apply_activation_checkpointing, checkpoint_wrapper

__version__ = "0.1.0"

__all__ = [
    "ENGINES",
    "CostsMismatchError",
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
    "apply_activation_checkpointing",
    "audit",
    "calibrate_model",
    "checkpoint",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "config",
    "engine_bytes",
    "heap_setting",
    "last_transaction",
    "plan",
    "replace_torch_checkpoint",
    "schedule",
]


def __getattr__(name: str):
    if name == "calibrate_model":
        from .calibrate import calibrate_model

        return calibrate_model
    raise AttributeError(f"module 'torch_replay' has no attribute {name!r}")
