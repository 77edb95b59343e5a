"""Loads the compiled extension ``torch_replay._C`` once, with a clear message if it cannot.

Note [Extension loading]
The extension links against the torch it was built with, and torch's C++ ABI changes
between releases: an extension built for torch X under torch Y fails to load (an
undefined symbol) or, worse, loads. So the build records the torch it compiled against
beside the extension (``_build_info.json``, written by ``setup.py``) and the load compares
it with the running torch's release (the version without its local ``+cpu`` / ``+cu128``
part, as the wheel's ``torch==X.Y.Z`` requirement does). A missing, unloadable or
mismatched extension does not stop ``import torch_replay`` (the planner's pure parts,
``--help`` of the command lines and the compile backend's reports keep working): the
import warns once, and every use that needs the extension (``tr.checkpoint`` first
among them) raises :class:`ImportError` with the same text, which says what happened
(not built / built for torch X, running Y / the loader's error) and what to run.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import warnings
from typing import Any

import torch  # loads libc10 / libtorch, which _C links against

__all__ = [
    "C",
    "BUILD_INFO",
    "engine_names",
    "extension_error",
    "extension_problem",
    "require_extension",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_INFO_FILE = "_build_info.json"


def _read_build_info(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, BUILD_INFO_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _release(version: str) -> str:
    return version.split("+")[0]


def _checkout(folder: str) -> str | None:
    """The source checkout the package is imported from (an editable install or the
    checkout on the path), else ``None`` (an installed copy)."""
    root = os.path.dirname(folder)
    scripts = os.path.join(root, "scripts", "setup.sh")
    return (
        root if os.path.exists(os.path.join(root, "setup.py")) and os.path.exists(scripts) else None
    )


def extension_problem(
    import_error: BaseException | None,
    built: dict[str, Any] | None,
    running: str,
    *,
    found: bool,
    checkout: str | None,
) -> str | None:
    """What is wrong with the extension, in one message, or ``None`` (Note [Extension
    loading]).

    Args:
        import_error: what importing ``torch_replay._C`` raised (``None``: it loaded).
        built: the build's record (``_build_info.json``), ``None`` when there is none.
        running: the running torch's version.
        found: whether an extension file is there at all.
        checkout: the source checkout the package comes from, ``None`` if installed.

    Returns:
        The message, which names what happened and the command that rebuilds it.
    """
    built_for = built.get("torch") if built else None
    mismatch = built_for is not None and _release(built_for) != _release(running)
    if import_error is None and not mismatch:
        return None
    if not found:
        what = "is not built"
    elif mismatch:
        what = f"was built for torch {built_for}, but torch {running} is running"
    else:
        what = f"fails to load under torch {running}"
        if built_for:
            what += f" (built for torch {built_for})"
    if import_error is not None and found:
        what += f": {type(import_error).__name__}: {import_error}"
    if checkout is not None:
        fix = (
            f"Rebuild it in the checkout {checkout}: `bash scripts/setup.sh` (the project's "
            "own .venv), or in your environment `pip install --no-build-isolation -e .`"
        )
    else:
        fix = (
            "Reinstall torch_replay against the torch you run, from its source folder: "
            "`pip install --no-build-isolation .` (build isolation would build it against "
            "another torch); a wheel must be one built for this torch"
        )
    return f"torch_replay's C++ extension (torch_replay._C) {what}. {fix}."


def _load() -> tuple[Any, str | None]:
    built = _read_build_info(_HERE)
    try:
        module = importlib.import_module("torch_replay._C")
        error: BaseException | None = None
    except ImportError as exc:
        module, error = None, exc
    found = bool(glob.glob(os.path.join(_HERE, "_C.*"))) or module is not None
    problem = extension_problem(
        error, built, torch.__version__, found=found, checkout=_checkout(_HERE)
    )
    if problem is not None:
        warnings.warn(problem, stacklevel=3)
        return None, problem
    return module, None


BUILD_INFO: dict[str, Any] | None = _read_build_info(_HERE)
"""The build's record: the torch version the extension was compiled against (``torch``),
its CUDA version (``cuda``, ``None`` for a CPU build) and whether the CUDA kernels are in
(``with_cuda``); ``None`` for a build that wrote none."""

C, _PROBLEM = _load()


def extension_error() -> str | None:
    """Why the extension is unavailable (the message :func:`require_extension` raises),
    or ``None`` when it is loaded."""
    return _PROBLEM


def require_extension():
    """Return the compiled module.

    Raises:
        ImportError: the extension is missing, fails to load, or was built for another
            torch; the message says which and what to run (Note [Extension loading]).
    """
    if C is None:
        raise ImportError(_PROBLEM)
    return C


def engine_names() -> tuple[str, ...]:
    """The preservation engines' names, defined once in C++ (``csrc/core/preservation_engine.cpp``).

    Returns:
        The names in the engines' order (``"auto"`` first); ``()`` when the extension is
        not available (every engine needs it, and :func:`require_extension` says why).
    """
    return tuple(C.engine_names()) if C is not None else ()
