"""Lightning and accelerate in CPU processes that already share a gloo process group (the
spawned workers of tests/test_distributed.py and of ``bench_stacks``' two-process rows):
what both build, so that the tests and the benchmark run the same loops.

A worker first calls :func:`as_torchrun`: with the variables torchrun sets, Lightning
joins the group already initialized and launches nothing, and accelerate's state finds
several CPU processes (``MULTI_CPU``: DDP). Lightning's module is :func:`lightning_module`
(the model's blocks wrapped, and sharded, in ``configure_model``), its trainer
:func:`lightning_trainer` (``strategy="ddp"`` or ``ModelParallelStrategy``, FSDP2 over its
device mesh). accelerate's :func:`accelerator` is a fresh ``Accelerator(cpu=True)``, with
the FSDP2 plugin when asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

__all__ = ["accelerator", "as_torchrun", "lightning_module", "lightning_trainer", "shard"]


def as_torchrun(rank: int, world: int) -> None:
    """Sets the variables torchrun sets for process ``rank`` of ``world`` on one node."""
    os.environ.update(
        LOCAL_RANK=str(rank), RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip


def shard(
    model: torch.nn.Module,
    is_block: Callable[[torch.nn.Module], bool] | None = None,
    mesh=None,
) -> None:
    """FSDP2 as the README's recipe: ``fully_shard`` each child of ``model`` (or each that
    ``is_block`` picks, as it is then: a checkpoint wrapper once wrapped), then the root,
    over ``mesh`` (default: the whole group)."""
    from torch.distributed.fsdp import fully_shard

    for child in model.children():
        if is_block is None or is_block(child):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)


def lightning_module(
    net: torch.nn.Module,
    configure: Callable[[object], None],
    loss: Callable[[torch.nn.Module, object], torch.Tensor],
    lr: float = 0.05,
):
    """A ``LightningModule`` holding ``net`` as ``.net``, trained with SGD.

    Args:
        net: The model.
        configure: Its ``configure_model`` hook, given the module (its ``net`` and, under
            ``ModelParallelStrategy``, its ``device_mesh``); Lightning calls it at the
            start of every ``fit``.
        loss: ``loss(net, batch)``, the training step's loss.
        lr: SGD's learning rate.
    """
    import lightning as L

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def configure_model(self):
            configure(self)

        def training_step(self, batch, batch_idx):
            return loss(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    return Lit()


def lightning_trainer(world: int, strategy: str, max_steps: int, **options):
    """A Lightning ``Trainer`` on ``world`` CPU processes, nothing logged or saved.

    Args:
        world: The process group's size (the trainer's ``devices``).
        strategy: ``"ddp"``, or ``"model-parallel"`` (``ModelParallelStrategy``, data
            parallel over every process: FSDP2 in ``configure_model``).
        max_steps: Optimizer steps of each ``fit``.
        options: More ``Trainer`` keywords (``callbacks``, ``default_root_dir``).
    """
    import lightning as L

    if strategy == "model-parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
    return L.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_steps=max_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **options,
    )  # fmt: skip


def accelerator(fsdp2: dict | None = None):
    """A fresh ``Accelerator(cpu=True)`` (accelerate's shared state reset first): DDP over
    the group's processes, or with ``fsdp2`` (``FullyShardedDataParallelPlugin`` keywords
    beside ``fsdp_version=2``) accelerate's FSDP2 path.

    accelerate selects FSDP only on accelerator devices (``AcceleratorState`` picks
    ``MULTI_CPU`` on CPU and ignores the plugin), so with ``fsdp2`` the state's
    ``distributed_type`` is set to FSDP after the ``Accelerator`` is built; ``prepare``
    then runs its own FSDP2 path (``fsdp2_apply_ac``, ``fsdp2_prepare_model``).
    """
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    AcceleratorState._reset_state(True)
    plugin = None if fsdp2 is None else FullyShardedDataParallelPlugin(fsdp_version=2, **fsdp2)
    acc = Accelerator(cpu=True)
    if plugin is not None:
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
    return acc
