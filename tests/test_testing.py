"""torch_replay.testing and its pytest plugin. The checks must pass where
checkpointing is exact (torch_replay's wrapper on BatchNorm, torch's on a pure model)
and fail, naming the first difference, where it is not (torch's wrapper: BatchNorm
updated twice, a buffer moved before backward, an explicit generator drawn twice)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn as nn
from torch.autograd.gradcheck import GradcheckError
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper as torch_wrapper,
)

import torch_replay as tr
from torch_replay.testing import assert_trains_like_eager, gradcheck_segment

from .installed import subprocess_env

ROOT = Path(__file__).resolve().parents[1]


def _model(wrap=None, norm=True):
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8) if norm else nn.Identity(), nn.Tanh())
        for _ in range(2)
    ]
    return nn.Sequential(*[wrap(b) if wrap else b for b in blocks])


def _loss(model, x):
    return model(x).pow(2).mean()


BATCH = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))


def test_passes_where_checkpointing_is_exact():
    assert_trains_like_eager(_model(tr.checkpoint_wrapper), BATCH, _loss, steps=2)
    assert_trains_like_eager(_model(torch_wrapper, norm=False), BATCH, _loss, steps=2)


def test_names_a_buffer_torch_updates_twice():
    with pytest.raises(AssertionError, match=r"step 1 of 2: buffer '0.1.running_mean' differs"):
        assert_trains_like_eager(_model(torch_wrapper), BATCH, _loss)


class _Gated(nn.Module):
    """Flips signs by a buffer that the loop changes before backward (the buffer
    itself is not saved for backward, so eager is well defined)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("gate", torch.randn(8))

    def forward(self, x):
        h = self.lin(x)
        return torch.where(self.gate > 0, h, -h).tanh()


def _flip_gates(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _Gated):
                m.gate.neg_()


def _gated(wrap):
    torch.manual_seed(0)
    return nn.Sequential(wrap(_Gated()), wrap(_Gated()))


def test_names_a_gradient_and_the_eager_model_can_be_given():
    with pytest.raises(AssertionError, match=r"step 1 of 1: gradient of '1.lin.weight' differs"):
        assert_trains_like_eager(_gated(torch_wrapper), BATCH, _loss, between=_flip_gates, steps=1)
    assert_trains_like_eager(_gated(tr.checkpoint_wrapper), BATCH, _loss, between=_flip_gates)
    with pytest.raises(AssertionError, match=r"step 1 of 2: loss differs"):
        assert_trains_like_eager(
            _model(tr.checkpoint_wrapper), BATCH, _loss, eager=_model(norm=False)
        )


class _Noisy(nn.Module):
    """Draws from an explicit generator, which torch's checkpoint does not stash."""

    def __init__(self, gen):
        super().__init__()
        self.lin, self.gen = nn.Linear(8, 8), gen

    def forward(self, x):
        noise = torch.rand(x.shape, generator=self.gen)  # drawn again by a re-run
        return self.lin(x + 0.0 * noise)


def test_names_a_generator_drawn_twice():
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    model = nn.Sequential(torch_wrapper(_Noisy(gen)))
    with pytest.raises(AssertionError, match="generator 0"):
        assert_trains_like_eager(model, BATCH, _loss, generators=[gen])
    torch.manual_seed(0)
    ours = nn.Sequential(tr.checkpoint_wrapper(_Noisy(gen), replay_state=[gen]))
    assert_trains_like_eager(ours, BATCH, _loss, generators=[gen])


def test_gradcheck_segment_in_float64():
    block = _model()[0]
    x = torch.randn(5, 8)
    assert gradcheck_segment(block, x, replay_state="module")
    assert gradcheck_segment(lambda a, b: (a * b).sin(), torch.randn(3), torch.randn(3))
    assert block[0].weight.dtype == torch.float32  # the caller's module is not cast

    def wrong(a):
        return _WrongGrad.apply(a)

    with pytest.raises(GradcheckError):
        gradcheck_segment(wrong, torch.randn(4))


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a.sin()

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return g * a.cos() * 1.01  # 1 % off


def test_pytest_plugin_entry_point_and_fixture(tmp_path):
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {
        "torch_replay": "_torch_replay_pytestplugin"
    }
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import torch, torch_replay as tr

            def test_mine(torch_replay_testing):
                tr.config.detect = "reads"
                torch.manual_seed(0)
                model = torch.nn.Sequential(tr.checkpoint_wrapper(torch.nn.BatchNorm1d(4)))
                torch_replay_testing.assert_trains_like_eager(
                    model, torch.randn(3, 4), lambda m, x: m(x).sum())

            def test_config_restored():
                assert tr.config.detect == "preserve"  # the default, put back
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "_torch_replay_pytestplugin", "-p",
         "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,  # a hang guard, not a time box
        env={**{k: v for k, v in subprocess_env().items() if k != "TORCH_REPLAY_DETECT"},
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
