"""The pass as Inductor's ``CustomGraphPass``: an FX no-op whose ``uuid()`` salts the caches."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Any

import torch

from inductor_pass.config import SALT, PassConfig

__all__ = ["TorchReplayPass", "pass_uuid", "salted_fields"]


try:  # probed: the base class moved across versions
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
except Exception:  # pragma: no cover - very old torch
    _PassBase = object  # type: ignore[assignment,misc]


class TorchReplayPass(_PassBase):  # type: ignore[misc,valid-type]
    """The pass as a ``CustomGraphPass``: an FX no-op whose ``uuid()`` salts Inductor's caches.

    The permutation itself runs after code generation (Note [Hooking the pass
    into Inductor] in ``inductor_pass/runtime/backend.py``); :meth:`uuid`
    hashes the pass's source files and its configuration so that a cached
    program is never reused across pass versions or options.

    Args:
        config: The pass's options.
        chained: A ``post_grad_custom_post_pass`` that was configured before
            this one; it still runs, and its ``uuid()`` is part of this one's.
    """

    def __init__(self, config: PassConfig, chained: Any = None) -> None:
        self.config = config
        self.chained = chained

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> str:
        """The cache salt: the package's sources, the options that change programs, ``chained``.

        Returns:
            A SHA-256 hex digest.
        """
        h = hashlib.sha256()
        for name, text in _package_sources():
            h.update(name.encode())
            h.update(text)
        cfg = {k: getattr(self.config, k) for k in salted_fields()}
        h.update(repr(sorted(cfg.items())).encode())
        if self.chained is not None:
            inner = getattr(self.chained, "uuid", lambda: None)()
            h.update(repr(inner).encode())
        return h.hexdigest()


def pass_uuid(config: PassConfig) -> str:
    """``TorchReplayPass(config).uuid()``: the key part the pass's own caches share."""
    return TorchReplayPass(config).uuid()


@functools.cache
def salted_fields() -> tuple[str, ...]:
    """The :class:`PassConfig` fields that salt the caches: those whose metadata says so.

    Raises:
        TypeError: A field that does not say whether it changes programs
            (no :data:`~inductor_pass.config.SALT` in its metadata).
    """
    out = []
    for f in dataclasses.fields(PassConfig):
        if SALT not in f.metadata:
            raise TypeError(
                f"PassConfig.{f.name} does not say whether it changes programs: "
                f"give it metadata {{{SALT!r}: True or False}}"
            )
        if f.metadata[SALT]:
            out.append(f.name)
    return tuple(out)


@functools.cache
def _package_sources() -> tuple[tuple[str, bytes], ...]:
    """Every Python source file of the package, sorted by path (the cache salt).

    All of them, in every sub-package, not a hand-kept list, so that no change
    to the pass can reuse a cached program or decision of an older pass.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for folder, dirs, files in os.walk(here):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    out.append((os.path.relpath(path, here), f.read()))
    return tuple(sorted(out))
