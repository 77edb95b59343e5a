"""One row per training stack of docs/integrations.md for ``bench_stacks``: the stack's own
loop (``Trainer.train()``, ``SFTTrainer``, PEFT in the ``Trainer``, Lightning's
``Trainer.fit``, accelerate's prepared loop, a ``torch.compile``'d model, ``save_on_cpu``,
FSDP2 called from the root and DDP with two gloo processes) run three ways:

    eager   no checkpointing
    stack   the stack's own checkpointing (torch.utils.checkpoint underneath)
    tr      torch_replay turned on with the stack's one line (docs/integrations.md)

A row's :class:`Runner` is built once per mode and runs ``steps(k)`` training steps
(forward, backward, optimizer step) in the stack's loop, returning each step's seconds;
``state()`` gives the losses, parameters and buffers after them. The models are small
but big enough that a step is not all Python overhead; BatchNorm blocks where the stack's
models have such state (there torch's checkpointing updates the statistics twice).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as torch_apply,
)

import torch_replay as tr
from benchmarks.lib.hf_stacks import VOCAB, build_hf
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


def lightning_fit(mode: str, tmp: str) -> Runner:
    import lightning as L

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = norm_net()

        def configure_model(self):  # each fit calls it: wrap once
            if not getattr(self, "wrapped", False):
                wrap_blocks(self.net, mode)
                self.wrapped = True

        def training_step(self, batch, _):
            x, y = batch
            return (self.net(x) - y).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Clock(L.Callback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_train_batch_start(self, *args):
            self.t0 = time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, *args):
            self.times.append(time.process_time() - self.t0)
            runner.losses.append(float(outputs["loss"]))

    lit = Lit()
    batches = norm_batches(8)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*(torch.cat(t) for t in zip(*batches, strict=True))),
        batch_size=BATCH,
    )
    runner = Runner(lit, lambda k: [])

    def run(k: int) -> list[float]:
        clock = Clock()
        trainer = L.Trainer(
            max_steps=k, accelerator="cpu", devices=1, logger=False, callbacks=[clock],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp,
        )  # fmt: skip
        trainer.fit(lit, train_dataloaders=data)  # an iterable of batches
        return clock.times

    runner.run = run
    return runner


def accelerate_loop(mode: str, tmp: str) -> Runner:
    import accelerate

    model = norm_net()
    wrap_blocks(model, mode)
    accelerator = accelerate.Accelerator(cpu=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    return plain_loop(model, norm_batches(8), [], opt=opt, backward=accelerator.backward)


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
    from torch.distributed.fsdp import fully_shard

    model = norm_net()
    wrap_blocks(model, mode)
    for block in model:
        if not isinstance(block, nn.Linear):
            fully_shard(block)
    fully_shard(model)
    return plain_loop(model, norm_batches(8, rank), [])


def ddp(mode: str, tmp: str, rank: int = 0) -> Runner:
    model = norm_net()
    wrap_blocks(model, mode)
    return plain_loop(nn.parallel.DistributedDataParallel(model), norm_batches(8, rank), [])


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


@dataclass(frozen=True)
class Row:
    stack: str
    line: str
    make: Callable[..., Runner]
    ranks: int = 1
    needs: str = ""


ROWS = {
    "hf-trainer": Row("HF `Trainer` (Llama, `gradient_checkpointing=True`)", "`tr_hf.enable(model)`",
                      hf_trainer, needs="transformers"),
    "trl": Row("TRL `SFTTrainer` (Llama, its default checkpointing)", "`tr_hf.enable(model)`",
               trl_sft, needs="trl"),
    "peft": Row("PEFT LoRA in the `Trainer` (Llama)", "`tr_hf.enable(model)`",
                lambda mode, tmp: hf_trainer(mode, tmp, lora=True), needs="peft"),
    "lightning": Row("Lightning `Trainer.fit` (BatchNorm blocks)",
                     "`tr.apply_activation_checkpointing` in `configure_model`", lightning_fit,
                     needs="lightning"),
    "accelerate": Row("accelerate (BatchNorm blocks)",
                      "`tr.apply_activation_checkpointing` before `prepare`", accelerate_loop,
                      needs="accelerate"),
    "compile": Row("`torch.compile` of wrapped BatchNorm blocks",
                   "`tr.apply_activation_checkpointing`", compiled),
    "offload": Row("`save_on_cpu` around the step (BatchNorm blocks)",
                   "`tr.apply_activation_checkpointing`", offloaded),
    "fsdp2": Row("FSDP2 `fully_shard`, root called, 2 gloo processes (BatchNorm blocks)",
                 "`tr.apply_activation_checkpointing`, then `fully_shard`", fsdp2_root, ranks=2),
    "ddp": Row("DDP, 2 gloo processes (BatchNorm blocks)",
               "`tr.apply_activation_checkpointing`", ddp, ranks=2),
    "timm": Row("timm ResNet-18 (`set_grad_checkpointing`)", "`tr_timm.enable(model)`",
                timm_resnet, needs="timm"),
}  # fmt: skip
