"""Plans that noise cannot fool (Note [Re-run floor] in torch_replay/planner.py): a
checkpointed option costs at least the layer's forward and backward plus its re-run, so
with an ample budget every layer keeps its activations, whatever the calibrated clocks
said. References: the floor's formula written out here, a brute force over every choice
(the plan with the least summed time keeps everything once the floor holds), and the
measured costs themselves (the raw medians the calibration keeps beside the floored ones).
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_replay as tr
from torch_replay._planning.layer_order import plan_ordered
from torch_replay.planner import RERUN_FLOOR_MIN_S, rerun_floor

TIB = 1 << 40


def test_a_rerun_measured_below_keeping_is_raised_to_the_floor():
    eager = tr.Option("eager", retained=800, transient=0, time=1.0)
    guard = tr.Option("guard", retained=100, transient=700, time=0.6)  # noise: below eager
    journal = tr.Option("journal", retained=150, transient=700, time=2.0)  # above: kept
    floored = rerun_floor([eager, guard, journal], eager_forward=0.3)
    assert [o.name for o in floored] == ["eager", "guard", "journal"]
    assert floored[0] == eager and floored[2] == journal
    assert floored[1].time == pytest.approx(1.0 + 0.3)  # forward + backward + re-run
    assert (floored[1].retained, floored[1].transient) == (100, 700)  # bytes untouched
    # a forward too short for the clock still makes the re-run strictly dearer
    assert rerun_floor([eager, guard], 0.0)[1].time == 1.0 + RERUN_FLOOR_MIN_S
    assert rerun_floor([guard], 0.3) == [guard]  # no keep option: nothing to floor against
    with pytest.raises(ValueError, match="eager_forward"):
        rerun_floor([eager, guard], -1.0)


_option = st.builds(
    lambda name, r, t, time: tr.Option(name, retained=r, transient=t, time=time),
    st.sampled_from(["snapshot", "journal", "readset", "guard"]),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 20),
    st.floats(0.0, 10.0),
)
_layer = st.tuples(
    st.integers(0, 1 << 20),  # eager retained
    st.floats(0.0, 10.0),  # eager time
    st.floats(0.0, 1.0),  # eager forward
    st.lists(_option, min_size=1, max_size=3, unique_by=lambda o: o.name),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_layer, min_size=1, max_size=5))
def test_ample_budget_keeps_every_layer_whatever_the_times(layers):
    """Any measured times (re-runs below keeping included): once floored, both planners
    keep every layer at 1 TiB, and a brute force agrees that keeping is the fastest."""
    options = [
        rerun_floor([tr.Option("eager", retained=r, transient=0, time=t), *rest], fwd)
        for r, t, fwd, rest in layers
    ]
    ordered = plan_ordered(options, [0] * len(options), budget=TIB)
    assert ordered.choices == ["eager"] * len(options)
    assert tr.plan(options, budget=TIB).choices == ["eager"] * len(options)
    best = min(itertools.product(*options), key=lambda c: sum(o.time for o in c))
    assert [o.name for o in best] == ["eager"] * len(options)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


def test_calibrated_costs_carry_the_floor_by_construction():
    """The calibration's segments: every checkpointed option at least eager's time plus
    eager's measured forward; the raw medians stay in the per-option results."""
    torch.manual_seed(0)
    blocks = [_Block(), _Block()]
    doc = tr.calibrate_model(
        blocks, torch.randn(8, 16), options=["eager", "snapshot", "guard"], quick=True,
        progress=False,
    )  # fmt: skip
    model = doc["model"]
    forward = model["eager_forward"]
    assert len(forward) == 2 and all(f > 0 for f in forward)
    for i, seg in enumerate(model["segments"]):
        eager = next(o for o in seg if o["name"] == "eager")
        assert eager["time"] == model["options"]["eager"]["segments"][i]["time"]
        for o in seg:
            if o["name"] != "eager":
                assert o["time"] >= eager["time"] + forward[i]
                raw = model["options"][o["name"]]["segments"][i]["time"]
                assert o["time"] == max(raw, eager["time"] + forward[i])
    loaded = tr.calibrate.load_costs(doc)
    assert [[o.time for o in seg] for seg in loaded] == [
        [o["time"] for o in seg] for seg in model["segments"]
    ]


def _llama():
    from tests.hf_tiny import tiny_causal_lm

    return tiny_causal_lm("Llama", num_hidden_layers=3, num_key_value_heads=2)


def _batch():
    ids = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "labels": ids, "use_cache": False}


def test_noisy_layer_costs_at_an_ample_budget_keep_every_layer(tmp_path):
    """A tiny Llama's layer costs where every re-run option measured at half the keep
    option's time (what a loaded machine can report): at 1 TiB the plan keeps every
    layer and no layer is checkpointed."""
    from torch_replay.integrations import transformers as tr_hf

    path = tmp_path / "llama.json"
    tr_hf.enable(
        _llama(), budget=TIB, example_batch=_batch(), calibration={"quick": True, "out": path}
    )
    doc = json.loads(path.read_text())
    for group in doc["groups"]:
        eager = next(o for o in group["options"] if o["name"] == "eager")
        for o in group["options"]:
            if o["name"] != "eager":
                o["time"] = 0.5 * eager["time"]
    model = _llama()
    plan = tr_hf.enable(model, budget=TIB, example_batch=_batch(), costs=doc)
    assert plan.choices == ["eager"] * 3
    assert not any(m.gradient_checkpointing for m in tr_hf.layers(model))
    # layer costs of the previous version (no forward time) are refused, not trusted
    old = {**doc, "schema": "torch_replay.layer_costs/2"}
    with pytest.raises(ValueError, match="another version"):
        tr_hf.enable(_llama(), budget=TIB, example_batch=_batch(), costs=old)
