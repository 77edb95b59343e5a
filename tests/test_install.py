"""The package as a user installs it: the entry points it declares work alone, in a fresh
process with nothing imported first (each test starts one)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from tests.inductor_support import ROOT, subprocess_env


def _declared_entry_points(group: str) -> dict[str, str]:
    """``group``'s entry points as ``pyproject.toml`` declares them."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["entry-points"][group]


def _entry_point_path(tmp_path, group: str) -> str:
    """A folder for ``PYTHONPATH`` holding a distribution that declares only ``group``'s
    entry points of ``pyproject.toml``, unless the installed torch_replay declares them
    already (then they are the ones tested, and the folder is empty)."""
    declared = _declared_entry_points(group)
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}
    folder = tmp_path / "entry_points"
    folder.mkdir()
    if all(installed.get(name) == value for name, value in declared.items()):
        return str(folder)
    info = folder / "torch_replay_entry_points-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch_replay_entry_points\nVersion: 0\n"
    )
    lines = [f"[{group}]"] + [f"{name} = {value}" for name, value in declared.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return str(folder)


# What runs before torch.compile(backend="torch_replay") in the fresh process.
_BEFORE = {
    # The entry point alone: dynamo finds the backend and imports the package.
    "nothing": "",
    # The package first, then dynamo's lookup.
    "import": "import inductor_pass",
    # Dynamo reads the entry points first (list_backends), then the package is imported.
    "list_then_import": "assert 'torch_replay' in torch._dynamo.list_backends()\n"
    "import inductor_pass",
}

_COMPILE = """
import sys
import torch
{before}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
x = torch.randn(2, 4)
out = torch.compile(model, backend="torch_replay")(x)
torch.testing.assert_close(out, model(x), rtol=0, atol=1e-6)
assert "inductor_pass" in sys.modules
import inductor_pass
assert inductor_pass.reports(), "the torch_replay backend did not run"
print("ok")
"""


@pytest.mark.parametrize("before", list(_BEFORE))
def test_compile_backend_by_name_in_a_fresh_process(before, tmp_path):
    script = textwrap.dedent(_COMPILE).format(before=_BEFORE[before])
    env = subprocess_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    env["PYTHONPATH"] += os.pathsep + _entry_point_path(tmp_path, "torch_dynamo_backends")
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,  # a hang guard, not a time box
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
