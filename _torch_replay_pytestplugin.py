"""The pytest plugin of torch_replay (entry point ``pytest11`` in ``pyproject.toml``):
the ``torch_replay_testing`` fixture gives a test :mod:`torch_replay.testing` and puts
``torch_replay.config`` back as it was afterwards.

pytest loads every installed plugin in every run of the environment, so this module
sits outside the ``torch_replay`` package (whose import loads torch and the extension)
and imports it only when a test asks for the fixture: a run that does not use it pays
nothing (hypothesis keeps its plugin, ``_hypothesis_pytestplugin``, outside its package
for the same reason)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType

import pytest

__all__ = ["torch_replay_testing"]


@pytest.fixture
def torch_replay_testing() -> Iterator[ModuleType]:
    """:mod:`torch_replay.testing` (``assert_trains_like_eager``,
    ``gradcheck_segment``, ``without_checkpointing``); ``torch_replay.config`` is
    restored after the test.

    Yields:
        The module.
    """
    from torch_replay import config, testing

    saved = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    try:
        yield testing
    finally:
        for name, value in saved.items():
            setattr(config, name, value)
