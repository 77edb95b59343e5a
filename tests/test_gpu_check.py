"""scripts/gpu_check.sh's time boxes: they bind on the GPU machine only.

A dry run (CI, any machine, often a loaded one) records a step that runs past
the time box sized for the GPU machine as ``slow`` and exits 0; the GPU run
stops the same step and fails. The probe step (it starts Python and imports
torch: over a second on any machine seen) is given a 0.1 s box to make it run
over; the box is timed in milliseconds, so it holds however fast the step is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpu_check(tmp_path, *args: str, **env: str) -> tuple[int, dict]:
    out = tmp_path / "gc"
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    p = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--only", "probe", "--budget", "probe=0.1"]
        + ["--out", str(out), *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
    )
    with open(out / "summary.json") as f:
        return p.returncode, json.load(f)


def test_dry_run_reports_a_slow_step_and_passes(tmp_path):
    rc, summary = _gpu_check(tmp_path, "--dry-run")
    probe = summary["steps"][0]
    assert probe["name"] == "probe" and probe["status"] == "slow", probe
    assert "past its 0.1 s time box" in probe["note"], probe["note"]
    assert summary["ok"] and rc == 0


def test_gpu_run_enforces_the_time_box(tmp_path):
    rc, summary = _gpu_check(tmp_path)
    probe = summary["steps"][0]
    assert probe["status"] == "timeout", probe
    assert not summary["ok"] and rc == 1


def test_dry_run_stops_a_hung_step(tmp_path):
    rc, summary = _gpu_check(tmp_path, "--dry-run", GPU_CHECK_HANG_S="0.1")
    probe = summary["steps"][0]
    assert probe["status"] == "timeout" and "hung" in probe["note"], probe
    assert rc == 1


def test_a_budget_that_is_not_seconds_is_refused(tmp_path):
    p = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--only", "probe", "--budget", "probe=1.5s"]
        + ["--out", str(tmp_path / "gc"), "--dry-run"],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    assert "--budget probe=1.5s is not a number of seconds" in p.stderr, p.stderr
