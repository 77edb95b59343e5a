"""The Lightning and accelerate recipes of docs/integrations.md, run as written (tiny
model, CPU, two steps): wrap with tr.apply_activation_checkpointing in
``configure_model`` / before ``prepare()``, their own checkpointing left off. The
reference is the same training without checkpointing (eager); torch's wrapper in the
same place is shown to differ (BatchNorm statistics updated twice)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as torch_apply,
)

import torch_replay as tr
from tests.reference import assert_bitwise

L = pytest.importorskip("lightning", reason="lightning is a test dependency")
accelerate = pytest.importorskip("accelerate", reason="accelerate is a test dependency")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.lin(x)))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(8, 1))


def _data():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 1, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


APPLY = {
    "tr": lambda m: tr.apply_activation_checkpointing(m, check_fn=lambda s: isinstance(s, Block)),
    "torch": lambda m: torch_apply(m, check_fn=lambda s: isinstance(s, Block)),
    "eager": lambda m: None,
}


# ----------------------------------------------------------------------- Lightning


class LitModel(L.LightningModule):
    def __init__(self, how: str = "tr"):
        super().__init__()
        self.net = _net()
        self.how = how

    def configure_model(self):
        # The recipe: checkpoint the blocks here (Lightning calls it once, before
        # the strategy sets the model up); leave the strategy's own
        # activation_checkpointing_policy unset.
        APPLY[self.how](self.net)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _lightning(how):
    model = LitModel(how)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, _data())
    return [t.detach().clone() for t in model.state_dict().values()], model


def test_lightning_recipe_trains_as_eager():
    eager, _ = _lightning("eager")
    torch_wrapped, _ = _lightning("torch")
    ours, model = _lightning("tr")
    assert type(model.net[0]).__name__ == "ReplayCheckpointWrapper"
    assert not all(torch.equal(a, b) for a, b in zip(torch_wrapped, eager, strict=True))
    assert_bitwise(ours, eager)


# ---------------------------------------------------------------------- accelerate


def _accelerate(how):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = _net()
    APPLY[how](model)  # the recipe: wrap before prepare(); no FSDP plugin checkpointing
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, _data())
    model.train()
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    return [t.detach().clone() for t in accelerator.unwrap_model(model).state_dict().values()]


def test_accelerate_recipe_trains_as_eager():
    eager = _accelerate("eager")
    torch_wrapped = _accelerate("torch")
    ours = _accelerate("tr")
    assert not all(torch.equal(a, b) for a, b in zip(torch_wrapped, eager, strict=True))
    assert_bitwise(ours, eager)


def test_lightning_fsdp_strategy_recognises_the_wrapper():
    """Lightning's FSDP strategy (lightning.fabric.strategies.fsdp.
    _setup_activation_checkpointing) skips its own checkpointing when the model holds
    CheckpointWrapper modules: torch_replay's wrappers are recognised, not wrapped again."""
    from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing

    model = _net()
    APPLY["tr"](model)
    with pytest.warns(UserWarning, match="already contains checkpointed layers"):
        _setup_activation_checkpointing(model, {"check_fn": lambda m: isinstance(m, Block)})
    assert type(model[0]).__name__ == "ReplayCheckpointWrapper"
    assert isinstance(model[0]._checkpoint_wrapped_module, Block)
