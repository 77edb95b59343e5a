"""Configuration of the wrapper-permutation pass."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = ["SALT", "FailurePoint", "PassConfig", "get_config", "set_config"]

SALT = "salt"
"""Key of the metadata every :class:`PassConfig` field has. True: the option can change
what the pass decides or deploys, so it salts Inductor's caches and the pass's own
(``TorchReplayPass.uuid`` in ``inductor_pass/runtime/salt.py``). False: it changes no
program (printing, caching, or work skipped only where it cannot change the choice)."""

_CHANGES_PROGRAMS = MappingProxyType({SALT: True})
_KEEPS_PROGRAMS = MappingProxyType({SALT: False})

FailurePoint = Literal["parse", "profile", "search", "guard", "fork-fail", "fork-hang"]
"""Where ``PassConfig.inject_failure`` makes the pass fail: a stage of the pass, or the
forked variant child (fails, or hangs)."""


@dataclass(kw_only=True, slots=True)
class PassConfig:
    """Options of the ``torch_replay`` backend's post-codegen pass.

    Each field says in its metadata (key :data:`SALT`) whether it can change the
    program deployed; a new field must say it too (``tests/test_inductor_pass.py``).
    """

    enabled: bool = field(default=True, metadata=_CHANGES_PROGRAMS)
    """Run the pass at all (False: plain Inductor, each graph reported as unchanged)."""
    deploy: bool = field(default=True, metadata=_CHANGES_PROGRAMS)
    """Deploy the permuted program when the guard accepts it (False: measure and report only)."""
    use_core: bool = field(default=True, metadata=_CHANGES_PROGRAMS)
    """Use ``torch_replay.schedule`` (exact search and min-cut bounds) besides the heuristics."""
    time_limit_s: float = field(default=1.0, metadata=_CHANGES_PROGRAMS)
    """Budget of the scheduling core's search per graph."""
    check_effects: bool = field(default=True, metadata=_CHANGES_PROGRAMS)
    """Compare every live storage's bytes before and after each unit (effect completeness)."""
    all_writes: bool = field(default=False, metadata=_CHANGES_PROGRAMS)
    """Ablation: treat every access as a write (reads of one generation no longer reorder)."""
    ablation: bool = field(default=False, metadata=_CHANGES_PROGRAMS)
    """Also search with every access treated as a write and report that modelled peak
    (``GraphReport.ablation_permuted_peak``); the ablation program is not deployed."""
    report: bool = field(
        default_factory=lambda: os.environ.get("TORCH_REPLAY_REPORT", "0") == "1",
        metadata=_KEEPS_PROGRAMS,
    )
    """Print each graph's report (env ``TORCH_REPLAY_REPORT=1``)."""
    dump_dir: str | None = field(
        default_factory=lambda: os.environ.get("TORCH_REPLAY_DUMP") or None,
        metadata=_KEEPS_PROGRAMS,
    )
    """Write original and permuted wrapper sources here (env ``TORCH_REPLAY_DUMP=DIR``)."""
    variants: tuple[str, ...] = field(
        default=("reorder_for_peak_memory",), metadata=_CHANGES_PROGRAMS
    )
    """Boolean Inductor options to flip, one at a time, to compile alternative programs of
    each graph; the lowest byte-exact one is deployed (Note [Program variants] in
    ``inductor_pass/variants/choose.py``). ``()``: only Inductor's default program."""
    variant_bound: bool = field(default=True, metadata=_KEEPS_PROGRAMS)
    """Build a variant's C++ kernels only when needed, and skip a variant whose lower bound,
    from its source and the default program's profile, is not below the default's deployed
    peak (Note [Variant bound] in ``inductor_pass/variants/bound.py``). False: every variant
    is built while the default compiles and run through the pass."""
    fork_variants: bool = field(default=True, metadata=_KEEPS_PROGRAMS)
    """Generate variant programs in a forked child while the default program compiles (Linux,
    CPU graphs, CUDA not initialized; Note [Forked variant codegen] in
    ``inductor_pass/variants/fork.py``). False: in the compiling thread, before the default."""
    decision_cache: bool = field(default=True, metadata=_KEEPS_PROGRAMS)
    """Cache each graph's decision on disk, keyed by the wrapper's source, the pass and
    the call (Note [Decision cache] in ``inductor_pass/runtime/decision_cache.py``)."""
    recompute: bool = field(default=False, metadata=_CHANGES_PROGRAMS)
    """Selective recomputation after the chosen order (Note [Recomputation in the
    wrapper] in ``inductor_pass/stages/recompute.py``): free long-lived buffers early and
    re-emit the kernel chain that wrote them before a late use. Off by default."""
    recompute_budget: float = field(default=0.01, metadata=_CHANGES_PROGRAMS)
    """Largest extra cost of the recomputed kernels, as a fraction of the graph's
    cost (MACs of convolutions/matmuls plus one per element written by other kernels)."""
    recompute_max_chain: int = field(default=16, metadata=_CHANGES_PROGRAMS)
    """Longest chain of kernels re-emitted for one buffer."""
    max_sizes: int = field(default=8, metadata=_CHANGES_PROGRAMS)
    """Most sizes of one graph with symbolic sizes that get their own order, each at its
    first call (Note [Per-size orders] in ``inductor_pass/runtime/per_size.py``); later new
    sizes run Inductor's program, and the first of them says so in a report. 0: symbolic
    graphs are left unchanged."""
    inject_failure: FailurePoint | None = field(default=None, metadata=_CHANGES_PROGRAMS)
    """Testing: raise inside the pass at this stage (``"parse"``, ``"profile"``,
    ``"search"``, ``"guard"``), or make the forked variant child fail (``"fork-fail"``) or
    hang (``"fork-hang"``), to exercise the fallback."""


_CONFIG = PassConfig()


def get_config() -> PassConfig:
    """The configuration used by the registered ``torch_replay`` backend."""
    return _CONFIG


def set_config(config: PassConfig | None = None, **changes: object) -> PassConfig:
    """Replace the backend's configuration (or change some fields of it).

    Args:
        config: A new configuration (default: the current one).
        **changes: Fields to change, as in :func:`dataclasses.replace`.

    Returns:
        The previous configuration (to restore it later).
    """
    global _CONFIG
    old = _CONFIG
    _CONFIG = dataclasses.replace(config or _CONFIG, **changes)
    return old
