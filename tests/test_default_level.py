"""The default level of ``tr.config.detect`` and what it tells the user.

``"preserve"`` is the default (docs/checkpoint_details.md, "Which level is the default"):
undeclared state a segment read and that is changed in place before backward is preserved
and the gradient is eager PyTorch's. At ``"reads"`` the same change is refused with
``StateMutationError`` naming the tensor, and the message gives the two spellings that
preserve it instead (``state=``, ``tr.config.detect = "preserve"``). Each spelling is
followed here and must give eager PyTorch's gradient. The demo (the README's main
job) must give its expected outcome whatever ``TORCH_REPLAY_DETECT`` says.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn as nn

import torch_replay as tr
from torch_replay import demo

from .installed import subprocess_env
from .reference import REENTRANT, assert_bitwise

_ENV = {k: v for k, v in subprocess_env().items() if k != "TORCH_REPLAY_DETECT"}


def _level_in_fresh_process(**env) -> str:
    run = subprocess.run(
        [sys.executable, "-c", "import torch_replay as tr; print(tr.config.detect)"],
        env={**_ENV, **env},
        cwd=tempfile.gettempdir(),  # not the checkout: the tested package is imported
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard, not a time box
        check=True,
    )
    return run.stdout.strip()


def test_default_level_is_preserve_and_the_environment_sets_it():
    assert _level_in_fresh_process() == "preserve"
    assert _level_in_fresh_process(TORCH_REPLAY_DETECT="reads") == "reads"


class Shifted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6, dtype=torch.float64)
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, 6, dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(self.fc(x) + self.shift)


def _grads(run, reentrant: bool):
    """x's and the parameters' gradients of one step whose buffer moves on between
    forward and backward; ``run`` is None for eager PyTorch (the reference)."""
    torch.manual_seed(0)
    block = Shifted()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = block(x) if run is None else run(block, x, reentrant)
    with torch.no_grad():
        block.shift.mul_(0.5).add_(0.25)
    y.pow(2).sum().backward()
    return [x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_refusal_names_the_tensor_and_both_spellings_give_eager(reentrant, monkeypatch):
    monkeypatch.setattr(tr.config, "detect", "reads")
    eager = _grads(None, reentrant)

    def undeclared(block, x, reentrant):
        return tr.checkpoint(block, x, use_reentrant=reentrant)

    with pytest.raises(tr.StateMutationError) as info:
        _grads(undeclared, reentrant)
    msg = str(info.value)
    assert "[tensor: shift (buffer of Shifted)]" in msg, msg
    assert "Declare it in state=" in msg, msg
    assert 'tr.config.detect = "preserve"' in msg, msg

    def declared(block, x, reentrant):
        return tr.checkpoint(block, x, use_reentrant=reentrant, state=[block])

    assert_bitwise(_grads(declared, reentrant), eager)
    monkeypatch.setattr(tr.config, "detect", "preserve")
    assert_bitwise(_grads(undeclared, reentrant), eager)


@pytest.mark.parametrize("level", ["reads", "preserve"])
def test_demo_gives_its_outcome_at_any_level(level, monkeypatch, capsys):
    monkeypatch.setattr(tr.config, "detect", level)
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert tr.config.detect == level  # put back
    lines = out.splitlines()
    assert lines[-1] == "OK", out
    # torch's gradient is off, both of torch_replay's equal eager's (printed 0.000e+00).
    diffs = {ln.split("max |")[0].strip(): ln.rsplit("=", 1)[1].strip() for ln in lines[1:4]}
    assert float(diffs["torch.utils.checkpoint"]) > 0.0, out
    assert diffs["torch_replay.checkpoint, state=[block]"] == "0.000e+00", out
    assert diffs["torch_replay.checkpoint, nothing declared"] == "0.000e+00", out
    assert 'detect="reads": torch_replay refuses' in lines[4], out
    assert "[tensor: shift (buffer of Block)]" in lines[4], out
