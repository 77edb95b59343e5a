"""One row per training stack of docs/integrations.md for ``bench_stacks``: the stack's own
loop (``Trainer.train()``, ``SFTTrainer``, PEFT in the ``Trainer``, Lightning's
``Trainer.fit`` with DDP and with ``ModelParallelStrategy``, accelerate's prepared loop
with DDP and with its FSDP2 plugin, torchtitan's Llama 3 and DeepSeek-V3 as its Trainer
builds them, FSDP2 called from the root, a ``torch.compile``'d model, ``save_on_cpu``,
timm's ResNet) run three ways:

    eager   no checkpointing
    stack   the stack's own checkpointing (torch.utils.checkpoint underneath; where the
            stack has none, torch's wrapper in the recipe's place)
    tr      torch_replay turned on with the stack's one line (docs/integrations.md)

A row's :class:`Runner` is built once per mode and runs ``steps(k)`` training steps
(forward, backward, optimizer step) in the stack's loop, returning each step's seconds;
``state()`` gives the losses, parameters and buffers after them (of a sharded model, this
rank's shards). The models are small but big enough that a step is not all Python
overhead; BatchNorm blocks where the stack's models have such state (there torch's
checkpointing updates the statistics twice). The distributed rows run in the processes of
one gloo group (``ranks``), set up as the tests set them up
(benchmarks/lib/distributed_stacks.py, benchmarks/lib/torchtitan_models.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as torch_apply,
)

import torch_replay as tr
from benchmarks.lib.distributed_stacks import (
    accelerator,
    as_torchrun,
    lightning_module,
    lightning_trainer,
    shard,
)
from benchmarks.lib.hf_stacks import VOCAB, build_hf
from benchmarks.lib.torchtitan_models import build, import_torchtitan, train_step
from benchmarks.lib.torchtitan_models import missing as titan_missing
from torch_replay.integrations import transformers as tr_hf

MODES = ("eager", "stack", "tr")


@dataclass
class Runner:
    """A model in a stack's loop; ``run(k)`` trains ``k`` steps and returns their seconds."""

    model: nn.Module
    run: Callable[[int], list[float]]
    losses: list[float] = field(default_factory=list)

    def steps(self, k: int) -> list[float]:
        return self.run(k)

    def state(self) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
        local = [_local(t.detach()) for t in (*self.model.parameters(), *self.model.buffers())]
        n = len(list(self.model.parameters()))
        return list(self.losses), local[:n], local[n:]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``; of a sharded (DTensor) parameter, this rank's shard."""
    return (t.to_local() if hasattr(t, "to_local") else t).clone()


# ------------------------------------------------------------------ models


class NormBlock(nn.Module):
    """Linear, BatchNorm (statistics written in the forward), dropout: a residual block."""

    def __init__(self, width: int):
        super().__init__()
        self.lin, self.norm, self.drop = (
            nn.Linear(width, width),
            nn.BatchNorm1d(width),
            nn.Dropout(0.1),
        )

    def forward(self, x):
        return x + self.drop(torch.tanh(self.norm(self.lin(x))))


WIDTH, BATCH, BLOCKS = 256, 64, 4


def norm_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(NormBlock(WIDTH) for _ in range(BLOCKS)), nn.Linear(WIDTH, 1))


def norm_batches(n: int, rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1 + rank)
    return [(torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, 1, generator=gen))
            for _ in range(n)]  # fmt: skip


def wrap_blocks(model: nn.Module, mode: str) -> None:
    pick = {"check_fn": lambda m: isinstance(m, NormBlock)}
    if mode == "stack":
        torch_apply(model, **pick)
    elif mode == "tr":
        tr.apply_activation_checkpointing(model, **pick)


def plain_loop(model: nn.Module, batches, losses: list[float], around=None, opt=None,
               backward=None) -> Runner:  # fmt: skip
    """SGD (or ``opt``) over ``batches`` (cycled), each step timed; ``around`` a context
    per step, ``backward`` the loss's backward (accelerate's)."""
    opt = opt if opt is not None else torch.optim.SGD(model.parameters(), lr=0.05)
    backward = backward if backward is not None else torch.Tensor.backward
    position = [0]

    def run(k: int) -> list[float]:
        times = []
        for _ in range(k):
            x, y = batches[position[0] % len(batches)]
            position[0] += 1
            t0 = time.process_time()
            with around() if around is not None else contextlib.nullcontext():
                loss = (model(x) - y).pow(2).mean()
                backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.process_time() - t0)
            losses.append(loss.item())
        return times

    return Runner(model, run, losses)


# ------------------------------------------------------------------ Hugging Face

HF_LAYERS, HF_HIDDEN, HF_SEQ = 4, 128, 128


def _hf_rows(n: int = 8) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(11)
    return [{"input_ids": (ids := torch.randint(0, VOCAB, (HF_SEQ,), generator=gen)), "labels": ids}
            for _ in range(n)]  # fmt: skip


def _step_clock():
    import transformers

    class Clock(transformers.TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.process_time() - self.t0)

    return Clock()


def _hf_args(tmp: str, k: int, mode: str, config_class=None, **extra):
    import transformers

    cls = config_class or transformers.TrainingArguments
    return cls(
        output_dir=tmp, max_steps=k, per_device_train_batch_size=2, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=mode != "eager",
        **extra,
    )  # fmt: skip


def hf_trainer(mode: str, tmp: str, lora: bool = False) -> Runner:
    import transformers

    model = build_hf("llama", layers=HF_LAYERS, hidden=HF_HIDDEN)
    if lora:
        import peft

        model = peft.get_peft_model(
            model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
        )
    if mode == "tr":
        tr_hf.enable(model)
    runner = Runner(model, lambda k: [])

    def run(k: int) -> list[float]:
        clock = _step_clock()
        trainer = transformers.Trainer(
            model=model, args=_hf_args(tmp, k, mode), train_dataset=_hf_rows(), callbacks=[clock]
        )
        runner.losses.append(trainer.train().training_loss)
        return clock.times

    runner.run = run
    return runner


def trl_sft(mode: str, tmp: str) -> Runner:
    import datasets
    import tokenizers
    import transformers
    import trl
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(WordLevel(vocab, unk_token="t0")),
        pad_token="t0", eos_token="t1",
    )  # fmt: skip
    rows = datasets.Dataset.from_list([{"input_ids": r["input_ids"].tolist()} for r in _hf_rows()])
    model = build_hf("llama", layers=HF_LAYERS, hidden=HF_HIDDEN)
    if mode == "tr":
        tr_hf.enable(model)
    runner = Runner(model, lambda k: [])

    def run(k: int) -> list[float]:
        clock = _step_clock()
        args = _hf_args(tmp, k, mode, trl.SFTConfig, bf16=False)
        trainer = trl.SFTTrainer(
            model=model, args=args, train_dataset=rows, processing_class=tokenizer,
            callbacks=[clock],
        )  # fmt: skip
        runner.losses.append(trainer.train().training_loss)
        return clock.times

    runner.run = run
    return runner


# ------------------------------------------------------------------ Lightning, accelerate


def _is_norm_block(m: nn.Module) -> bool:
    return isinstance(m, NormBlock)


def _not_head(m: nn.Module) -> bool:
    """A block of :func:`norm_net` (wrapped or not), not its last ``Linear``."""
    return not isinstance(m, nn.Linear)


def lightning_fit(mode: str, tmp: str, rank: int = 0, strategy: str = "ddp") -> Runner:
    """Lightning's ``Trainer.fit`` on the process group: ``strategy="ddp"``, or
    ``"model-parallel"`` (``ModelParallelStrategy``: the blocks sharded with FSDP2 in
    ``configure_model``, after the wrapping). Lightning has no checkpointing of its own:
    its "own" is torch's wrapper in the recipe's place."""
    import lightning as L

    def configure(lit) -> None:  # each fit calls it: wrap (and shard) once
        if getattr(lit, "configured", False):
            return
        wrap_blocks(lit.net, mode)
        if strategy == "model-parallel":
            shard(lit.net, _not_head, mesh=lit.device_mesh["data_parallel"])
        lit.configured = True

    class Clock(L.Callback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_train_batch_start(self, *args):
            self.t0 = time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, *args):
            self.times.append(time.process_time() - self.t0)
            runner.losses.append(float(outputs["loss"]))

    as_torchrun(rank, torch.distributed.get_world_size())
    loss = lambda net, batch: (net(batch[0]) - batch[1]).pow(2).mean()  # noqa: E731
    lit = lightning_module(norm_net(), configure, loss)
    batches = norm_batches(8)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*(torch.cat(t) for t in zip(*batches, strict=True))),
        batch_size=BATCH,
    )  # each rank gets its half (Lightning's distributed sampler)
    runner = Runner(lit, lambda k: [])

    def run(k: int) -> list[float]:
        clock = Clock()
        trainer = lightning_trainer(
            torch.distributed.get_world_size(), strategy, k, callbacks=[clock],
            default_root_dir=tmp,
        )  # fmt: skip
        trainer.fit(lit, train_dataloaders=data)
        return clock.times

    runner.run = run
    return runner


def accelerate_loop(mode: str, tmp: str, rank: int = 0, fsdp2: bool = False) -> Runner:
    """accelerate's prepared loop on the process group: DDP (two CPU processes), or its
    FSDP2 plugin (``transformer_based_wrap`` on the blocks), whose own checkpointing is
    the plugin's ``activation_checkpointing=True``; torch_replay's recipe keeps that off
    and wraps before ``prepare``."""
    as_torchrun(rank, torch.distributed.get_world_size())
    plugin = None
    if fsdp2:
        plugin = {
            "activation_checkpointing": mode == "stack",
            "auto_wrap_policy": "transformer_based_wrap",
            "transformer_cls_names_to_wrap": [NormBlock.__name__],
        }
    acc = accelerator(fsdp2=plugin)
    model = norm_net()
    if not fsdp2 or mode != "stack":  # the plugin's own wraps in prepare()
        wrap_blocks(model, mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    return plain_loop(model, norm_batches(8, rank), [], opt=opt, backward=acc.backward)


# ------------------------------------------------------------------ torch alone


def compiled(mode: str, tmp: str) -> Runner:
    model = norm_net()
    wrap_blocks(model, mode)
    return plain_loop(torch.compile(model), norm_batches(8), [])


def offloaded(mode: str, tmp: str) -> Runner:
    model = norm_net()
    wrap_blocks(model, mode)
    return plain_loop(model, norm_batches(8), [], around=lambda: torch.autograd.graph.save_on_cpu())


def fsdp2_root(mode: str, tmp: str, rank: int = 0) -> Runner:
    model = norm_net()
    wrap_blocks(model, mode)
    shard(model, _not_head)
    return plain_loop(model, norm_batches(8, rank), [])


# ------------------------------------------------------------------ torchtitan


def torchtitan(mode: str, tmp: str, rank: int = 0, model: str = "llama3") -> Runner:
    """torchtitan's debug model as its Trainer builds it (FSDP2 over the group, its
    AdamW and hooks: benchmarks/lib/torchtitan_models.py); its own checkpointing is its
    full activation checkpointing config, torch_replay's the same config with the
    override line."""
    import_torchtitan()
    ac = {"eager": "none", "stack": "full", "tr": "tr-full"}[mode]
    titan = build(model, ac, torch.distributed.get_world_size())
    gen = torch.Generator().manual_seed(100 + rank)
    runner = Runner(titan.net, lambda k: [])

    def run(k: int) -> list[float]:
        times = []
        for _ in range(k):
            tokens = torch.randint(0, titan.vocab, (2, 17), generator=gen)
            t0 = time.process_time()
            loss = train_step(titan, tokens)
            times.append(time.process_time() - t0)
            runner.losses.append(loss.item())
        return times

    runner.run = run
    return runner


def timm_resnet(mode: str, tmp: str) -> Runner:
    import timm

    from torch_replay.integrations import timm as tr_timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10, pretrained=False)
    if mode == "stack":
        model.set_grad_checkpointing(True)
    elif mode == "tr":
        tr_timm.enable(model)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 64, 64, generator=gen), torch.randn(8, 10, generator=gen))
               for _ in range(4)]  # fmt: skip
    return plain_loop(model, batches, [])


def installed(module: str, why: str = "") -> Callable[[], str | None]:
    """A row's ``missing``: None where ``module`` imports in this environment, else why
    not (``why`` added)."""

    def missing() -> str | None:
        if importlib.util.find_spec(module) is not None:
            return None
        return f"{module} is not installed (torch {torch.__version__}){why}"

    return missing


@dataclass(frozen=True)
class Row:
    """A row of the table: the stack, its one line, its runner (``make(mode, tmp)``, with
    ``rank=`` when ``ranks`` > 1) and why it cannot run here (``missing()``, None when it
    can)."""

    stack: str
    line: str
    make: Callable[..., Runner]
    ranks: int = 1
    missing: Callable[[], str | None] = lambda: None


_TIMM = (
    ": timm imports torchvision, which must be built for this torch; "
    "scripts/timm_tests.sh makes such an environment (torch 2.14.1), and "
    "`--python timm=ENV/bin/python --source timm=SRC` runs this row there"
)
ROWS = {
    "hf-trainer": Row("HF `Trainer` (Llama, `gradient_checkpointing=True`)", "`tr_hf.enable(model)`",
                      hf_trainer, missing=installed("transformers")),
    "trl": Row("TRL `SFTTrainer` (Llama, its default checkpointing)", "`tr_hf.enable(model)`",
               trl_sft, missing=installed("trl")),
    "peft": Row("PEFT LoRA in the `Trainer` (Llama)", "`tr_hf.enable(model)`",
                lambda mode, tmp: hf_trainer(mode, tmp, lora=True), missing=installed("peft")),
    "lightning-ddp": Row(
        "Lightning DDP (`strategy=\"ddp\"`, `Trainer.fit`), 2 gloo processes (BatchNorm blocks)",
        "`tr.apply_activation_checkpointing` in `configure_model`", lightning_fit, ranks=2,
        missing=installed("lightning")),
    "lightning-model-parallel": Row(
        "Lightning `ModelParallelStrategy` (FSDP2, `Trainer.fit`), 2 gloo processes (BatchNorm "
        "blocks)", "`tr.apply_activation_checkpointing` in `configure_model`, then `fully_shard`",
        functools.partial(lightning_fit, strategy="model-parallel"), ranks=2,
        missing=installed("lightning")),
    "accelerate-ddp": Row("accelerate DDP, 2 gloo processes (BatchNorm blocks)",
                          "`tr.apply_activation_checkpointing` before `prepare`", accelerate_loop,
                          ranks=2, missing=installed("accelerate")),
    "accelerate-fsdp2": Row(
        "accelerate FSDP2 plugin, 2 gloo processes (BatchNorm blocks; its own: the plugin's "
        "`activation_checkpointing=True`)",
        "`tr.apply_activation_checkpointing` before `prepare`, the plugin's "
        "`activation_checkpointing=False`",
        functools.partial(accelerate_loop, fsdp2=True), ranks=2,
        missing=installed("accelerate")),
    "torchtitan-dense": Row(
        "torchtitan Llama 3 (dense, debug model, 3 layers), FSDP2 on 2 gloo processes (its own: "
        "full AC)", "`--override.imports torch_replay.integrations.torchtitan.replay_ac`",
        torchtitan, ranks=2, missing=titan_missing),
    "torchtitan-moe": Row(
        "torchtitan DeepSeek-V3 (MoE, load balancing, debug model, 3 layers), FSDP2 on 2 gloo "
        "processes (its own: full AC)",
        "`--override.imports torch_replay.integrations.torchtitan.replay_ac`",
        functools.partial(torchtitan, model="deepseek_v3"), ranks=2, missing=titan_missing),
    "fsdp2": Row("FSDP2 `fully_shard`, root called, 2 gloo processes (BatchNorm blocks)",
                 "`tr.apply_activation_checkpointing`, then `fully_shard` each block and the root",
                 fsdp2_root, ranks=2),
    "compile": Row("`torch.compile` of wrapped BatchNorm blocks",
                   "`tr.apply_activation_checkpointing`", compiled),
    "offload": Row("`save_on_cpu` around the step (BatchNorm blocks)",
                   "`tr.apply_activation_checkpointing`", offloaded),
    "timm": Row("timm ResNet-18 (`set_grad_checkpointing`)", "`tr_timm.enable(model)`",
                timm_resnet, missing=installed("timm", _TIMM)),
}  # fmt: skip
"""The rows, by name (``--rows``), in the table's order."""
