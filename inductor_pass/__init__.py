"""torch_replay's Inductor plugin: permute the generated wrapper for a lower, byte-exact peak.

``import inductor_pass`` registers the ``torch_replay`` backend, so that
``torch.compile(model, backend="torch_replay")`` runs Inductor and then the
post-codegen pass on every forward, backward and inference graph.
Every graph gets a report (:func:`reports`); ``TORCH_REPLAY_REPORT=1`` prints
them and ``TORCH_REPLAY_DUMP=DIR`` writes the original and permuted wrappers.
Any failure inside the pass leaves the graph's program unchanged.

Layout, in the order a graph's program travels through the pass (each room imports
only the rooms above it, and ``config``, ``report`` and ``observe``):

- ``program/``: the wrapper as data. ``wrapper_ast`` parses it into classified
  statements (``kernel_sigs``: the kernels' declared writes), ``units`` models its
  memory (units, storages, dependences, emission), ``permute`` searches orders,
  ``recompute_program`` rewrites it for recomputation.
- ``stages/``: what the pass does to one program at its first call. ``rewrite``
  runs the stages in order: ``observable`` (programs never run: Note [Observable
  calls]), ``effects`` (the effect check) and ``profile`` (the
  byte-exact model), ``search`` (order, bounds, certificate), ``decide`` (the
  deploy rule), and ``recompute`` / ``recompute_choice`` when asked; ``guard``
  runs and measures programs for all of them.
- ``variants/``: Inductor's other programs of the same graph. ``choose``
  (``Program``, ``Variant``, the choice), ``bound`` (the bound that rules a variant
  out before its kernels are built), ``kernels`` (lazy and deferred variant
  kernels), ``fork`` (a variant's codegen in a forked child).
- ``runtime/``: the backend in Inductor. ``backend`` (the hooks and the inner
  compile), ``variant_compile`` (an inner compile with its variants), ``state``
  (the hook state a backend call owns), ``first_call`` (the pass at a graph's first
  call), ``per_size`` (the same at each size's first call, for symbolic graphs),
  ``cpp_wrapper`` (C++-wrapped programs through a Python twin), ``aoti``
  (AOTInductor packages: :func:`aoti_compile_and_package`),
  ``decision_cache``, ``salt`` (the cache salt, ``TorchReplayPass``).
- ``config`` (``PassConfig``), ``report`` (``GraphReport``), ``observe`` (compile
  observers for benchmarks and profilers: Note [Compile observers]).
"""

from __future__ import annotations

from inductor_pass.config import PassConfig, get_config, set_config
from inductor_pass.report import GraphReport, clear_reports, reports
from inductor_pass.runtime.aoti import aoti_compile_and_package
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
    "aoti_compile_and_package",
]

register()
