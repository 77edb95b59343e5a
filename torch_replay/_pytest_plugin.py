"""The pytest plugin's former module (``-p torch_replay._pytest_plugin``), kept for
command lines that name it; the plugin is ``_torch_replay_pytestplugin``, outside the
package so that loading it imports no torch (pyproject.toml's ``pytest11`` entry point)."""

from __future__ import annotations

from _torch_replay_pytestplugin import torch_replay_testing

__all__ = ["torch_replay_testing"]
