"""Where the tested packages come from, for the tests' Python subprocesses.

A subprocess must import the torch_replay the test process imports: the installed package
when the suite runs against an installation, this checkout when it runs in place. So its
``PYTHONPATH`` starts with the folder that package was found in, then this checkout (for
``tests.*`` helpers), and its working directory is not the checkout (``python -c`` and
``python -m`` put the working directory first on the path).
"""

from __future__ import annotations

import importlib.util
import os

__all__ = ["PACKAGE_PATH", "ROOT", "subprocess_env"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SPEC = importlib.util.find_spec("torch_replay")
PACKAGE_PATH = os.path.dirname(os.path.dirname(_SPEC.origin)) if _SPEC and _SPEC.origin else ROOT
"""The folder the tested torch_replay is imported from (site-packages, or this checkout)."""


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a test's Python subprocess: the tested package first on the
    path, then this checkout (the ``tests`` helpers), then the caller's ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = [PACKAGE_PATH] + ([ROOT] if ROOT != PACKAGE_PATH else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.update(extra)
    return env
