"""What the torchtitan tests run in each spawned process (tests/test_torchtitan.py):
torchtitan's own trainer path, minus the data and the accelerator.

``Trainer.__init__`` (torchtitan 0.3) does, in order: ``apply_overrides(config.override,
config)``, ``model_spec.model.update_from_config``, ``build()``, the model's
``parallelize_fn`` (activation checkpointing from ``config.activation_checkpoint``, then
torchtitan's FSDP2 ``fully_shard``), ``init_weights``, ``config.optimizer.build`` and
``model_spec.post_optimizer_build_fn`` (DeepSeek-V3: ``register_moe_load_balancing_hook``).
:func:`train` does the same calls on the config registry's debug config, then two
optimizer steps. What differs from the Trainer, and why:

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
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

import torch

SITE_ENV = "TORCH_REPLAY_TORCHTITAN_SITE"
PREFIX = "._checkpoint_wrapped_module"


def site() -> str:
    """Where scripts/setup.sh installs torchtitan and the packages it imports."""
    return os.environ.get(SITE_ENV) or os.path.join(sys.prefix, "torchtitan-site")


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


def _canonical(name: str) -> str:
    return name.replace(PREFIX, "")


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def train(model: str, ac: str, world: int, *, enable: bool = False) -> dict:
    """Trainer.__init__'s calls (module docstring), then two optimizer steps; returns
    the loss, every gradient, parameter and buffer (this rank's shards) by canonical
    name, and what each block is wrapped in."""
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
    from torch.distributed.fsdp import FSDPModule

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
    rank = torch.distributed.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    vocab = spec.model.vocab_size
    losses, grads = [], []
    for _ in range(2):
        tokens = torch.randint(0, vocab, (2, 17), generator=gen)
        logits = net(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), tokens[:, 1:].flatten()
        )
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append({_canonical(n): _local(p.grad) for n, p in net.named_parameters()})
        optimizers.step()
        optimizers.zero_grad()
    return {
        "loss": losses,
        "grads": grads,
        "params": {_canonical(n): _local(p) for n, p in net.named_parameters()},
        "buffers": {_canonical(n): _local(b) for n, b in net.named_buffers()},
        "wrappers": [_wrapper_kind(b) for b in net.layers.values()],
        "impl": [str(getattr(b, "checkpoint_impl", None)) for b in net.layers.values()],
    }


def _wrapper_kind(block: torch.nn.Module) -> str:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from torch_replay.wrapper import ReplayCheckpointWrapper

    if isinstance(block, ReplayCheckpointWrapper):
        return "torch_replay"
    return "torch" if isinstance(block, CheckpointWrapper) else "none"


RUNS = {
    # DeepSeek-V3: MoE with auxiliary-loss-free load balancing (token counts, expert bias)
    "dsv3-eager": ("deepseek_v3", "none", False),
    "dsv3-full": ("deepseek_v3", "full", False),
    "dsv3-selective": ("deepseek_v3", "selective", False),
    "dsv3-tr-full": ("deepseek_v3", "tr-full", False),
    "dsv3-tr-selective": ("deepseek_v3", "tr-selective", False),
    "dsv3-enable-full": ("deepseek_v3", "full", True),
    # Llama 3: dense, stateless blocks (torch's checkpoint is right there)
    "llama3-eager": ("llama3", "none", False),
    "llama3-full": ("llama3", "full", False),
    "llama3-tr-full": ("llama3", "tr-full", False),
}


def refusals() -> dict:
    """What ``replay_ac`` refuses, what it makes of a full config, and ``enable()``
    blocks nested and ended."""
    from dataclasses import dataclass

    from torchtitan.distributed import activation_checkpoint as ac

    from torch_replay.integrations import torchtitan as tr_titan

    class MySAC(ac.SelectiveAC):
        @dataclass(kw_only=True, slots=True)
        class Config(ac.SelectiveAC.Config):
            pass

    out = {}
    for key, config, kwargs in (
        ("memory", ac.MemoryBudgetAC.Config(), {}),
        ("subclass", MySAC.Config(), {}),
        ("engine", ac.FullAC.Config(), {"replay_engine": "nope"}),
    ):
        try:
            tr_titan.replay_ac(config, **kwargs)
            out[key] = "no error"
        except Exception as e:
            out[key] = f"{type(e).__name__}: {e}"
    full = tr_titan.replay_ac(ac.FullAC.Config(debug=True), replay_engine="journal")
    out["full"] = f"{type(full).__qualname__} {full.replay_engine} {full.debug}"
    original = ac.ptd_checkpoint_wrapper
    with tr_titan.enable():
        inside = ac.ptd_checkpoint_wrapper is not original
        with tr_titan.enable(replay_engine="journal"):
            inside = inside and ac.ptd_checkpoint_wrapper.torch_replay_engine == "journal"
        inside = inside and ac.ptd_checkpoint_wrapper.torch_replay_engine == "auto"
    out["restored"] = inside and ac.ptd_checkpoint_wrapper is original and not tr_titan.enabled()
    return out


def every_run(rank: int) -> dict:
    """Every run of :data:`RUNS` on this rank (2 ranks: torchtitan's FSDP2 over them),
    each run's failure kept to itself."""
    torch.set_num_threads(1)
    import_torchtitan()
    world = torch.distributed.get_world_size()
    out = {}
    for name, (model, ac, enable) in RUNS.items():
        try:
            out[name] = train(model, ac, world, enable=enable)
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    for name, job in (("refusals", refusals), ("documented", documented)):
        try:
            out[name] = job()
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    return out


def documented() -> dict:
    """Every documented name under ``torch_replay.integrations.torchtitan``, resolved
    (tests/test_documented_imports.py leaves them to this process, where torchtitan is
    importable): the names that did not resolve, with why."""
    from .test_documented_imports import ELSEWHERE, NAMES, resolve

    (module,) = ELSEWHERE
    names = sorted(n for n in NAMES if n == module or n.startswith(module + "."))
    failed = {}
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            failed[name] = repr(exc)
    return {"names": names, "failed": failed}
