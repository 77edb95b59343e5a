"""Costs belong to one model: the fingerprint, its refusal, own-model calibration, costs='auto'."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch
from torch import nn

import torch_replay as tr
from torch_replay import calibrate as cal

OPTIONS = ["eager", "snapshot", "journal", "readset"]


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)  # a buffer the segment writes (preserved by the engines)
        return torch.tanh(self.fc(x))


def make(width=16, n=3, seed=0):
    torch.manual_seed(seed)
    segs = nn.Sequential(*[Block(width) for _ in range(n)])
    return segs, torch.randn(8, width)


@pytest.fixture(scope="module")
def doc():
    segs, x = make()
    return cal.calibrate_model(segs, x, state=[segs], options=OPTIONS, quick=True, progress=False)


def test_costs_carry_the_fingerprint_and_the_machine(doc):
    fp = doc["model"]["fingerprint"]
    assert [s["class"].rsplit(".", 1)[-1] for s in fp["segments"]] == ["Block"] * 3
    assert fp["segments"][0]["parameters"][0] == ["fc.weight", [16, 16], "float32"]
    assert fp["segments"][1]["input"] == {"shape": [8, 16], "dtype": "float32"}
    assert doc["machine"]["torch"] == torch.__version__
    assert len(doc["model"]["segments"]) == 3


def test_matching_costs_are_accepted(doc):
    segs, _ = make(seed=1)  # other values, same structure
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=doc)
    assert len(model.choices) == 3


@pytest.mark.parametrize(
    "other, message",
    [
        (
            lambda: make(width=8)[0],
            r"segment 0 differs: parameter 'fc.weight' is float32 \(16, 16\)",
        ),
        (lambda: make(n=2)[0], "describe 3 segments"),
        (
            lambda: nn.Sequential(Block(16), nn.Sequential(nn.Linear(16, 16)), Block(16)),
            "segment 1 differs: it is a",
        ),
        (lambda: make()[0].double(), "float64"),
    ],
)
def test_costs_of_another_model_are_refused(doc, tmp_path, other, message):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    segs = other()
    with pytest.raises(tr.CostsMismatchError, match=message) as info:
        tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=str(path))
    assert "calibrate" in str(info.value).lower()
    assert isinstance(info.value, ValueError)


def test_costs_without_fingerprint_warn(doc):
    old = json.loads(json.dumps(doc))
    del old["model"]["fingerprint"]
    segs, _ = make()
    with pytest.warns(UserWarning, match="no model fingerprint"):
        tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=old)


def test_costs_from_another_torch_warn(doc):
    other = json.loads(json.dumps(doc))
    other["machine"]["torch"] = "1.0.0"
    segs, _ = make()
    with pytest.warns(UserWarning, match="measured elsewhere"):
        tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=other)


def test_calibration_leaves_the_model_as_it_was():
    segs, x = make()
    for p in segs.parameters():
        p.grad = torch.full_like(p, 3.0)
    before = {k: v.clone() for k, v in segs.state_dict().items()}
    grads = [p.grad.clone() for p in segs.parameters()]
    rng = torch.get_rng_state()
    cal.calibrate_model(
        segs, x, state=[segs], options=["eager", "snapshot"], quick=True, progress=False
    )
    for k, v in segs.state_dict().items():
        assert torch.equal(v, before[k]), k
    for p, g in zip(segs.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)
    assert torch.equal(torch.get_rng_state(), rng)


def test_auto_costs_calibrate_at_first_call_and_match_eager():
    segs, x = make()
    ref_segs, _ = make()
    xr = x.clone().requires_grad_()
    ref_segs(xr).pow(2).mean().backward()  # eager PyTorch: the reference
    model = tr.PlannedSequential(
        segs, budget=10**9, state=[segs], costs="auto", calibration={"options": OPTIONS}
    )
    assert model.plan is None
    xa = x.clone().requires_grad_()
    model(xa).pow(2).mean().backward()
    assert model.plan is not None and len(model.choices) == 3
    assert torch.equal(xa.grad, xr.grad)
    for p, q in zip(model.parameters(), ref_segs.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    for b, c in zip(segs.buffers(), ref_segs.buffers(), strict=True):
        assert torch.equal(b, c)  # one step's update, not the calibration's


def test_save_costs_round_trip(tmp_path):
    segs, x = make()
    model = tr.PlannedSequential(
        segs, budget=10**9, state=[segs], costs="auto", calibration={"options": OPTIONS}
    )
    with pytest.raises(ValueError, match="call the module once"):
        model.save_costs(tmp_path / "c.json")
    model(x.clone().requires_grad_())
    model.save_costs(tmp_path / "c.json")
    again = tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=tmp_path / "c.json")
    assert again.choices == model.choices


def test_input_shape_change_warns(doc):
    segs, _ = make()
    model = tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=doc)
    with pytest.warns(UserWarning, match="measured with input"):
        model(torch.randn(4, 16))


def test_measure_with_and_without_gradients(doc):
    segs, x = make()
    model = tr.PlannedSequential(segs, budget=10**9, state=[segs], costs=doc)
    report = model.measure(x.clone().requires_grad_())
    grads = sum(p.numel() * p.element_size() for p in segs.parameters())
    assert report.measured_peak_grads_held >= report.static_bytes + grads
    assert report.measured_peak_grads_held >= report.measured_peak
    text = str(report)
    assert "gradients held" in text and "gradients cleared" in text
    assert all(p.grad is not None for p in segs.parameters())


def test_cli_model_writes_fingerprinted_costs(tmp_path, monkeypatch):
    (tmp_path / "mymodel.py").write_text(
        "import torch\n"
        "def make(width=8):\n"
        "    torch.manual_seed(0)\n"
        "    segs = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())\n"
        "    return segs, torch.randn(4, width)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = tmp_path / "costs.json"
    rc = cal.main(
        [
            "--model",
            "mymodel:make",
            "--kwargs",
            '{"width": 8}',
            "--quick",
            "--options",
            "eager,snapshot",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["factory"] == "mymodel:make"
    assert doc["model"]["fingerprint"]["segments"][0]["parameters"][0][1] == [8, 8]
