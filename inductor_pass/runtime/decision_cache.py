"""On-disk cache of the pass's per-graph decisions.

Note [Decision cache]
The pass profiles, searches and measures every graph at its first call
(Note [Profiling on real inputs] in ``inductor_pass/runtime/first_call.py``). Its outcome
depends only on the wrapper's source (the kernels and their order), the pass
itself (its sources and configuration: ``TorchReplayPass.uuid()``), the torch
version, and how the call is made: which inputs the call owns (Note [Input
ownership] in ``inductor_pass/stages/guard.py``), which inputs share a storage, and
the inputs' metadata. All of these form the key; the value is the decision
(the permuted statement order and the permuted source, or none) and the report.
A warm process then builds the permuted ``call`` from the cached source (it
parses no wrapper: parsing GPT-2's forward wrapper cost more than the rest of a
warm first call, see ``benchmarks/results/compile_hf.md``) and runs no kernel of
the pass, so Inductor's own caches (FX graph and AOTAutograd) can stay on. A
graph loaded from AOTAutograd's cache skips the backend's inner compile, so
its variant programs (Note [Program variants] in
``inductor_pass/variants/choose.py``) are not compiled again: their sources are kept
here too, keyed by the default program's source, and loaded like a cached
wrapper. With the decision cache off, the backend turns AOTAutograd's cache
off instead, so that variants are always compiled. Entries live under Inductor's cache directory
(``TORCHINDUCTOR_CACHE_DIR``) in ``torch_replay_decisions/``, are written
atomically, and are ignored when unreadable. ``PassConfig.decision_cache =
False`` or ``torch.compiler.config.force_disable_caches`` turn the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from inductor_pass.program.wrapper_ast import parse_wrapper, unbound_names
from inductor_pass.stages.guard import build_call
from inductor_pass.variants.choose import Program
from inductor_pass.variants.kernels import lazy_kernels

__all__ = [
    "cache_dir",
    "call_signature",
    "decision_key",
    "load",
    "load_program",
    "load_variants",
    "store",
    "store_variants",
    "variants_key",
    "enabled",
]

_VERSION = 3


def enabled(config: Any) -> bool:
    """Whether decisions are cached under ``config``."""
    if not getattr(config, "decision_cache", True):
        return False
    if getattr(config, "recompute", False):  # a recomputed program is not a permutation
        return False
    try:
        return not torch.compiler.config.force_disable_caches
    except Exception:  # pragma: no cover - older torch
        return True


def cache_dir() -> str:
    """Directory of the decision cache (under Inductor's cache directory)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return os.path.join(inductor_cache_dir(), "torch_replay_decisions")


def call_signature(inputs: Sequence[Any], owned: Sequence[bool] | None) -> str:
    """What of a call, besides the source, the decision depends on."""
    parts: list[str] = []
    group: dict[int, int] = {}
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            parts.append(f"{i}:{type(x).__name__}:{x!r}")
            continue
        st = x.untyped_storage()
        key = st.data_ptr() if st.nbytes() else -1 - i
        g = group.setdefault(key, len(group))
        parts.append(
            f"{i}:{x.dtype}:{x.device}:{tuple(x.shape)}:{x.stride()}:{x.storage_offset()}:"
            f"{st.nbytes()}:g{g}:{'owned' if owned and owned[i] else 'held'}"
        )
    return "|".join(parts)


def decision_key(source: str, pass_uuid: str, signature: str) -> str:
    """The cache key of one graph's decision."""
    h = hashlib.sha256()
    for part in (str(_VERSION), torch.__version__, pass_uuid, signature, source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(key: str) -> str:
    return os.path.join(cache_dir(), key[:2], key + ".json")


def load(key: str) -> dict[str, Any] | None:
    """The cached decision, or None (missing or unreadable)."""
    try:
        with open(_path(key)) as f:
            entry = json.load(f)
    except Exception:
        return None
    if not isinstance(entry, dict) or entry.get("version") != _VERSION:
        return None
    return entry


def load_program(source: str) -> Program | None:
    """A cached variant program, loaded, or None.

    The module is loaded as Inductor loads a cached wrapper
    (``PyCodeCache.load``), its kernels lazily: they are built (or taken from
    Inductor's compiled-kernel cache) only if the pass runs the program. A
    program whose ``call`` refers to a global the source does not define (a
    constant Inductor attaches at load time) is not used.
    """
    try:
        from torch._inductor.codecache import PyCodeCache

        wrapper = parse_wrapper(source)
        with lazy_kernels():  # built when the pass runs it
            mod = PyCodeCache.load(source)
        glob = vars(mod)
        if unbound_names(wrapper, glob):
            return None
        runner = glob.get("runner")
        partitions = getattr(runner, "partitions", None)
        call, _ = build_call(source, glob, partitions=partitions)
        return Program(source=source, globals=glob, call=call, partitions=partitions)
    except Exception:
        return None


def variants_key(source: str, pass_uuid: str) -> str:
    """Key of the variant programs compiled beside the default program ``source``."""
    return decision_key(source, pass_uuid, "variants")


def store_variants(key: str, sources: dict[str, str]) -> None:
    """Remember the variant programs' sources (a process whose graphs come from
    AOTAutograd's cache compiles none; it loads them with :func:`load_program`)."""
    _write(key, {"version": _VERSION, "variants": sources})


def load_variants(key: str) -> dict[str, str]:
    """Variant name -> source, as stored by :func:`store_variants` (empty if none)."""
    entry = load(key)
    got = entry.get("variants") if entry else None
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def store(key: str, decision: dict[str, Any], report: dict[str, Any]) -> None:
    """Write a decision atomically (errors are ignored: the cache is an optimisation).

    Args:
        key: From :func:`decision_key`.
        decision: ``{"variant", "order", "permuted", "source"}``: the chosen
            program's name, its permuted region order (None: as emitted), the
            permuted program's source (with an order) and, for a variant other
            than the default, its source.
        report: ``GraphReport.as_dict()``.
    """
    _write(key, {"version": _VERSION, "decision": decision, "report": report})


def _write(key: str, entry: dict[str, Any]) -> None:
    path = _path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except Exception:
        pass
