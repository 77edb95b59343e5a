"""The package as a user installs it: the entry points it declares work alone, in a fresh
process with nothing imported first (each test starts one)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from tests.installed import ROOT, subprocess_env


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


def _run_python(tmp_path, *args: str, env: dict[str, str], timeout: int = 900):
    """``python *args`` in a fresh process in ``tmp_path``, its output captured."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=timeout,  # a hang guard, not a time box
    )


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
    proc = _run_python(tmp_path, "-c", script, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# ------------------------------------------------------------------ the pytest plugin

_TRIVIAL_TESTS = """
import sys


def test_plugin_loaded_without_torch(request):
    assert request.config.pluginmanager.has_plugin("{plugin}")
    assert "torch" not in sys.modules, "loading the plugin imported torch"


def test_zz_fixture_gives_testing(torch_replay_testing):
    assert torch_replay_testing.__name__ == "torch_replay.testing"
    assert "torch" in sys.modules
"""


def test_pytest_plugin_imports_no_torch_until_its_fixture_is_used(tmp_path):
    declared = _declared_entry_points("pytest11")
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    env = subprocess_env()
    args = []
    if all(installed.get(name) == value for name, value in declared.items()):
        (plugin,) = declared  # loaded by pytest, under the entry point's name
    else:  # installed from an older pyproject.toml: the declared module, named on the line
        (plugin,) = declared.values()
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        args = ["-p", plugin]
    (tmp_path / "test_trivial.py").write_text(_TRIVIAL_TESTS.format(plugin=plugin))
    proc = _run_python(
        tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_trivial.py", env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout


# ------------------------------------------------------------------ package data


def test_shipped_configs_resolve_from_any_directory(tmp_path, monkeypatch):
    from torch_replay.calibrate.config import load_config, shipped_config

    monkeypatch.chdir(tmp_path)
    names = sorted(f[: -len(".yaml")] for f in os.listdir(os.path.join(ROOT, "configs")))
    assert names  # configs/ of the source
    for name in names:
        for spelling in (f"configs/{name}.yaml", f"{name}.yaml", name):
            path = shipped_config(spelling)
            assert path is not None, spelling
            with open(os.path.join(ROOT, "configs", f"{name}.yaml")) as f:
                assert path.read_text() == f.read()
    assert load_config("configs/cpu_dry_run.yaml") == load_config(
        os.path.join(ROOT, "configs", "cpu_dry_run.yaml")
    )
    assert shipped_config("elsewhere/cpu.yaml") is None
    assert shipped_config("no_such_config") is None


# ------------------------------------------------------------------ the build, checked

_CHECK = """
import os, runpy, sys
setup = runpy.run_path(sys.argv[1], run_name="torch_replay_setup")  # main() is not run
setup["check_build_environment"](sys.argv[2:], dict(os.environ))
print("no problem")
"""


def _check_build(tmp_path, *commands: str, path=(), **environ: str):
    """setup.py's check, in a fresh process with ``path`` first on ``PYTHONPATH``."""
    env = subprocess_env(**environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env["PYTHONPATH"]])
    setup_py = os.path.join(ROOT, "setup.py")
    return _run_python(tmp_path, "-c", _CHECK, setup_py, *commands, env=env, timeout=300)


def _fake_compiler(tmp_path, stderr: str = "", stdout: str = "", rc: int = 0) -> str:
    cxx = tmp_path / "fake-c++"
    cxx.write_text(
        f"#!/bin/sh\ncat >/dev/null\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {rc}\n"
    )
    cxx.chmod(0o755)
    return str(cxx)


def test_build_here_has_no_problem(tmp_path):
    proc = _check_build(tmp_path, "bdist_wheel")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "no problem"


def test_isolated_build_stops_at_once_saying_what_to_run(tmp_path):
    # pip's build isolation puts its pip-build-env-* folder on PYTHONPATH.
    isolated = tmp_path / "pip-build-env-x1y2" / "site"
    isolated.mkdir(parents=True)
    proc = _check_build(tmp_path, "egg_info", path=[isolated])
    assert proc.returncode != 0
    assert "isolated build environment" in proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr


def test_build_without_torch_says_to_install_it_first(tmp_path):
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    proc = _check_build(tmp_path, "bdist_wheel", path=[fake.parent])
    assert proc.returncode != 0
    assert "torch cannot be imported here" in proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr


def test_build_without_boost_names_the_packages(tmp_path):
    missing = "<stdin>:2:10: fatal error: boost/graph/adjacency_list.hpp: No such file or directory"
    proc = _check_build(tmp_path, "bdist_wheel", CXX=_fake_compiler(tmp_path, missing, rc=1))
    assert proc.returncode != 0
    assert "boost/graph/adjacency_list.hpp not found" in proc.stderr
    assert "libboost-graph-dev" in proc.stderr and "BOOST_ROOT" in proc.stderr
    assert "isolated" not in proc.stderr  # the torch here is fine
    # Describing or packing the source needs no compiler.
    assert _check_build(tmp_path, "sdist", CXX=_fake_compiler(tmp_path, rc=1)).returncode == 0


def test_build_with_an_old_boost_or_no_compiler(tmp_path):
    old = _fake_compiler(tmp_path, stdout="torch_replay_boost_version=106501\n")
    proc = _check_build(tmp_path, "build_ext", CXX=old)
    assert proc.returncode != 0 and "Boost >= 1.70 (found 1.65" in proc.stderr
    proc = _check_build(tmp_path, "build_ext", CXX=str(tmp_path / "no-such-c++"))
    assert proc.returncode != 0 and "a C++ compiler" in proc.stderr and "g++" in proc.stderr


def test_cuda_toolkit_is_the_one_nvcc_uses_not_a_guess_by_path(tmp_path):
    # torch guesses CUDA_HOME as nvcc's folder's parent: for a wrapper script such as
    # /usr/local/bin/nvcc that is /usr/local, with no CUDA headers (a CUDA torch without a
    # GPU then did not build unless CUDA_HOME was set by hand).
    import runpy

    setup = runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="torch_replay_setup")
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime_api.h").write_text("")
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\necho '#$ TOP={toolkit}/bin/..'\n")
    wrapper.chmod(0o755)
    guess = str(tmp_path / "local")
    environ = {"PATH": str(wrapper.parent)}
    assert setup["_cuda_home"](guess, environ) == str(toolkit)
    assert setup["_cuda_home"](str(toolkit), environ) == str(toolkit)  # a toolkit: kept
    # CUDA_HOME set by the user is theirs (torch read it into its guess).
    assert setup["_cuda_home"](guess, {**environ, "CUDA_HOME": guess}) == guess


# ------------------------------------------------------------------ the extension, loaded


def test_extension_problem_says_what_happened_and_what_to_run():
    from torch_replay._ext import extension_problem

    undefined = ImportError("_C.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv")
    built = {"torch": "2.13.0+cpu", "cuda": None, "with_cuda": False}
    assert extension_problem(None, built, "2.13.0+cpu", found=True, checkout=None) is None
    # Another local build of the same release (the wheel's torch==2.13.0 allows it).
    assert extension_problem(None, built, "2.13.0+cu128", found=True, checkout=None) is None

    other = extension_problem(undefined, built, "2.14.1+cu130", found=True, checkout=None)
    assert "was built for torch 2.13.0+cpu, but torch 2.14.1+cu130 is running" in other
    assert "undefined symbol" in other and "pip install --no-build-isolation ." in other
    # Loaded but for another torch: refused all the same.
    loaded = extension_problem(None, built, "2.14.1", found=True, checkout="/src/torch_replay")
    assert "was built for torch 2.13.0+cpu, but torch 2.14.1 is running" in loaded
    assert "bash scripts/setup.sh" in loaded and "/src/torch_replay" in loaded

    missing = ModuleNotFoundError("No module named 'torch_replay._C'")
    absent = extension_problem(missing, None, "2.13.0", found=False, checkout=None)
    assert "is not built" in absent and "No module named" not in absent
    unknown = extension_problem(undefined, None, "2.13.0", found=True, checkout=None)
    assert "fails to load under torch 2.13.0: ImportError" in unknown


def test_extension_records_the_torch_it_was_built_for():
    import torch

    from torch_replay import _ext

    if _ext.BUILD_INFO is None:
        pytest.skip("the extension was built before the build recorded its torch: rebuild it")
    assert _ext.BUILD_INFO["torch"] == torch.__version__
    assert _ext.BUILD_INFO["cuda"] == torch.version.cuda


_UNLOADABLE = """
import importlib.abc, sys, warnings

class Unloadable(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch_replay._C":
            raise ImportError("_C.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv")

sys.meta_path.insert(0, Unloadable())
import torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch_replay as tr
    import inductor_pass
print("WARNINGS", len([w for w in caught if "torch_replay._C" in str(w.message)]))
x = torch.randn(2, 4, requires_grad=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
try:
    tr.checkpoint(model, x, use_reentrant=False)
except ImportError as e:
    print("CHECKPOINT", e)
torch.compile(model, backend="torch_replay")(x).sum().backward()
for report in inductor_pass.reports():
    print("REPORT", report.kind, report.reason)
"""


def test_unloadable_extension_is_one_clear_error(tmp_path):
    env = subprocess_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    proc = _run_python(tmp_path, "-c", _UNLOADABLE, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "WARNINGS 1" in lines  # the import says so once
    (error,) = [line for line in lines if line.startswith("CHECKPOINT ")]
    assert "torch_replay._C" in error and "fails to load under torch" in error
    assert "undefined symbol" in error and "--no-build-isolation" in error
    reports = [line for line in lines if line.startswith("REPORT ")]
    assert reports  # each graph says why it was left as Inductor made it
    assert all("left unchanged" in r and "undefined symbol" in r for r in reports), reports
