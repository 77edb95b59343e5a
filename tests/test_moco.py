"""The MoCo application (benchmarks/moco) in miniature: two steps per method.

Every correct method must leave a test score file byte-identical to eager's;
torch.utils.checkpoint, whose re-run of the head reads the already-enqueued
queue, must differ. The journal journals the enqueue made outside any segment
(Note [Write watch]), so it is among the correct methods. The full-size table is
benchmarks/results/moco.md.
"""

from __future__ import annotations

import torch

from benchmarks.moco.data import augment, make_dataset
from benchmarks.moco.train import (
    CORRECT,
    MocoConfig,
    accuracy_from_scores,
    calibrate_plans,
    run_seed,
)

TINY = MocoConfig(
    width=8,
    batch=16,
    queue_mib=0.25,
    steps=2,
    train_images=128,
    test_images=64,
    probe_epochs=2,
    calibration_reps=1,
)


def test_data_is_deterministic():
    a = make_dataset(train=32, test=16, classes=4, seed=3)
    b = make_dataset(train=32, test=16, classes=4, seed=3)
    assert torch.equal(a.train_images, b.train_images)
    assert torch.equal(a.test_labels, b.test_labels)
    assert a.train_images.dtype == torch.uint8 and a.train_images.shape == (32, 3, 32, 32)
    v1 = augment(a.train_images[:8], torch.Generator().manual_seed(1))
    v2 = augment(a.train_images[:8], torch.Generator().manual_seed(1))
    assert torch.equal(v1, v2)


def test_score_files_byte_identical_and_torch_checkpoint_differs(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = make_dataset(
            train=TINY.train_images, test=TINY.test_images, classes=TINY.classes, seed=0
        )
        plans = calibrate_plans(TINY, data, 2701)
        res = run_seed(TINY, data, 2701, plans, tmp_path)
    finally:
        torch.set_num_threads(threads)
    ref = res["eager"]["sha256"]
    assert res["eager"]["error"] is None and res["eager"]["steps_done"] == 2
    for m in CORRECT:
        r = res[m]
        assert r["error"] is None, (m, r["error"])
        assert r["sha256"] == ref, m
        assert r["state_sha256"] == res["eager"]["state_sha256"], m
        assert r["max_param_diff_vs_eager"] == 0.0, m
        assert r["peak_bytes"] > 0, m
    # the planned methods ran plans from calibrated costs
    assert res["joint"]["predicted_peak_bytes"] <= plans.budget
    torch_ckpt = res["torch_checkpoint"]
    assert torch_ckpt["error"] is None
    assert torch_ckpt["sha256"] != ref
    assert torch_ckpt["max_param_diff_vs_eager"] > 0
    acc = accuracy_from_scores(res["eager"]["path"], data.test_labels, data.classes)
    assert acc == res["eager"]["accuracy"]
