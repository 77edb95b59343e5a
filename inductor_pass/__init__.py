"""torch_replay's Inductor plugin: permute the generated wrapper for a lower, byte-exact peak.

``import inductor_pass`` registers the ``torch_replay`` backend, so that
``torch.compile(model, backend="torch_replay")`` runs Inductor and then the
post-codegen pass on every forward, backward and inference graph.
Every graph gets a report (:func:`reports`); ``TORCH_REPLAY_REPORT=1`` prints
them and ``TORCH_REPLAY_DUMP=DIR`` writes the original and permuted wrappers.
Any failure inside the pass leaves the graph's program unchanged.
"""

from __future__ import annotations

from inductor_pass.config import PassConfig, get_config, set_config
from inductor_pass.report import GraphReport, clear_reports, reports
from inductor_pass.runtime.backend import (
    TorchReplayPass,
    make_backend,
    register,
    torch_replay_backend,
)

__all__ = [
    "PassConfig",
    "GraphReport",
    "TorchReplayPass",
    "get_config",
    "set_config",
    "reports",
    "clear_reports",
    "make_backend",
    "torch_replay_backend",
]

register()
