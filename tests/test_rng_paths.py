"""RNG is verified on every path, and every ``detect`` level is at least as safe as
torch's checkpoint (issue 44, items 3, 4 and 8).

* A segment whose forward drew nothing (Dropout in eval mode) and whose re-run draws
  (``model.train()`` before backward): its re-run saves tensors of the same shapes from
  other operators. With early stop (torch's default) the re-run used to stop there
  unverified and give a silently wrong gradient; now every path raises
  ``RngMismatchError``, and the generator is left where it was.
* ``detect="saved"``: an argument the segment reads but autograd does not save, changed
  in place before backward, is refused as torch's checkpoint refuses it.
* A meta tensor in ``state=`` is called a meta tensor.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint as tcp
from torch import nn

import torch_replay as tr


def _eval_then_train(checkpoint, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Tanh())
    x = torch.randn(4, 8, requires_grad=True)
    ref = copy.deepcopy(model).eval()
    ref(x).sum().backward()
    model.eval()
    y = checkpoint(model, x, **kw)
    model.train()  # before backward: the re-run would draw a dropout mask
    return model, ref, y


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_rerun_that_draws_where_the_forward_did_not(reentrant, early_stop):
    kw = {"use_reentrant": reentrant}
    if not reentrant:
        kw["early_stop"] = early_stop
    model, ref, y = _eval_then_train(tr.checkpoint, **kw)
    rng = torch.get_rng_state()
    with pytest.raises(tr.RngMismatchError, match="default CPU generator"):
        y.sum().backward()
    assert torch.equal(torch.get_rng_state(), rng)


def test_torch_checkpoint_is_silently_wrong_on_the_same_step():
    """The case is real: torch's non-reentrant checkpoint stops early and differs from
    eager, without an error."""
    model, ref, y = _eval_then_train(tcp.checkpoint, use_reentrant=False)
    y.sum().backward()
    assert not torch.allclose(model[0].weight.grad, ref[0].weight.grad)


def test_pure_segment_early_stop_unchanged():
    """A segment that draws nothing in either run still stops early and gives torch's
    gradient bitwise."""
    got = []
    for checkpoint in (tcp.checkpoint, tr.checkpoint):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        x = torch.randn(4, 8, requires_grad=True)
        checkpoint(model, x, use_reentrant=False).sum().backward()
        got.append([p.grad for p in model.parameters()] + [x.grad])
    assert all(torch.equal(a, b) for a, b in zip(*got, strict=True))


def _segment(a, w):
    return torch.tanh((a + 1.0) * w)  # `a` is read; autograd saves a + 1, not a


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("detect", ["saved", "reads", "preserve"])
def test_argument_changed_in_place_before_backward(detect, reentrant):
    torch.manual_seed(0)
    a = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    eager_w = w.detach().clone().requires_grad_()
    _segment(a, eager_w).sum().backward()
    # torch's checkpoint refuses it (a version-counter error)
    a_torch = a.clone()
    y = tcp.checkpoint(_segment, a_torch, w, use_reentrant=False)
    a_torch.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    w.grad = None
    with tr.config.patch(detect=detect):
        y = tr.checkpoint(_segment, a, w, use_reentrant=reentrant)
        a.mul_(3.0)
        after = a.clone()
        if detect == "preserve" and not reentrant:
            y.sum().backward()  # preserved: the forward's values, eager's gradient
            assert torch.equal(w.grad, eager_w.grad)
        else:
            # StateMutationError, or (reentrant: the inputs are saved by the autograd
            # Function) autograd's own version-counter error, as with torch's
            with pytest.raises(RuntimeError, match="modified (in place|by an inplace)"):
                y.sum().backward()
        assert torch.equal(a, after)


def test_meta_tensor_in_state_is_named_as_such():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(tr.UnsupportedReplayError, match="is a meta tensor"):
        tr.checkpoint(
            lambda t: t * 2, x, use_reentrant=False, state=[torch.empty(4, device="meta")]
        )
