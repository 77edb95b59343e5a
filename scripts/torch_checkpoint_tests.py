"""Run PyTorch's own activation-checkpoint tests with and without torch_replay.

PyTorch's test files are not part of this repository (and must not be): point this
script at a PyTorch source tree (or any folder holding ``test_utils.py`` and
``test_autograd.py``, or extracts of them), and it copies the files into a temporary
folder outside the repository, runs the checkpoint tests twice with the installed torch
(unpatched, then with ``torch.utils.checkpoint.checkpoint`` / ``checkpoint_sequential``
replaced by torch_replay's before the test modules are imported), and prints the counts
and every test that passes unpatched but not swapped. Exit status 1 if there is one.

    python scripts/torch_checkpoint_tests.py --pytorch ~/src/pytorch [--repeat 3]

Tests selected: class ``TestCheckpoint`` of ``test_utils.py``; in ``test_autograd.py`` the
classes ``TestNestedCheckpoint`` and ``TestSelectiveActivationCheckpoint`` and every test
whose name contains ``checkpoint``. Set ``PYTORCH_TEST_WITH_SLOW=1`` for the slow ones.
See docs/dropin.md for the last results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CONFTEST = """
import os

if os.environ.get("TORCH_REPLAY_SWAP") == "1":
    import torch.utils.checkpoint as tcp

    import torch_replay

    tcp.checkpoint = torch_replay.checkpoint
    tcp.checkpoint_sequential = torch_replay.checkpoint_sequential


def pytest_collection_finish(session):
    if os.environ.get("TORCH_REPLAY_SWAP") == "1":
        import torch_replay

        for item in session.items:
            mod = getattr(item, "module", None)
            if mod is not None and "checkpoint" in vars(mod):
                assert mod.checkpoint is torch_replay.checkpoint, mod.__name__
"""

_SELECT = {
    "test_utils.py": "TestCheckpoint",
    "test_autograd.py": "TestNestedCheckpoint or TestSelectiveActivationCheckpoint or checkpoint",
}


def _find(root: Path, name: str) -> Path:
    for cand in (root / "test" / name, root / name):
        if cand.is_file():
            return cand
    stem = name.removesuffix(".py")
    hits = sorted(root.glob(f"{stem}*.py")) + sorted(root.glob(f"test/{stem}*.py"))
    if hits:
        return hits[0]
    raise SystemExit(f"no {name} under {root} (expected {root}/test/{name})")


def _run(folder: Path, files: list[str], swap: bool, python: str) -> dict[str, tuple[str, str]]:
    tag = "swapped" if swap else "torch"
    xml = folder / f"{tag}.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("TORCH_REPLAY_SWAP", None)
    if swap:
        env["TORCH_REPLAY_SWAP"] = "1"
    results: dict[str, tuple[str, str]] = {}
    for f in files:
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f, "-k", _SELECT[f]]
        cmd += [f"--junitxml={xml}", "-o", "junit_family=xunit1"]
        subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, check=False)
        if not xml.exists():
            results[f"{f}::<collection>"] = ("error", "pytest wrote no results")
            continue
        for tc in ET.parse(xml).getroot().iter("testcase"):
            key = f"{tc.get('classname')}::{tc.get('name')}"
            status, msg = "passed", ""
            for child in tc:
                if child.tag in ("failure", "error", "skipped"):
                    status = {"failure": "failed", "error": "error", "skipped": "skipped"}[
                        child.tag
                    ]
                    msg = (child.get("message") or child.text or "").strip().splitlines()
                    msg = msg[0] if msg else ""
                    break
            results[key] = (status, msg)
        xml.unlink()
    return results


def _counts(res: dict[str, tuple[str, str]]) -> str:
    names = ("passed", "failed", "error", "skipped")
    return ", ".join(f"{n} {sum(1 for s, _ in res.values() if s == n)}" for n in names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pytorch", required=True, type=Path, help="PyTorch source tree")
    ap.add_argument("--repeat", type=int, default=1, help="swapped runs (default 1)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch")
    args = ap.parse_args(argv)
    probe = [args.python, "-c", "import expecttest"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        raise SystemExit(
            "PyTorch's test helpers need expecttest: "
            f"{args.python} -m pip install expecttest (or add it to PYTHONPATH)"
        )
    with tempfile.TemporaryDirectory(prefix="torch_replay_pt_tests_") as tmp:
        folder = Path(tmp)
        files = []
        for name in _SELECT:
            shutil.copy(_find(args.pytorch, name), folder / name)
            files.append(name)
        (folder / "conftest.py").write_text(_CONFTEST)
        base = _run(folder, files, swap=False, python=args.python)
        print(f"torch (unpatched): {_counts(base)}")
        bad = 0
        for i in range(args.repeat):
            ours = _run(folder, files, swap=True, python=args.python)
            print(f"torch_replay swapped in (run {i + 1}): {_counts(ours)}")
            regress = [
                k
                for k, (s, _) in sorted(base.items())
                if s == "passed" and ours.get(k, ("",))[0] != "passed"
            ]
            for k in regress:
                print(f"  passes unpatched, not swapped: {k}: {ours.get(k, ('missing', ''))}")
            bad += len(regress)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
