"""torch_replay.integrations.timm and tr.replace_torch_checkpoint() on timm models built
from tiny configs (pretrained=False, no downloads): ResNet (BatchNorm), ConvNeXt, ViT.
Two SGD steps each; loss, every gradient of each step, parameters and buffers compared
with eager (no checkpointing) and with timm's own checkpointing (torch's checkpoint).
ResNet's BatchNorm statistics: torch's re-run updates them a second time, so timm's own
checkpointing differs from eager; torch_replay gives eager's, bitwise.

timm needs torchvision, and torchvision must match torch: on this machine it exists only
for torch 2.14.1 (the project's .venv has torch 2.13), so these tests skip there and run
with ``bash scripts/timm_tests.sh`` (a venv of their own with torch 2.14.1, torchvision
0.29.1 and timm 1.0.31, outside the checkout)."""

from __future__ import annotations

import warnings

import pytest
import torch

_RECIPE = (
    "run them with `bash scripts/timm_tests.sh` (a venv outside the checkout with torch "
    "2.14.1, torchvision 0.29.1 and timm 1.0.31: torchvision, which timm imports, exists "
    f"on this machine only for torch 2.14.1; this is torch {torch.__version__})"
)
try:
    from timm.models.convnext import ConvNeXt
    from timm.models.resnet import BasicBlock, ResNet
    from timm.models.vision_transformer import VisionTransformer
except Exception as e:  # ImportError, or a torchvision built for another torch
    pytest.skip(f"timm cannot be imported ({type(e).__name__}: {e}); {_RECIPE}",
                allow_module_level=True)  # fmt: skip

import torch_replay as tr  # noqa: E402
from tests.reference import assert_bitwise  # noqa: E402
from torch_replay._replay.segment import collect_transactions  # noqa: E402
from torch_replay.integrations import timm as tr_timm  # noqa: E402


def _resnet():
    return ResNet(BasicBlock, layers=(1, 1, 1, 1), channels=(8, 16, 16, 16), stem_width=8,
                  num_classes=5)  # fmt: skip


def _convnext():
    return ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), num_classes=5, patch_size=4)


def _vit():
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2,
                             num_classes=5)  # fmt: skip


BUILD = {"resnet": _resnet, "convnext": _convnext, "vit": _vit}
# segments per step with every block checkpointed (timm's checkpoint_seq, every=1)
SEGMENTS = {"resnet": 4, "convnext": 4, "vit": 2}


def _train(name, mode, steps=2):
    """Two SGD steps of a fresh model; ``mode``: "eager", "torch" (timm's own
    set_grad_checkpointing), "enable" (tr_timm.enable), "replace" (timm's own, each
    forward inside tr.replace_torch_checkpoint()). Returns losses, the gradients of each
    step, parameters, buffers, the number of torch_replay segments and the eval-mode
    logits of the trained model on a fresh batch."""
    torch.manual_seed(0)
    model = BUILD[name]()
    model.train()
    if mode in ("torch", "replace"):
        model.set_grad_checkpointing(True)
    elif mode == "enable":
        tr_timm.enable(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    losses, grads, segments = [], [], 0
    for _ in range(steps):
        x = torch.randn(4, 3, 32, 32, generator=gen)
        y = torch.randint(0, 5, (4,), generator=gen)
        with collect_transactions() as txns:
            if mode == "replace":
                with tr.replace_torch_checkpoint():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
        segments += len(txns)
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    params = [p.detach().clone() for p in model.parameters()]
    model.eval()  # the trained model's prediction (BatchNorm: its running statistics)
    with torch.no_grad():
        logits = model(torch.randn(4, 3, 32, 32, generator=gen))
    buffers = [b.clone() for b in model.buffers()]
    return losses, grads, params, buffers, segments, logits


def _max_grad_diff(a, b):
    pairs = [(x, y) for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)]
    return max((x - y).abs().max().item() for x, y in pairs)


def _assert_same(run, ref):
    assert_bitwise(run[0], ref[0])
    assert len(run[1]) == len(ref[1]) == 2
    for step, step_ref in zip(run[1], ref[1], strict=True):
        assert_bitwise(step, step_ref)
    assert_bitwise(run[2], ref[2])
    assert_bitwise(run[3], ref[3])
    assert torch.equal(run[5], ref[5])


@pytest.mark.parametrize("mode", ["enable", "replace"])
def test_resnet_batchnorm_trains_like_eager_where_timms_own_does_not(mode, one_thread):
    eager = _train("resnet", "eager")
    theirs = _train("resnet", "torch")
    ours = _train("resnet", mode)
    assert theirs[4] == 0 and ours[4] == 2 * SEGMENTS["resnet"]
    # torch's re-run updates every BatchNorm's statistics a second time
    off = sum(not torch.equal(a, b) for a, b in zip(theirs[3], eager[3], strict=True))
    assert off > 0
    eval_off = (theirs[5] - eager[5]).abs().max().item()
    assert eval_off > 0  # ... and so the trained model's predictions
    print(f"\nResNet, 2 steps: timm's own checkpointing: {off} of {len(eager[3])} buffers "
          f"differ from eager, max |grad - eager| {_max_grad_diff(theirs[1], eager[1]):.3e}, "
          f"max |eval logits - eager| {eval_off:.3e}; torch_replay ({mode}): max |grad - "
          f"eager| {_max_grad_diff(ours[1], eager[1]):.3e}, eval logits "
          f"{(ours[5] - eager[5]).abs().max().item():.3e}")  # fmt: skip
    _assert_same(ours, eager)


@pytest.mark.parametrize("name", ["convnext", "vit"])
@pytest.mark.parametrize("mode", ["enable", "replace"])
def test_pure_models_equal_eager_and_timms_own(name, mode, one_thread):
    eager = _train(name, "eager")
    theirs = _train(name, "torch")
    ours = _train(name, mode)
    assert ours[4] == 2 * SEGMENTS[name]
    _assert_same(theirs, eager)  # torch is right here
    _assert_same(ours, theirs)


def test_enable_is_per_model_and_disable_restores():
    import torch.utils.checkpoint as tcp

    torch_fn = tcp.checkpoint
    ours, other = _resnet(), _resnet()
    ours.train()
    other.train()
    tr_timm.enable(ours, replay_engine="snapshot")
    other.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32, 32)
    with collect_transactions() as txns:
        ours(x).sum().backward()
    assert [t.engine for t in txns] == ["snapshot"] * SEGMENTS["resnet"]
    assert tcp.checkpoint is torch_fn  # only during ours' forward
    with collect_transactions() as txns:
        other(x).sum().backward()  # timm's own checkpointing: torch's
    assert txns == []
    assert tr_timm.enabled(ours) and "forward" in vars(ours)
    tr_timm.disable(ours)
    assert not tr_timm.enabled(ours)
    assert "forward" not in vars(ours) and "forward_features" not in vars(ours)
    assert not ours.grad_checkpointing
    with collect_transactions() as txns:
        ours(x).sum().backward()
    assert txns == []


def test_enable_forward_features_and_options():
    model = _vit()
    model.train()
    tr_timm.enable(model, replay_state=None)
    with collect_transactions() as txns:
        model.forward_features(torch.randn(2, 3, 32, 32)).sum().backward()
    assert len(txns) == SEGMENTS["vit"]
    tr_timm.enable(model, replay_engine="journal")  # again: new options
    with collect_transactions() as txns:
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert {t.engine for t in txns} == {"journal"}


def test_enable_clear_errors():
    with pytest.raises(ValueError, match="set_grad_checkpointing"):
        tr_timm.enable(torch.nn.Linear(2, 2))
    model = _resnet()
    with pytest.raises(ValueError, match="'module'"):
        tr_timm.enable(model, replay_state="layer")
    with pytest.raises(ValueError, match="replay_engine= must be one of"):
        tr_timm.enable(model, replay_engine="bogus")
    assert not model.grad_checkpointing and not tr_timm.enabled(model)


def test_a_timm_that_stops_calling_torchs_checkpoint_warns_once(monkeypatch):
    """If timm's checkpoint_seq stopped reaching torch.utils.checkpoint, the first
    training forward says so instead of leaving torch's (or no) checkpoint silently."""
    from timm.models import resnet as timm_resnet

    monkeypatch.setattr(timm_resnet, "checkpoint_seq", lambda fns, x, **kw: _chain(fns, x))
    model = _resnet()
    model.train()
    tr_timm.enable(model)
    x = torch.randn(2, 3, 32, 32)
    with pytest.warns(UserWarning, match="made no call of torch.utils.checkpoint"):
        model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x)  # once


def _chain(fns, x):
    for stage in fns:
        x = stage(x)
    return x
