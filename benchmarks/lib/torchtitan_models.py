"""torchtitan's own trainer path, minus the data and the accelerator: what the torchtitan
tests (tests/torchtitan_jobs.py) and ``bench_stacks``' torchtitan rows build in each
spawned process of a gloo process group.

``Trainer.__init__`` (torchtitan 0.3) does, in order: ``apply_overrides(config.override,
config)``, ``model_spec.model.update_from_config``, ``build()``, the model's
``parallelize_fn`` (activation checkpointing from ``config.activation_checkpoint``, then
torchtitan's FSDP2 ``fully_shard``), ``init_weights``, ``config.optimizer.build`` and
``model_spec.post_optimizer_build_fn`` (DeepSeek-V3: ``register_moe_load_balancing_hook``).
:func:`build` does the same calls on the config registry's debug config; :func:`train_step`
is one optimizer step. What differs from the Trainer, and why:

- torchtitan falls back to device ``"cuda"`` when torch finds no accelerator
  (``torchtitan.tools.utils.get_device_info``); here it is told ``"cpu"`` while it is
  imported, so its device mesh and FSDP2 run on the CPU over gloo (the Trainer itself
  cannot start without CUDA: it calls ``torch.cuda.set_device``).
- ``parallelism.spmd_backend="partial_dtensor"`` (FSDP2 ``fully_shard`` on plain
  parameters, DTensor for model-parallel axes only): the default ``"spmd_types"`` asks
  torch 2.13's ``fully_shard`` for ``dp_mesh_dims``, which then refuses the parameters
  torchtitan left plain ("all parameters must be DTensors on the full SPMD mesh").
- FSDP reduces with a plain sum (``set_force_sum_reduction_for_comms``): torchtitan sets
  a gradient divide factor of 1.0, which FSDP turns into NCCL's ``PREMUL_SUM``, and gloo
  has none. The gradients are the same sums.
- The layers' inner attention is torchtitan's ``ScaledDotProductAttention`` (causal):
  FlexAttention has no backward on the CPU, varlen attention needs CUDA.
- Three layers of the debug model (DeepSeek-V3: one dense, two MoE with load
  balancing), float32, 2 x 16 random tokens per rank and step, the registry's AdamW.

torchtitan is not in the project's environment: scripts/setup.sh installs it and what it
imports (triton among them) into a folder of their own (:func:`site`), which only the
processes that run torchtitan put on ``sys.path`` (:func:`import_torchtitan`), so that the
rest of the suite never imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch

__all__ = [
    "SITE_ENV",
    "TitanModel",
    "build",
    "import_torchtitan",
    "missing",
    "site",
    "train_step",
]

SITE_ENV = "TORCH_REPLAY_TORCHTITAN_SITE"
"""The environment variable that names another folder for torchtitan (:func:`site`)."""

_INSTALL = (
    "torchtitan 0.3.0 and what it imports are installed by scripts/setup.sh "
    "(requirements-torchtitan.txt, --no-deps, into .venv/torchtitan-site; "
    f"or set {SITE_ENV})"
)


def site() -> str:
    """Where scripts/setup.sh installs torchtitan and the packages it imports."""
    return os.environ.get(SITE_ENV) or os.path.join(sys.prefix, "torchtitan-site")


def missing() -> str | None:
    """Why torchtitan cannot run here (a package missing from :func:`site`, and how to
    install it), or None."""
    for package in ("torchtitan", "triton", "tyro", "spmd_types"):
        if not os.path.isdir(os.path.join(site(), package)):
            return f"{package} is not in {site()}: {_INSTALL}"
    return None


def import_torchtitan() -> None:
    """Imports torchtitan from :func:`site` with ``"cpu"`` as its device (module
    docstring)."""
    import torch._utils

    if site() not in sys.path:
        sys.path.insert(0, site())
    found = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: found() or "cpu"
    try:
        import torchtitan.tools.utils  # noqa: F401  (reads the device type once)
        import torchtitan.trainer  # noqa: F401
    finally:
        torch._utils._get_available_device_type = found


def _config(model: str, ac: str):
    """The registry's debug config with activation checkpointing ``ac``: ``none``,
    torchtitan's ``full`` / ``selective``, or the same with torch_replay's one line
    (``tr-full``, ``tr-selective``)."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention

    if model == "deepseek_v3":
        from torchtitan.models.deepseek_v3.config_registry import (
            deepseek_v3_debugmodel as registry,
        )
    else:
        from torchtitan.models.llama3.config_registry import llama3_debugmodel as registry
    config = registry()
    spec = config.model_spec.model
    spec.layers = spec.layers[:3]
    for layer in spec.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config.training.seq_len = 16
    config.training.local_batch_size = 2
    config.training.mixed_precision_param = "float32"
    config.parallelism.spmd_backend = "partial_dtensor"
    config.activation_checkpoint = {
        "none": None,
        "full": FullAC.Config(),
        "selective": SelectiveAC.Config(),
        "tr-full": FullAC.Config(),
        "tr-selective": SelectiveAC.Config(),
    }[ac]
    if ac.startswith("tr-"):
        # the one line (--override.imports on the command line)
        config.override.imports.append("torch_replay.integrations.torchtitan.replay_ac")
    return config


@dataclass(kw_only=True, slots=True)
class TitanModel:
    """A torchtitan model as its Trainer builds it, with what a training step needs."""

    net: torch.nn.Module
    """The parallelized model (FSDP2 over the process group's ranks)."""
    optimizers: object
    """torchtitan's optimizers container (``step()``, ``zero_grad()``), its hooks
    registered (DeepSeek-V3: load balancing)."""
    vocab: int
    """The model's vocabulary size (for random tokens)."""


def build(model: str, ac: str, world: int, *, enable: bool = False) -> TitanModel:
    """Trainer.__init__'s calls (module docstring) in this process of a gloo group.

    Args:
        model: ``"llama3"`` (dense) or ``"deepseek_v3"`` (MoE with load balancing).
        ac: ``none``, ``full``, ``selective``, ``tr-full`` or ``tr-selective``
            (:func:`_config`).
        world: The process group's size.
        enable: Run ``parallelize_fn`` inside ``torch_replay.integrations.torchtitan
            .enable()`` (code that builds torchtitan's policies itself).

    Returns:
        The model, initialized from seed 0, in training mode, and its optimizers.
    """
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import apply_overrides
    from torchtitan.distributed import ParallelDims

    from torch_replay.integrations import torchtitan as tr_titan

    config = _config(model, ac)
    if config.override.imports:
        apply_overrides(config.override, config)
    parallel_dims = ParallelDims.from_config(config.parallelism, world)
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    torch.manual_seed(0)
    with torch.device("meta"):
        net = spec.model.build()
    context = tr_titan.enable() if enable else contextlib.nullcontext()
    with context:
        net = spec.parallelize_fn(
            net,
            parallel_dims=parallel_dims,
            training=config.training,
            parallelism=config.parallelism,
            compile_config=config.compile,
            ac_config=config.activation_checkpoint,
            dump_folder="",
        )
    for m in net.modules():  # gloo has no PREMUL_SUM (module docstring)
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    net.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        net.init_weights(buffer_device=None)
    net.train()
    optimizers = config.optimizer.build(model_parts=[net])
    if spec.post_optimizer_build_fn is not None:
        spec.post_optimizer_build_fn(optimizers, [net], parallel_dims)
    return TitanModel(net=net, optimizers=optimizers, vocab=spec.model.vocab_size)


def train_step(model: TitanModel, tokens: torch.Tensor, before_step=None) -> torch.Tensor:
    """One optimizer step on ``tokens`` (batch x (sequence + 1)): next-token
    cross-entropy, backward, ``before_step(model)`` if given (the gradients are there),
    the optimizers' step (its hooks: load balancing) and ``zero_grad``. Returns the loss,
    detached."""
    logits = model.net(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    if before_step is not None:
        before_step(model)
    model.optimizers.step()
    model.optimizers.zero_grad()
    return loss.detach()
