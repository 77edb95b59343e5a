"""torch_replay.integrations.transformers on tiny models built from their configs (no
downloads). References: transformers' own checkpointing (torch.utils.checkpoint through
``activation_checkpointing_enable``) where torch is right, bitwise (loss and every
gradient, dropout on, same seed); eager (no checkpointing) where torch is wrong: a
DeepSeek-V3 router bias moved before backward, Wav2Vec2-Conformer's BatchNorm."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

import torch_replay as tr  # noqa: E402
from benchmarks.lib.hf_stacks import (  # noqa: E402
    VOCAB,
    build_hf,
    hf_loss,
    hf_step,
    hf_turn_on,
    move_router_bias,
)
from tests.reference import assert_bitwise  # noqa: E402
from torch_replay._replay.segment import collect_transactions  # noqa: E402
from torch_replay.integrations import transformers as tr_hf  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "mixtral"])
@pytest.mark.parametrize(
    "options",
    [{}, {"use_reentrant": True}, {"every_n_layers": 2}],
    ids=["plain", "reentrant", "every2"],
)
def test_bitwise_transformers_own_checkpointing(name, options, one_thread):
    # (one intra-op thread: a bitwise comparison must not depend on how the threads of
    # a reduction were scheduled; GPT-2's case differed once in a run on a loaded machine)
    l_t, g_t, b_t, _ = hf_step(name, "torch", **options)
    l_r, g_r, b_r, segments = hf_step(name, "tr", **options)
    assert segments == 4 // options.get("every_n_layers", 1)  # torch_replay ran each layer
    assert torch.equal(l_r, l_t)
    assert_bitwise(g_r, g_t)
    assert_bitwise(b_r, b_t)


def _max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True) if x is not None)


def test_deepseek_v3_router_bias_moved_before_backward_is_eager():
    l_e, g_e, b_e, _ = hf_step("deepseek_v3", "none", between=move_router_bias)
    _, g_t, _, _ = hf_step("deepseek_v3", "torch", between=move_router_bias)
    l_r, g_r, b_r, _ = hf_step("deepseek_v3", "tr", between=move_router_bias)
    assert _max_diff(g_t, g_e) > 1e-3  # torch re-routes with the new bias, silently
    assert torch.equal(l_r, l_e)
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)  # the moved bias stays moved


def test_wav2vec2_conformer_batchnorm_updated_once():
    l_e, g_e, b_e, _ = hf_step("conformer", "none")
    _, _, b_t, _ = hf_step("conformer", "torch")
    l_r, g_r, b_r, _ = hf_step("conformer", "tr")
    assert not all(torch.equal(a, b) for a, b in zip(b_t, b_e, strict=True))  # torch: twice
    assert torch.equal(l_r, l_e)
    assert_bitwise(g_r, g_e)
    assert_bitwise(b_r, b_e)


def test_offload_frees_the_layer_inputs_as_transformers(monkeypatch):
    """offload=True: each checkpointed layer's input is packed to a host copy, so the
    activation between layers is freed, as with transformers' offload=True. (With no
    accelerator, transformers pins on the CPU, which raises; an accelerator type is
    given instead, whose save_on_cpu copies without pinning here.)"""
    from transformers import modeling_utils

    monkeypatch.setattr(modeling_utils, "get_current_accelerator", lambda: torch.device("cuda"))
    freed = {}
    for mode in ("torch", "tr"):
        model = build_hf("llama")
        model.train()
        hf_turn_on(model, mode, offload=True)
        refs = []
        hook = model.model.layers[1].register_forward_pre_hook(
            lambda m, args, kw, refs=refs: refs.append(weakref.ref(args[0])), with_kwargs=True
        )
        torch.manual_seed(5)
        loss = hf_loss(model, "llama")
        gc.collect()
        freed[mode] = [r() is None for r in refs]
        hook.remove()
        loss.backward()
        freed[mode + "-grads"] = [p.grad for p in model.parameters()]
    assert freed["torch"] == freed["tr"] == [True]
    assert_bitwise(freed["tr-grads"], freed["torch-grads"])


def test_disable_and_layer_options():
    model = build_hf("llama")
    tr_hf.enable(model, every_n_layers=2, replay_engine="snapshot")
    layers = tr_hf.layers(model)
    assert [m.gradient_checkpointing for m in layers] == [True, False, True, False]
    fn = layers[0]._gradient_checkpointing_func
    assert fn.func is tr.checkpoint
    assert fn.keywords["replay_state"] == [layers[0]] and fn.keywords["replay_engine"] == "snapshot"
    tr_hf.enable(model, replay_state=None)
    assert layers[1]._gradient_checkpointing_func.keywords["replay_state"] is None
    tr_hf.disable(model)
    assert not model.is_activation_checkpointing


def test_clear_errors_and_model_unchanged():
    model = build_hf("llama")
    with pytest.raises(TypeError, match="replay_state="):
        tr_hf.enable(model, state=[model])
    with pytest.raises(ValueError, match="'layer'"):
        tr_hf.enable(model, replay_state="module")
    assert not model.is_activation_checkpointing

    class NoCheckpointing(transformers.PreTrainedModel):
        config_class = transformers.LlamaConfig
        supports_gradient_checkpointing = False

        def __init__(self, config):
            super().__init__(config)
            self.lin = torch.nn.Linear(4, 4)

    with pytest.raises(ValueError, match="does not support activation checkpointing"):
        tr_hf.enable(NoCheckpointing(transformers.LlamaConfig(**SMALL)))


def _trainer_params(mode, tmp_path):
    model = build_hf("gpt2")
    if mode == "tr":
        tr_hf.enable(model)
    gen = torch.Generator().manual_seed(11)
    data = [{"input_ids": (ids := torch.randint(0, VOCAB, (16,), generator=gen)), "labels": ids}
            for _ in range(4)]  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / mode), max_steps=2, per_device_train_batch_size=2,
        activation_checkpointing=(mode == "torch"), report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return [p.detach().clone() for p in model.parameters()], model


def test_trainer_two_steps_equal_transformers_own_checkpointing(tmp_path):
    p_t, _ = _trainer_params("torch", tmp_path)
    p_r, model = _trainer_params("tr", tmp_path)
    assert tr_hf.layers(model)[0]._gradient_checkpointing_func.func is tr.checkpoint
    assert_bitwise(p_r, p_t)


def test_a_layer_that_does_not_call_the_installed_function_is_refused():
    """A transformers whose layers stop calling _gradient_checkpointing_func: refused
    before anything changes, rather than left with torch's checkpoint."""
    model = build_hf("llama", layers=2)
    layer_type = type(model.model.layers[0])

    class Changed(layer_type):
        pass

    Changed.forward = layer_type.forward.__wrapped__  # the plain forward, unwrapped
    for layer in model.model.layers:
        layer.__class__ = Changed
    with pytest.raises(tr.UnsupportedReplayError, match="_gradient_checkpointing_func"):
        tr_hf.enable(model)
    assert not model.is_activation_checkpointing


def test_checkpoint_layers_exactly_the_chosen_ones():
    """The per-layer step (for a planner): layers 1 and 2 of 4 checkpointed, the others
    keep their activations; bitwise equal to transformers' checkpointing of the same
    layers (its flags set by hand), and two segments run."""
    results = {}
    for mode in ("torch", "tr"):
        model = build_hf("llama")
        model.train()
        chosen = tr_hf.layers(model)[1:3]
        if mode == "torch":
            model.activation_checkpointing_enable()
            for layer in tr_hf.layers(model):
                layer.gradient_checkpointing = layer in chosen
        else:
            tr_hf.checkpoint_layers(model, chosen)
        torch.manual_seed(5)
        with collect_transactions() as txns:
            loss = hf_loss(model, "llama")
        loss.backward()
        results[mode] = (loss.detach(), [p.grad for p in model.parameters()], len(txns))
    assert [m.gradient_checkpointing for m in tr_hf.layers(model)] == [False, True, True, False]
    assert results["tr"][2] == 2
    assert torch.equal(results["tr"][0], results["torch"][0])
    assert_bitwise(results["tr"][1], results["torch"][1])
    with pytest.raises(ValueError, match="not GradientCheckpointingLayers"):
        tr_hf.checkpoint_layers(model, [model.lm_head])


def test_assert_trains_like_eager_on_a_transformers_model():
    """torch_replay.testing with transformers: the copy without checkpointing is made by
    disabling transformers' checkpointing; torch's is caught, torch_replay's passes."""
    from torch_replay.testing import assert_trains_like_eager

    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))

    def loss_fn(m, b):
        return m(input_ids=b, labels=b).loss

    theirs = build_hf("deepseek_v3", layers=2)
    theirs.train()
    hf_turn_on(theirs, "torch")
    with pytest.raises(AssertionError, match="step 1 of 2: gradient of"):
        assert_trains_like_eager(theirs, ids, loss_fn, between=move_router_bias)
    ours = build_hf("deepseek_v3", layers=2)
    ours.train()
    tr_hf.enable(ours)
    assert_trains_like_eager(ours, ids, loss_fn, between=move_router_bias)


# ------------------------------------------- the Trainer's own checkpointing on
# Note [HF Trainer route] in torch_replay/integrations/transformers.py. The model writes
# state in its forward that the forward reads (tests/hf_tiny.py): torch's re-run moves it
# again, so transformers' own checkpointing differs from eager in parameters and buffers.


def _stateful_data(n=4, seq=8):
    gen = torch.Generator().manual_seed(11)
    return [{"input_ids": (ids := torch.randint(0, 32, (seq,), generator=gen)), "labels": ids}
            for _ in range(n)]  # fmt: skip


class _Grads(transformers.TrainerCallback):
    """Every trainable parameter's gradient before each optimizer step."""

    def __init__(self):
        self.seen = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.seen.append([p.grad.clone() for p in model.parameters() if p.requires_grad])


def _train(route, tmp_path, *, checkpointing=True, trainer_kwargs=None, enable_kwargs=None):
    """Two Trainer steps of the stateful model; ``route``: "eager" (no checkpointing),
    "torch" (the Trainer's own), "before" / "after" (tr_hf.enable before / after the
    Trainer is built), "callback" (tr_hf.trainer_callback()). Returns the training loss,
    the gradients of each step, the parameters and buffers after, the segments run and
    the model."""
    from tests.hf_tiny import tiny_stateful_lm

    model = tiny_stateful_lm()
    grads = _Grads()
    callbacks = [grads]
    if route == "before":
        tr_hf.enable(model, **(enable_kwargs or {}))
    if route == "callback":
        callbacks.append(tr_hf.trainer_callback(**(enable_kwargs or {})))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / route), max_steps=2, per_device_train_batch_size=2,
        gradient_checkpointing=checkpointing and route != "eager",
        gradient_checkpointing_kwargs=trainer_kwargs, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_stateful_data(), callbacks=callbacks
    )
    if route == "after":
        tr_hf.enable(model, **(enable_kwargs or {}))
    with collect_transactions() as txns:
        out = trainer.train()
    params = [p.detach().clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    return out.training_loss, grads.seen, params, buffers, txns, model


@pytest.fixture(scope="module")
def trainer_references(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("references")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise: one reduction order (as the one_thread fixture)
    try:
        return {route: _train(route, tmp) for route in ("eager", "torch")}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("route", ["before", "after", "callback"])
def test_trainer_with_its_checkpointing_on_runs_torch_replay(
    route, trainer_references, tmp_path, one_thread
):
    """TrainingArguments(gradient_checkpointing=True): the Trainer's own
    activation_checkpointing_enable runs and torch_replay stays installed, whether enable
    ran before or after the Trainer was built, or through the callback; two steps equal
    eager bitwise (loss, every gradient of each step, parameters, buffers), where
    transformers' own checkpointing does not."""
    loss_e, grads_e, params_e, buffers_e, _, _ = trainer_references["eager"]
    loss_t, grads_t, params_t, buffers_t, txns_t, _ = trainer_references["torch"]
    assert len(txns_t) == 0
    assert not all(torch.equal(a, b) for a, b in zip(buffers_t, buffers_e, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(params_t, params_e, strict=True))

    loss, grads, params, buffers, txns, model = _train(route, tmp_path)
    assert len(txns) == 2 * 2  # two layers, two steps: each layer ran through tr.checkpoint
    assert loss == loss_e
    assert len(grads) == len(grads_e) == 2
    for step, step_e in zip(grads, grads_e, strict=True):
        assert_bitwise(step, step_e)
    assert_bitwise(params, params_e)
    assert_bitwise(buffers, buffers_e)
    assert all(m._gradient_checkpointing_func.func is tr.checkpoint for m in tr_hf.layers(model))


def test_trainer_checkpointing_kwargs_reach_torch_replay(tmp_path):
    """The Trainer's gradient_checkpointing_kwargs apply over enable's options: an engine
    (replay_engine=) and transformers' every_n_layers."""
    *_, txns, model = _train(
        "before", tmp_path, trainer_kwargs={"replay_engine": "snapshot", "every_n_layers": 2}
    )
    assert [m.gradient_checkpointing for m in tr_hf.layers(model)] == [True, False]
    assert len(txns) == 2 and {t.engine for t in txns} == {"snapshot"}
    *_, txns, model = _train("callback", tmp_path, enable_kwargs={"replay_engine": "journal"})
    assert len(txns) == 4 and {t.engine for t in txns} == {"journal"}


def test_callback_checkpoints_with_the_trainer_checkpointing_off(
    tmp_path, trainer_references, one_thread
):
    """The callback asks for checkpointing: with the Trainer's off it still runs
    torch_replay on every layer, eager's result."""
    loss_e, _, params_e, buffers_e, _, _ = trainer_references["eager"]
    loss, _, params, buffers, txns, _ = _train("callback", tmp_path, checkpointing=False)
    assert len(txns) == 4
    assert loss == loss_e
    assert_bitwise(params, params_e)
    assert_bitwise(buffers, buffers_e)


def test_a_function_installed_behind_enable_warns_once_naming_it():
    """Something that sets torch's function on the layers behind enable's back (here
    transformers' _set_gradient_checkpointing, called directly): the first training
    forward warns once, naming what it found; nothing is said when ours is in place."""
    from tests.hf_tiny import tiny_stateful_lm

    model = tiny_stateful_lm()
    tr_hf.enable(model)
    ids = torch.randint(0, 32, (2, 8))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch_replay.integrations")  # ours: no warning
        model(input_ids=ids)
    model._set_gradient_checkpointing(enable=True)
    with pytest.warns(UserWarning, match=r"torch\.utils\.checkpoint\.checkpoint.*not torch_replay"):
        model(input_ids=ids)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch_replay.integrations")  # once
        model(input_ids=ids)


def test_disable_gives_the_model_its_own_enable_back():
    from tests.hf_tiny import tiny_stateful_lm

    model = tiny_stateful_lm()
    tr_hf.enable(model)
    assert "activation_checkpointing_enable" in vars(model)
    tr_hf.disable(model)
    assert "activation_checkpointing_enable" not in vars(model)
    assert not model._forward_pre_hooks
    model.activation_checkpointing_enable()  # transformers' own again: torch's checkpoint
    assert (
        tr_hf.layers(model)[0]._gradient_checkpointing_func.func
        is torch.utils.checkpoint.checkpoint
    )


def test_budget_plan_survives_the_trainer_enable(tmp_path):
    """A plan's per-layer choice is installed again after the Trainer's enable; the
    Trainer's every_n_layers cannot apply to chosen layers and is refused."""
    from tests.hf_tiny import tiny_stateful_lm

    model = tiny_stateful_lm()
    tr_hf.checkpoint_layers(model, tr_hf.layers(model)[1:], replay_engine="snapshot")
    model.activation_checkpointing_enable()  # as the Trainer calls it
    assert [m.gradient_checkpointing for m in tr_hf.layers(model)] == [False, True]
    assert (
        tr_hf.layers(model)[1]._gradient_checkpointing_func.keywords["replay_engine"] == "snapshot"
    )
    with pytest.raises(TypeError, match="every_n_layers"):
        model.activation_checkpointing_enable(every_n_layers=2)
    with pytest.warns(UserWarning, match="selective=True"):  # TRL's key: not passed on
        model.activation_checkpointing_enable({"selective": True})
    assert "selective" not in tr_hf.layers(model)[1]._gradient_checkpointing_func.keywords


def test_sft_trainer_default_checkpointing_runs_torch_replay(tmp_path, one_thread):
    """TRL's SFTTrainer turns gradient_checkpointing on by default: with tr_hf.enable
    before it, torch_replay runs each layer and two steps equal eager's parameters and
    buffers (SFTTrainer without checkpointing), where TRL's default (torch's) does not."""
    trl = pytest.importorskip("trl", reason="trl (requirements-dev.txt) is not installed")
    datasets = pytest.importorskip("datasets", reason="datasets comes with trl")
    import tokenizers
    from tokenizers.models import WordLevel

    from tests.hf_tiny import tiny_stateful_lm

    vocab = {f"t{i}": i for i in range(32)}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(WordLevel(vocab, unk_token="t0")),
        pad_token="t0", eos_token="t1",
    )  # fmt: skip
    rows = [{"input_ids": r["input_ids"].tolist()} for r in _stateful_data()]

    def run(route):
        model = tiny_stateful_lm()
        if route == "tr":
            tr_hf.enable(model)
        config = trl.SFTConfig(
            output_dir=str(tmp_path / route), max_steps=2, per_device_train_batch_size=2,
            report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, bf16=False,
            seed=0, dataloader_num_workers=0, disable_tqdm=True,
            **({"gradient_checkpointing": False} if route == "eager" else {}),
        )  # fmt: skip
        assert config.gradient_checkpointing == (route != "eager")  # TRL's default: on
        trainer = trl.SFTTrainer(
            model=model, args=config, train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer,
        )  # fmt: skip
        with collect_transactions() as txns:
            trainer.train()
        return [p.detach().clone() for p in model.parameters()], list(model.buffers()), txns

    params_e, buffers_e, _ = run("eager")
    params_t, buffers_t, txns_t = run("torch")
    params_r, buffers_r, txns_r = run("tr")
    assert len(txns_t) == 0 and len(txns_r) == 4
    assert not all(torch.equal(a, b) for a, b in zip(buffers_t, buffers_e, strict=True))
    assert_bitwise(params_r, params_e)
    assert_bitwise(buffers_r, buffers_e)


# ------------------------------------------------------------ PEFT LoRA in the Trainer


def _lora_train(route, tmp_path, reentrant):
    """Two Trainer steps (gradient_checkpointing on, but for "eager") of the stateful
    model with LoRA adapters on its layers' linears; ``route``: "eager", "torch" (the
    Trainer's own), "before" / "after" (tr_hf.enable on the base model before
    ``get_peft_model``, or on the PEFT model after it)."""
    peft = pytest.importorskip("peft", reason="peft (requirements-dev.txt) is not installed")
    from tests.hf_tiny import tiny_stateful_lm

    model = tiny_stateful_lm()
    if route == "before":
        tr_hf.enable(model)
    config = peft.LoraConfig(r=4, target_modules=["lin"], lora_dropout=0.1)
    model = peft.get_peft_model(model, config)
    if route == "after":
        tr_hf.enable(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / route), max_steps=2, per_device_train_batch_size=2,
        gradient_checkpointing=route != "eager",
        gradient_checkpointing_kwargs={"use_reentrant": reentrant}, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    grads = _Grads()
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_stateful_data(), callbacks=[grads]
    )
    with collect_transactions() as txns:
        out = trainer.train()
    params = [p.detach().clone() for p in model.parameters()]
    return out.training_loss, grads.seen, params, [b.clone() for b in model.buffers()], txns


@pytest.mark.parametrize("reentrant", [False, True])
def test_peft_lora_in_the_trainer_trains_like_eager(reentrant, tmp_path, one_thread):
    """PEFT LoRA adapters, the Trainer's checkpointing on: tr_hf.enable before or after
    get_peft_model runs torch_replay on every layer, and two steps equal eager bitwise
    (loss, the adapters' gradients of each step, every parameter, the buffers), where the
    Trainer's own checkpointing (torch's) moves the layers' state twice."""
    loss_e, grads_e, params_e, buffers_e, _ = _lora_train("eager", tmp_path, reentrant)
    _, _, params_t, buffers_t, txns_t = _lora_train("torch", tmp_path, reentrant)
    assert len(txns_t) == 0
    assert not all(torch.equal(a, b) for a, b in zip(buffers_t, buffers_e, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(params_t, params_e, strict=True))
    for route in ("before", "after"):
        loss, grads, params, buffers, txns = _lora_train(route, tmp_path, reentrant)
        assert len(txns) == 2 * 2, route
        assert loss == loss_e, route
        assert len(grads) == len(grads_e) == 2
        for step, step_e in zip(grads, grads_e, strict=True):
            assert_bitwise(step, step_e)
        assert_bitwise(params, params_e)
        assert_bitwise(buffers, buffers_e)
