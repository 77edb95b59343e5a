"""Calibration: config validation, output schema and sanity of the measured costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import torch_replay as tr
from torch_replay import calibrate as cal

from .installed import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(**over):
    cfg = {
        "name": "tiny",
        "options": ["eager", "snapshot", "journal", "readset", "guard"],
        "reps": 1,
        "warmup": 0,
        "isolate": False,
        "grid": {
            "buffer_mib": [0.25],
            "write_ratios": [0.01, 1.0],
            "live_versions": [1, 3],
            "batch": 8,
            "width": 64,
            "expand": 2,
        },
        "model": {
            "factory": "torch_replay.calibrate:queue_workload",
            "kwargs": {
                "segments": 3,
                "queue_mib": 0.25,
                "write_ratio": 0.01,
                "batch": 8,
                "width": 64,
                "wide": 8,
                "narrow": 2,
            },
        },
    }
    cfg.update(over)
    return cfg


@pytest.fixture(scope="module")
def doc():
    return cal.calibrate(cal.load_config(tiny()), progress=False)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ["cpu", "h100", "rtx2080ti"])
def test_shipped_configs_validate(name):
    cfg = cal.load_config(os.path.join(ROOT, "configs", f"{name}.yaml"))
    assert len(cfg.shapes()) == 24
    assert cfg.model is not None
    text = cal.dry_run(cfg)
    assert "24 shapes" in text
    if name != "cpu":
        assert cfg.device == "cuda" and max(cfg.grid.buffer_mib) == 1024


def test_dry_run_config_reduced_takes_every_path():
    # scripts/gpu_check.sh --dry-run measures configs/cpu_dry_run.yaml --reduced: small,
    # but with the grid and the model, every option, sparse and dense writes, one and
    # several live versions, as configs/cpu.yaml --reduced has.
    full = cal.reduce_config(cal.load_config(os.path.join(ROOT, "configs", "cpu.yaml")))
    cfg = cal.reduce_config(cal.load_config(os.path.join(ROOT, "configs", "cpu_dry_run.yaml")))
    assert cfg.device == full.device == "cpu" and cfg.options == full.options
    assert cfg.model is not None and cfg.model.factory == full.model.factory
    shapes = cfg.shapes()
    assert {s.write_ratio == 1.0 for s in shapes} == {True, False}
    assert {s.live_versions > 1 for s in shapes} == {True, False}
    assert len(shapes) == len(full.shapes())
    assert max(s.buffer_bytes for s in shapes) < min(s.buffer_bytes for s in full.shapes())


def test_dry_run_cli(capsys):
    assert cal.main(["--config", os.path.join(ROOT, "configs", "h100.yaml"), "--dry-run"]) == 0
    assert "1024MiB w=0.001 V=64" in capsys.readouterr().out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="has a GPU")
def test_cuda_config_refuses_without_gpu(tmp_path, capsys):
    rc = cal.main(["--config", os.path.join(ROOT, "configs", "h100.yaml"), "--out", "x.json"])
    assert rc == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": 1}, "unknown key"),
        ({"name": ""}, "name must be"),
        ({"options": ["eager", "checkpoint"]}, "unknown option"),
        ({"options": ["journal"]}, "must include 'eager'"),
        ({"device": "tpu"}, "device must be"),
        ({"reps": 0}, "reps must be"),
        ({"grid": None, "model": None}, "nothing to measure"),
        ({"model": {"factory": "no_colon"}}, "pkg.module:function"),
        ({"model": {"kwargs": {}}}, "missing required key"),
        ({"memory_limit_gib": 0.0001}, "memory_limit_gib"),
    ],
)
def test_config_errors(change, message):
    with pytest.raises(cal.ConfigError, match=message):
        cal.load_config(tiny(**change))


@pytest.mark.parametrize(
    "grid_change, message",
    [
        ({"write_ratios": [0.0]}, r"not in \(0, 1\]"),
        ({"write_ratios": [1.5]}, r"not in \(0, 1\]"),
        ({"live_versions": [0]}, ">= 1"),
        ({"live_versions": []}, "non-empty"),
        ({"buffer_mib": ["big"]}, "not a float"),
        ({"depth": 3}, "unknown key"),
    ],
)
def test_grid_errors(grid_change, message):
    cfg = tiny()
    cfg["grid"] = {**cfg["grid"], **grid_change}
    with pytest.raises(cal.ConfigError, match=message):
        cal.load_config(cfg)


def test_bad_factory_is_reported_by_dry_run():
    cfg = cal.load_config(tiny(model={"factory": "torch_replay.calibrate:nope"}))
    with pytest.raises(cal.ConfigError, match="no callable 'nope'"):
        cal.dry_run(cfg)


def test_yaml_only_syntax_without_pyyaml(tmp_path):
    pytest.importorskip("json")
    try:
        import yaml  # noqa: F401
    except ImportError:
        path = tmp_path / "c.yaml"
        path.write_text("name: x\n")
        with pytest.raises(cal.ConfigError, match="PyYAML is not installed"):
            cal.load_config(path)
    else:
        pytest.skip("PyYAML installed: YAML syntax is accepted")


# ----------------------------------------------------------------- output


def _ints(entry):
    for k in ("retained", "transient", "preserved"):
        assert type(entry[k]) is int and entry[k] >= 0
    assert isinstance(entry["time"], float)


def test_schema(doc):
    assert doc["schema"] == cal.SCHEMA
    assert doc["time_unit"] == "s"
    assert len(doc["grid"]) == 4
    json.dumps(doc)  # serialisable
    for g in doc["grid"]:
        assert type(g["buffer_bytes"]) is int
        for name in ("eager", "snapshot", "journal", "readset"):
            o = g["options"][name]
            assert o["valid"], o
            assert len(o["segments"]) == g["live_versions"]
            for s in o["segments"]:
                _ints(s)
            for k in ("physical_peak_delta", "tracked_peak", "model_peak"):
                assert type(o[k]) is int
        assert g["options"]["guard"]["valid"] is False  # every shape writes the buffer
    assert len(doc["model"]["segments"]) == 3
    assert type(doc["model"]["persistent"]) is int


def test_costs_sanity(doc):
    for g in doc["grid"]:
        b, v, w = g["buffer_bytes"], g["live_versions"], g["written_bytes_per_segment"]
        opts = g["options"]
        for s in opts["eager"]["segments"]:
            assert s["preserved"] == 0
        for s in opts["snapshot"]["segments"]:
            assert s["preserved"] == b  # the whole declared buffer
        journal = [s["preserved"] for s in opts["journal"]["segments"]]
        # the shared log since segment i began: its own writes and every later segment's
        assert journal[-1] == w
        assert journal == sorted(journal, reverse=True)
        if w * v <= b:
            assert journal[0] == w * v
        for s in opts["readset"]["segments"]:
            assert w <= s["preserved"] <= b
        if g["write_ratio"] == 1.0:
            assert all(s["preserved"] == b for s in opts["readset"]["segments"])
        for name in ("snapshot", "journal", "readset"):
            for s, e in zip(opts[name]["segments"], opts["eager"]["segments"], strict=True):
                assert s["retained"] >= s["preserved"]
                # replay: recomputed activations (at least what eager retained) come back
                assert s["transient"] >= e["retained"] - 4096


def test_load_costs_feeds_the_planner(doc):
    opts = cal.load_costs(doc, segments=3)
    assert all(isinstance(o, tr.Option) for seg in opts for o in seg)
    p = tr.plan(opts, budget=10**12, persistent=doc["model"]["persistent"])
    assert len(p.choices) == 3
    grid_opts = cal.load_costs(doc, section="grid", shape=2)  # V=3, w=0.01
    assert len(grid_opts) == 3
    with pytest.raises(ValueError, match="expected 5"):
        cal.load_costs(doc, segments=5)
    with pytest.raises(ValueError, match="not a"):
        cal.load_costs({"schema": "other"})


def test_summary_table(doc):
    text = cal.summary(doc)
    assert text.count("\n") >= 2 + 4 * 4


def test_cli_isolated(tmp_path):
    # With the model section: run as ``python -m``, the factory's Workload must be accepted.
    cfg = tiny(isolate=True, options=["eager", "snapshot"])
    cfg["grid"] = {**cfg["grid"], "write_ratios": [0.01], "live_versions": [2]}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "costs.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_replay.calibrate",
            "--config",
            str(path),
            "--out",
            str(out),
            "--plot",
            str(tmp_path / "p.png"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert (
        doc["grid"][0]["options"]["snapshot"]["segments"][0]["preserved"]
        == (doc["grid"][0]["buffer_bytes"])
    )
    assert ("matplotlib is not importable" in proc.stdout) or (tmp_path / "p.png").exists()
    assert len(doc["model"]["fingerprint"]["segments"]) == 3
