"""The calibration's reduced grid (``--reduced``), used by scripts/gpu_check.sh."""

from __future__ import annotations

import json
import os

from torch_replay import calibrate as cal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_reduced_h100_keeps_the_corners_of_the_grid_at_one_size():
    cfg = cal.load_config(os.path.join(ROOT, "configs", "h100.yaml"))
    red = cal.reduce_config(cfg)
    assert red.name == "h100-reduced" and red.device == "cuda"
    assert red.grid.buffer_mib == [256]
    assert red.grid.write_ratios == [0.001, 1.0]
    assert red.grid.live_versions == [1, 64]
    assert len(red.shapes()) == 4
    assert (red.reps, red.warmup, red.isolate) == (2, 1, False)
    assert red.model == cfg.model and red.options == cfg.options
    assert len(cfg.shapes()) == 24  # the original is untouched


def test_reduced_dry_run_cli(capsys):
    path = os.path.join(ROOT, "configs", "h100.yaml")
    assert cal.main(["--config", path, "--dry-run", "--reduced"]) == 0
    out = capsys.readouterr().out
    assert "'h100-reduced'" in out and "4 shapes" in out
    assert "256MiB w=1 V=64" in out and "1024MiB" not in out


def test_reduced_cpu_run_writes_costs(tmp_path):
    cfg = {
        "name": "tiny",
        "options": ["eager", "snapshot", "journal"],
        "reps": 3,
        "warmup": 2,
        "isolate": True,
        "grid": {
            "buffer_mib": [0.5, 0.25],
            "write_ratios": [0.1, 0.01, 1.0],
            "live_versions": [3, 1, 2],
            "batch": 8,
            "width": 64,
            "expand": 2,
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "costs.json"
    summary = tmp_path / "grid.md"
    args = ["--config", str(path), "--out", str(out), "--summary", str(summary), "--reduced"]
    assert cal.main([*args, "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["name"] == "tiny-reduced"
    shapes = [(g["write_ratio"], g["live_versions"]) for g in doc["grid"]]
    assert shapes == [(0.01, 1), (1.0, 1), (0.01, 3), (1.0, 3)]
    assert {g["buffer_bytes"] for g in doc["grid"]} == {256 * 1024}
    for g in doc["grid"]:
        for name in ("eager", "snapshot", "journal"):
            assert g["options"][name]["valid"], g["options"][name]
            assert "kernel_s" not in g["options"][name]  # CPU: no device time
            # A step's process CPU time is recorded and positive. No upper bound: for a
            # sub-millisecond step of a multi-threaded child, the kernel's per-process
            # sum of thread times can jump by other threads' earlier run time (a loaded
            # CI run saw 2.7 ms of CPU in a 0.7 ms step on 2 cores).
            o = g["options"][name]
            assert o["step_cpu_s"] > 0, o
    text = summary.read_text()
    assert "kernel s" not in text
    header = text.splitlines()[0]
    assert "| step CPU s |" in header and "| CPU time / snapshot |" in header
    assert all(line.count("|") == header.count("|") for line in text.splitlines() if line)


def test_summary_shows_cupti_kernel_time_when_present():
    opt = {
        "valid": True,
        "step_s": 0.5,
        "kernel_s": 0.25,
        "kernel_source": "cupti",
        "tracked_peak": 2**20,
        "physical_peak_delta": 2**20,
        "model_peak": 2**20,
    }
    doc = {
        "grid": [
            {
                "buffer_bytes": 2**20,
                "write_ratio": 1.0,
                "live_versions": 1,
                "options": {"snapshot": opt, "eager": {**opt, "kernel_s": 0.125}},
            }
        ]
    }
    text = cal.summary(doc)
    assert "| kernel s (source) |" in text.splitlines()[0]
    assert "| 0.2500 (cupti) |" in text and "| 0.1250 (cupti) |" in text
    assert all(line.count("|") == text.splitlines()[0].count("|") for line in text.splitlines())
