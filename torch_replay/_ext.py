"""Loads the compiled extension ``torch_replay._C`` once, with a clear message if missing."""

from __future__ import annotations

import importlib

import torch  # noqa: F401  (loads libc10 / libtorch, which _C links against)

__all__ = ["C", "engine_names", "require_extension"]

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


def engine_names() -> tuple[str, ...]:
    """The preservation engines' names, defined once in C++ (``csrc/core/preservation_engine.cpp``).

    Returns:
        The names in the engines' order (``"auto"`` first); ``()`` when the extension is
        not built (every engine needs it, and :func:`require_extension` says how to build it).
    """
    return tuple(C.engine_names()) if C is not None else ()
