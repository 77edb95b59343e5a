"""Loads the compiled extension ``torch_replay._C`` once, with a clear message if missing."""

from __future__ import annotations

import importlib

import torch  # noqa: F401  (loads libc10 / libtorch, which _C links against)

__all__ = ["C", "require_extension"]

_BUILD_HINT = (
    "the torch_replay C++ extension is not built (or was built against another torch). "
    "Build it with:  bash scripts/setup.sh   (or: pip install --no-build-isolation -e .)"
)

try:
    C = importlib.import_module("torch_replay._C")
    _IMPORT_ERROR: BaseException | None = None
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    C = None
    _IMPORT_ERROR = exc


def require_extension():
    """Return the compiled module or raise ImportError saying how to build it."""
    if C is None:
        raise ImportError(f"{_BUILD_HINT}\n(original error: {_IMPORT_ERROR})")
    return C
