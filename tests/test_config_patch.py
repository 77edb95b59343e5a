"""``tr.config.patch``: settings for a block or a decorated function, put back after it.

The behaviour under a patched level is compared with eager PyTorch (a buffer the segment
read moves on between forward and backward): the segment keeps the level its forward ran
with, so a backward outside the block still gives eager's gradient under
``patch(detect="preserve")``, and the refusing default is back once the block ends.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

import torch_replay as tr
from torch_replay._ext import require_extension

from .reference import REENTRANT, assert_bitwise
from .test_default_level import _grads

_FIELDS = tuple(f.name for f in dataclasses.fields(tr.ReplayConfig))


def _settings() -> dict:
    return {name: getattr(tr.config, name) for name in _FIELDS}


def test_block_sets_and_puts_back():
    before = _settings()
    with tr.config.patch(detect="preserve", verify="bytes", observe=False) as cfg:
        assert cfg is tr.config
        assert (tr.config.detect, tr.config.verify, tr.config.observe) == (
            "preserve",
            "bytes",
            False,
        )
        assert tr.config.observer == before["observer"]  # untouched
    assert _settings() == before


def test_put_back_when_the_block_raises():
    before = _settings()
    with pytest.raises(KeyError, match="inside"):
        with tr.config.patch(detect="saved", observer="python"):
            raise KeyError("inside")
    assert _settings() == before


def test_nested_blocks_unwind_in_order():
    before = tr.config.detect
    with tr.config.patch(detect="preserve"):
        with tr.config.patch(detect="saved"):
            assert tr.config.detect == "saved"
        assert tr.config.detect == "preserve"
    assert tr.config.detect == before


def test_decorator_applies_to_each_call():
    before = tr.config.detect

    @tr.config.patch(detect="saved")
    def level():
        return tr.config.detect

    assert [level(), level()] == ["saved", "saved"]
    assert tr.config.detect == before


def test_a_setting_changed_inside_the_block_is_put_back_too():
    before = tr.config.detect
    with tr.config.patch(detect="preserve"):
        tr.config.detect = "saved"
    assert tr.config.detect == before


@pytest.mark.parametrize(
    "changes, error, words",
    [
        ({"detec": "preserve"}, AttributeError, "no setting 'detec'; its settings are"),
        ({"detect": "everything"}, ValueError, "config.detect must be one of"),
        ({"verify": "hashes"}, ValueError, "config.verify must be one of"),
        ({"observer": "cpp"}, ValueError, "config.observer must be one of"),
        ({"heap": "off"}, ValueError, "config.heap must be one of"),
        ({"observe": 1}, ValueError, "config.observe must be one of (True, False)"),
        # every change is checked before any is made
        ({"detect": "preserve", "verify": "all"}, ValueError, "config.verify"),
    ],
)
def test_bad_settings_are_refused_before_anything_changes(changes, error, words):
    before = _settings()
    with pytest.raises(error) as info:
        with tr.config.patch(**changes):
            pytest.fail("the block must not run")
    assert words in str(info.value)
    assert _settings() == before


def test_every_setting_has_its_values_checked():
    # A setting added to ReplayConfig without its valid values would be refused by
    # patch as unknown; each default must itself be accepted.
    for name in _FIELDS:
        with tr.config.patch(**{name: getattr(tr.config, name)}):
            pass


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_a_segment_keeps_the_level_its_forward_ran_with(reentrant, monkeypatch):
    monkeypatch.setattr(tr.config, "detect", "reads")
    eager = _grads(None, reentrant)

    def preserved(block, x, reentrant):
        with tr.config.patch(detect="preserve"):
            y = tr.checkpoint(block, x, use_reentrant=reentrant)
        assert tr.config.detect == "reads"
        return y  # backward (in _grads) runs after the block

    assert_bitwise(_grads(preserved, reentrant), eager)

    def plain(block, x, reentrant):
        return tr.checkpoint(block, x, use_reentrant=reentrant)

    with pytest.raises(tr.StateMutationError, match="shift"):
        _grads(plain, reentrant)


def test_settings_are_process_wide():
    seen = []
    with tr.config.patch(detect="preserve"):
        t = threading.Thread(target=lambda: seen.append(tr.config.detect))
        t.start()
        t.join()
    assert seen == ["preserve"]


def _observing() -> str:
    """Which observer the running code is under, asked of torch and the extension."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from torch_replay._replay.observe import DispatchModeObserver

    if any(isinstance(m, DispatchModeObserver) for m in _get_current_dispatch_mode_stack()):
        return "python"
    return "c++" if require_extension().observer_depth() > 0 else "none"


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize(
    "forward, backward, expect",
    [
        ({"observer": "python"}, {"observer": "c++"}, "python"),
        ({"observe": False}, {"observe": True}, "none"),
        ({"observer": "c++"}, {"observer": "python"}, "c++"),
        ({"observe": True}, {"observe": False}, "c++"),
    ],
)
def test_the_rerun_runs_under_the_observer_of_its_forward(forward, backward, expect, reentrant):
    seen = []

    def seg(x):
        seen.append(_observing())
        return torch.sin(x) * 2

    x = torch.randn(4, requires_grad=True)
    with tr.config.patch(**forward):
        y = tr.checkpoint(seg, x, use_reentrant=reentrant)
    with tr.config.patch(**backward):
        y.sum().backward()
    assert seen == [expect, expect]  # the forward, then the re-run
    torch.testing.assert_close(x.grad, 2 * torch.cos(x))
