"""Command lines are safe to run: help without running, nothing written without --out, no
runpy warning, factories imported from the current directory or a file path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torch_replay import audit as audit_mod  # noqa: F401  (the package, as the CLI imports it)
from torch_replay import demo, suites
from torch_replay.audit import main as audit_main

from .installed import subprocess_env


def test_demo_help_prints_help_and_does_not_run(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m torch_replay.demo" in out
    assert "gradient difference" not in out


def test_suites_write_nothing_without_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert suites.main(["numeric", "--programs", "2", "--quiet"]) == 0
    assert os.listdir(tmp_path) == []
    out = tmp_path / "res"
    assert suites.main(["numeric", "--programs", "2", "--quiet", "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["suites.md", "suites_numeric.json"]


FACTORY = """
import torch
def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (torch.randn(2, 4),)
"""


def test_audit_cli_imports_from_cwd_and_from_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "auditme.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert audit_main(["auditme:make"]) == 0
    assert "tr.checkpoint(model[0], x, use_reentrant=False)" in capsys.readouterr().out
    other = tmp_path / "sub"
    other.mkdir()
    monkeypatch.chdir(other)
    assert audit_main([str(tmp_path / "auditme.py") + ":make"]) == 0


@pytest.mark.parametrize("module", ["torch_replay.audit", "torch_replay.calibrate"])
def test_no_runpy_warning(module, tmp_path):
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    assert "SPEC" not in proc.stdout and "the source" not in proc.stdout
