"""Frozen CPU inference (``torch._inductor.config.freezing``): the wrapper's constants are
mkldnn tensors with no storage to read (Note [Opaque tensors] in
inductor_pass/stages/guard.py). The pass profiles, certifies and permutes such a program
like an unfrozen one. References: plain Inductor's outputs (bitwise) and its peak measured
around the user's call by the counting allocator.

Before: "pass failed (NotImplementedError: Cannot access storage of OpaqueTensorImpl)".
"""

from __future__ import annotations

import torch

import inductor_pass
from tests.inductor_support import FrozenBranchy, call_peak


def test_frozen_branchy_cnn_is_permuted(one_thread, fresh_dynamo, no_decision_cache):
    torch.manual_seed(0)
    model, x = FrozenBranchy().eval(), torch.randn(2, 3, 32, 32)
    with torch._inductor.config.patch(freezing=True):
        peak_inductor, want = call_peak(model, x, "inductor")
        inductor_pass.clear_reports()
        peak_ours, got = call_peak(model, x, "torch_replay")
    (rep,) = inductor_pass.reports()
    assert rep.deployed and rep.variant == "default", rep.reason
    assert rep.permuted_order is not None  # a permutation of Inductor's own program
    assert rep.byte_exact and rep.bitwise_identical and rep.certified, rep
    assert "mkldnn" in rep.original_source and "_frozen_param" in rep.original_source
    assert torch.equal(got, want)
    assert peak_ours < peak_inductor
    assert peak_inductor - peak_ours == rep.measured_original_peak - rep.measured_permuted_peak
