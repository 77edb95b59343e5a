"""What the torchtitan tests run in each spawned process (tests/test_torchtitan.py):
torchtitan's own trainer path, minus the data and the accelerator, as
benchmarks/lib/torchtitan_models.py builds it (what differs from torchtitan's Trainer, and
why, is said there), then two optimizer steps, every gradient kept.
"""

from __future__ import annotations

import traceback

import torch

from benchmarks.lib.torchtitan_models import build, import_torchtitan, train_step

PREFIX = "._checkpoint_wrapped_module"


def _canonical(name: str) -> str:
    return name.replace(PREFIX, "")


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def train(model: str, ac: str, world: int, *, enable: bool = False) -> dict:
    """:func:`build`, then two optimizer steps; returns the loss, every gradient,
    parameter and buffer (this rank's shards) by canonical name, and what each block is
    wrapped in."""
    titan = build(model, ac, world, enable=enable)
    net = titan.net
    rank = torch.distributed.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    losses, grads = [], []
    keep = lambda t: grads.append(  # noqa: E731
        {_canonical(n): _local(p.grad) for n, p in t.net.named_parameters()}
    )
    for _ in range(2):
        tokens = torch.randint(0, titan.vocab, (2, 17), generator=gen)
        losses.append(train_step(titan, tokens, before_step=keep).clone())
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
