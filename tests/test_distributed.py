"""tr.checkpoint under FSDP2 (fully_shard) and DDP: 2 spawned processes, gloo on
127.0.0.1 with a file rendezvous, a bounded wait. The reference is
torch.utils.checkpoint under the same sharding (bitwise), and eager PyTorch for
a MoCo-style queue declared as state and for blocks that write their own state
(BatchNorm, an EMA, MoE counts) in the README's FSDP2 recipe called from the root
(Note [FSDP traffic] in torch_replay/_replay/fsdp.py).

How a worker starts and ends, so that a loaded machine cannot fail it:

- The rendezvous is a ``FileStore`` in the test's temporary directory, not a TCP
  port picked in the parent: a port found free and then bound by rank 0 later can
  be taken in between by another run on the same machine (two CI runs side by side).
- A worker ends with ``os._exit`` once its result file is written and closed.
  Gloo's threads (two workers and the transport loop) outlive
  ``destroy_process_group`` and ``gc.collect()``: a worker of ``_moco_job`` has 2
  threads before ``init_process_group`` and still 5 after both. If one of them drops
  the last reference to a tensor with a Python object while the interpreter
  finalizes, it must take the GIL; CPython then ends that thread in place
  (``PyThread_exit_thread``), and unwinding it through a ``noexcept`` destructor
  aborts the process ("terminate called without an active exception"). A worker that
  skips finalization has nothing to race; a barrier first makes sure that neither
  rank leaves while the other still has a collective in flight.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import tempfile
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.distributed_stacks import (
    accelerator,
    as_torchrun,
    lightning_module,
    lightning_trainer,
    shard,
)

WORLD = 2
# A hang guard, not a time box: the jobs take seconds, but two spawned workers
# importing torch on a loaded 2-core CI machine can take minutes.
TIMEOUT_S = 900


def _worker(rank, out_dir, job):
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method="file://" + os.path.join(out_dir, "rendezvous"),
            rank=rank,
            world_size=WORLD,
        )
        result = job(rank)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # No interpreter finalization with gloo's threads alive (module docstring).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(job) -> list:
    """Runs ``job(rank)`` in WORLD processes; returns what each returned."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(out_dir, job),
            nprocs=WORLD,
            join=False,
            start_method="spawn",
        )
        deadline = TIMEOUT_S
        while not ctx.join(timeout=5):
            deadline -= 5
            if deadline <= 0:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"distributed workers did not finish within {TIMEOUT_S} s (hung?)")
        results = []
        for r in range(WORLD):
            with open(os.path.join(out_dir, f"{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    for res in results:
        assert "error" not in res, res.get("error")
    return results


def _every_job(rank):
    """Every job of the file in one process group, each job's failure kept to itself."""
    out = {}
    for name, job in _JOBS.items():
        try:
            out[name] = job(rank)
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    return out


@pytest.fixture(scope="module")
def ranks() -> list:
    """What each rank's jobs returned. One pair of workers (one gloo process group) serves
    the whole file: starting them, two fresh interpreters importing torch, costs more than
    the jobs do."""
    return _spawn(_every_job)


def _results(ranks: list, name: str) -> list:
    """Job ``name``'s result on each rank; its failure fails only its own test."""
    res = [r[name] for r in ranks]
    for r in res:
        assert "error" not in r, r.get("error")
    return res


# ------------------------------------------------------------------ models


class _Block(torch.nn.Module):
    def __init__(self, ck, inside: bool, reentrant: bool):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)
        )
        self.ck, self.inside, self.reentrant = ck, inside, reentrant

    def forward(self, x):
        if self.inside:
            return x + self.ck(self.net, x, use_reentrant=self.reentrant)
        return x + self.net(x)


def _shard_blocks_and_root(model, rank: int):
    """``fully_shard`` each block of ``model`` and then the root (the README's recipe);
    returns its optimizer and the rank's input generator."""
    shard(model)
    return torch.optim.SGD(model.parameters(), lr=0.05), torch.Generator().manual_seed(100 + rank)


def _fsdp_run(which: str, inside: bool, reentrant: bool, steps: int, rank: int):
    ck = tcp.checkpoint if which == "torch" else tr.checkpoint
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block(ck, inside, reentrant) for _ in range(3)])
    opt, gen = _shard_blocks_and_root(model, rank)
    grads = []
    for _ in range(steps):
        h = torch.randn(8, 16, generator=gen, requires_grad=True)
        for block in model:
            h = block(h) if inside else ck(block, h, use_reentrant=reentrant)
        h.pow(2).mean().backward()
        grads.append([p.grad.to_local().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads, [p.detach().to_local().clone() for p in model.parameters()]


def _fsdp_job(inside, rank):
    out = {}
    for reentrant in (False, True):
        key = f"{'inside' if inside else 'around'}-{'reentrant' if reentrant else 'plain'}"
        out[key] = {w: _fsdp_run(w, inside, reentrant, 20, rank) for w in ("torch", "tr")}
    return out


@pytest.mark.parametrize("inside", [True, False], ids=["inside", "around"])
def test_fsdp2_twenty_steps_bitwise_against_torch_checkpoint(ranks, inside):
    """Checkpoint inside the sharded module and around it, reentrant and not."""
    for res in _results(ranks, "fsdp-inside" if inside else "fsdp-around"):
        assert len(res) == 2
        for key, by in res.items():
            (g_t, p_t), (g_r, p_r) = by["torch"], by["tr"]
            assert len(g_t) == len(g_r) == 20, key
            for step, (a, b) in enumerate(zip(g_t, g_r, strict=True)):
                for x, y in zip(a, b, strict=True):
                    assert torch.equal(x, y), (key, step, (x - y).abs().max())
            for x, y in zip(p_t, p_r, strict=True):
                assert torch.equal(x, y), key


class _QueueHead(torch.nn.Module):
    """A MoCo-style head: logits against a queue of negatives kept as a buffer."""

    def __init__(self, inside: str | None = None):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.register_buffer("queue", torch.nn.functional.normalize(torch.randn(32, 16), dim=1))
        self.inside = inside

    def logits(self, q):
        q = torch.nn.functional.normalize(self.proj(q), dim=1)
        return q @ self.queue.t() / 0.1

    def forward(self, q):
        if self.inside == "queue":
            return tr.checkpoint(self.logits, q, use_reentrant=False, state=[self.queue])
        if self.inside == "module":  # inside forward, FSDP has unsharded the parameters
            return tr.checkpoint(self.logits, q, use_reentrant=False, state=[self])
        return self.logits(q)


def _moco_job(rank):
    from torch.distributed.fsdp import fully_shard

    out = {}
    for mode in ("eager", "tr-around", "tr-inside-queue", "tr-inside-module"):
        torch.manual_seed(0)
        head = _QueueHead(inside=mode[len("tr-inside-") :] if "inside" in mode else None)
        fully_shard(head)
        opt = torch.optim.SGD(head.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(7 + rank)
        grads = []
        for _ in range(6):
            q = torch.randn(8, 16, generator=gen)
            keys = torch.nn.functional.normalize(torch.randn(8, 16, generator=gen), dim=1)
            if mode == "tr-around":
                logits = tr.checkpoint(head, q, use_reentrant=False, state=[head])
            else:
                logits = head(q)
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
            enqueue = lambda head=head, keys=keys: head.queue[:8].copy_(keys)  # noqa: E731
            if mode != "eager":
                with torch.no_grad():
                    enqueue()  # in place between forward and backward, as MoCo does
            loss.backward()
            if mode == "eager":
                with torch.no_grad():
                    enqueue()  # eager saved the queue: enqueue after backward
            grads.append([p.grad.to_local().clone() for p in head.parameters()])
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                head.queue.copy_(head.queue.roll(8, 0))
        out[mode] = grads
    return out


def test_fsdp2_moco_queue_declared_state_gives_eager_gradient(ranks):
    for res in _results(ranks, "moco"):
        for mode in ("tr-around", "tr-inside-queue", "tr-inside-module"):
            for a, b in zip(res["eager"], res[mode], strict=True):
                for x, y in zip(a, b, strict=True):
                    assert torch.equal(x, y), (mode, (x - y).abs().max())


class _StatefulBlock(torch.nn.Module):
    """A block that writes its own state in the forward, as training models do:
    BatchNorm statistics (``bn``), an EMA buffer (``ema``), MoE token counts that an
    expert bias follows between steps (``moe``, torchtitan's auxiliary-loss-free
    balancing), or nothing, with dropout (``pure``: torch's checkpoint is right)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin1, self.lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
        self.norm = torch.nn.BatchNorm1d(32) if kind == "bn" else torch.nn.Identity()
        self.drop = torch.nn.Dropout(0.1) if kind == "pure" else torch.nn.Identity()
        self.register_buffer("ema", torch.zeros(32))
        if kind == "moe":
            self.router, self.experts = torch.nn.Linear(16, 4), torch.nn.Linear(16, 64)
        self.register_buffer("expert_bias", torch.zeros(4))
        self.register_buffer("tokens_per_expert", torch.zeros(4))

    def forward(self, x):
        h = self.norm(self.lin1(x))
        if self.kind == "ema":
            with torch.no_grad():
                self.ema.mul_(0.9).add_(h.mean(0), alpha=0.1)
        out = x + self.lin2(self.drop(torch.nn.functional.gelu(h)))
        if self.kind == "moe":
            scores = self.router(x).sigmoid()
            choice = (scores + self.expert_bias).argmax(-1)  # the bias only routes
            with torch.no_grad():
                self.tokens_per_expert.add_(torch.bincount(choice, minlength=4))
            picked = self.experts(x).view(-1, 4, 16)[torch.arange(len(x)), choice]
            out = out + picked * scores.gather(1, choice[:, None])
        return out


def _fsdp_root_run(which: str, kind: str, reentrant: bool, rank: int):
    """The README's recipe (wrap the blocks, ``fully_shard`` each block and the root)
    trained two steps from the root, as training loops call it."""
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as ptd

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_StatefulBlock(kind) for _ in range(2)])
    blocks = list(model)
    is_block = lambda m: isinstance(m, _StatefulBlock)  # noqa: E731
    if which in ("tr", "tr-preserve"):
        tr.apply_activation_checkpointing(model, check_fn=is_block, use_reentrant=reentrant)
    elif which == "torch":
        impl = ptd.CheckpointImpl.REENTRANT if reentrant else ptd.CheckpointImpl.NO_REENTRANT
        wrap = functools.partial(ptd.checkpoint_wrapper, checkpoint_impl=impl)
        ptd.apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=is_block)
    opt, gen = _shard_blocks_and_root(model, rank)
    grads = []
    level = "preserve" if which == "tr-preserve" else tr.config.detect
    for step in range(2):
        torch.manual_seed(step)  # dropout
        x = torch.randn(8, 16, generator=gen, requires_grad=reentrant)
        with tr.config.patch(detect=level):
            model(x).pow(2).mean().backward()
        grads.append([p.grad.to_local().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        with torch.no_grad():  # the expert bias follows the counts, as torchtitan's
            for b in blocks:
                counts = b.tokens_per_expert
                b.expert_bias.add_(1e-2 * (counts.mean() - counts).sign())
                counts.zero_()
    params = [p.detach().to_local().clone() for p in model.parameters()]
    return grads, params, [b.clone() for b in model.buffers()]


_KINDS = ("pure", "bn", "ema", "moe")


def _fsdp_root_job(rank):
    """Per kind of block: eager, and each checkpointing; a kind's failure kept to itself."""
    out = {}
    for kind in _KINDS:
        try:
            runs = {"eager": _fsdp_root_run("eager", kind, False, rank)}
            for reentrant in (False, True):
                for which in (
                    ("tr", "tr-preserve", "torch") if kind == "pure" else ("tr", "tr-preserve")
                ):
                    runs[(which, reentrant)] = _fsdp_root_run(which, kind, reentrant, rank)
            out[kind] = runs
        except Exception:
            out[kind] = {"error": traceback.format_exc()}
    return out


def _bitwise(run, reference) -> None:
    """Two steps' gradients, then parameters and buffers, equal bitwise."""
    (g_e, p_e, b_e), (g_r, p_r, b_r) = reference, run
    for step, (a, b) in enumerate(zip(g_e, g_r, strict=True)):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y), (step, (x - y).abs().max())
    for x, y in zip(p_e + b_e, p_r + b_r, strict=True):
        assert torch.equal(x, y), (x - y).abs().max()


@pytest.mark.parametrize("reentrant", [False, True], ids=["plain", "reentrant"])
@pytest.mark.parametrize("kind", _KINDS)
def test_fsdp2_root_call_stateful_blocks_train_like_eager(ranks, kind, reentrant):
    """FSDP2 as training loops call it: the README's recipe, the root called, so each
    block reshards after its forward and all-gathers again for the re-run. Two steps
    give eager's gradients, parameters and buffers (BatchNorm statistics, an EMA, MoE
    token counts and the expert bias that follows them) at the default engine, and
    torch's checkpoint result where torch is right (``pure``, with dropout)."""
    for res in _results(ranks, "fsdp-root"):
        res = res[kind]
        assert "error" not in res, res.get("error")
        _bitwise(res[("tr", reentrant)], res["eager"])
        if kind == "pure":
            _bitwise(res[("tr", reentrant)], res[("torch", reentrant)])


@pytest.mark.parametrize("reentrant", [False, True], ids=["plain", "reentrant"])
@pytest.mark.parametrize("kind", _KINDS)
def test_fsdp2_root_call_at_detect_preserve_trains_like_eager(ranks, kind, reentrant):
    """The same root calls with nothing declared at ``detect="preserve"``: the segments'
    reads of FSDP's unsharded parameters are watched, not preserved by their own bytes,
    which FSDP frees after the forward and all-gathers again (Note [Transient storages]
    in csrc/aten/tensor_bytes.h). Preserving them gave NaN gradients (``pure``) or a
    false StateMutationError (``bn``, ``ema``, ``moe``)."""
    for res in _results(ranks, "fsdp-root"):
        res = res[kind]
        assert "error" not in res, res.get("error")
        _bitwise(res[("tr-preserve", reentrant)], res["eager"])


def _is_stateful(m: torch.nn.Module) -> bool:
    return isinstance(m, _StatefulBlock)


def _mean_square(net, batch) -> torch.Tensor:
    return net(batch[0]).pow(2).mean()


def _bn_net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[_StatefulBlock("bn") for _ in range(2)])


def _lightning_data():
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)


def _lightning_model_parallel_job(rank):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 over its device mesh), the blocks
    wrapped and sharded in ``configure_model``, ``Trainer.fit`` for two steps. The
    workers' process group is Lightning's: it joins a group already initialized and
    launches nothing when ``LOCAL_RANK`` is set, as under torchrun."""
    try:
        import lightning  # noqa: F401
    except ImportError:  # the test skips with the reason
        return {"skip": "lightning is a test dependency (requirements-dev.txt)"}
    as_torchrun(rank, WORLD)

    def configure(lit, checkpointed: bool) -> None:
        if checkpointed:
            tr.apply_activation_checkpointing(lit.net, check_fn=_is_stateful)
        shard(lit.net, mesh=lit.device_mesh["data_parallel"])

    out = {}
    for checkpointed in (False, True):
        configure_model = functools.partial(configure, checkpointed=checkpointed)
        lit = lightning_module(_bn_net(), configure_model, _mean_square)
        lightning_trainer(WORLD, "model-parallel", max_steps=2).fit(lit, _lightning_data())
        wrapped = type(lit.net[0]).__name__
        params = [p.detach().to_local().clone() for p in lit.net.parameters()]
        out[checkpointed] = wrapped, params + [b.clone() for b in lit.net.buffers()]
    return out


def test_lightning_model_parallel_strategy_trains_like_eager(ranks):
    """The root call through Lightning's loop: eager's parameters and BatchNorm
    statistics after two steps."""
    for res in _results(ranks, "lightning-model-parallel"):
        if "skip" in res:
            pytest.skip(res["skip"])
        (_, eager), (wrapped, ours) = res[False], res[True]
        assert wrapped == "FSDPReplayCheckpointWrapper"  # fully_shard's subclass of ours
        for x, y in zip(eager, ours, strict=True):
            assert torch.equal(x, y), (x - y).abs().max()


def _accelerate_fsdp2_job(rank):
    """accelerate's FSDP2 plugin with ``activation_checkpointing=True`` beside the
    documented recipe, through ``Accelerator.prepare`` and ``accelerator.backward``, on
    the CPU (how accelerate is made to take its FSDP2 path there:
    benchmarks/lib/distributed_stacks.py's ``accelerator``)."""
    try:
        from accelerate.state import AcceleratorState
    except ImportError:  # the test skips with the reason
        return {"skip": "accelerate is a test dependency (requirements-dev.txt)"}
    as_torchrun(rank, WORLD)
    policies = {
        "transformer": {
            "auto_wrap_policy": "transformer_based_wrap",
            "transformer_cls_names_to_wrap": ["_StatefulBlock"],
        },
        "size": {"auto_wrap_policy": "size_based_wrap", "min_num_params": 100},
    }
    out = {}
    for policy, kwargs in policies.items():
        for how in ("eager", "torch", "tr"):
            acc = accelerator(fsdp2={"activation_checkpointing": how != "eager", **kwargs})
            model = _bn_net()
            if how == "tr":  # the recipe: wrap before prepare()
                tr.apply_activation_checkpointing(model, check_fn=_is_stateful)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            model, opt = acc.prepare(model, opt)
            gen = torch.Generator().manual_seed(1 + rank)
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    for _ in range(2):
                        x = torch.randn(8, 16, generator=gen)
                        acc.backward(model(x).pow(2).mean())
                        opt.step()
                        opt.zero_grad()
            except tr.UnsupportedReplayError as e:
                out[(policy, how)] = {"refused": str(e)}
                continue
            told = [str(w.message) for w in seen if "torch_replay" in str(w.message)]
            params = [p.detach().to_local().clone() for p in model.parameters()]
            out[(policy, how)] = {
                "told": told,
                "state": params + [b.clone() for b in model.buffers()],
            }
    AcceleratorState._reset_state(True)
    return out


def test_accelerate_fsdp2_plugin_checkpointing_never_silently_nests(ranks):
    """Its transformer policy puts torch's wrapper inside ours: ours wins (eager's
    parameters and statistics, where the plugin's own checkpointing is not) and a warning
    names the setting; its size-based policy also wraps ours: refused at the first
    forward, naming the setting (Note [Nested wrappers] in torch_replay/wrapper.py)."""
    for res in _results(ranks, "accelerate-fsdp2"):
        if "skip" in res:
            pytest.skip(res["skip"])
        eager, torch_own, ours = (res[("transformer", h)] for h in ("eager", "torch", "tr"))
        assert not all(
            torch.equal(a, b) for a, b in zip(eager["state"], torch_own["state"], strict=True)
        )
        assert ours["told"] and "activation_checkpointing=False" in ours["told"][0]
        for x, y in zip(eager["state"], ours["state"], strict=True):
            assert torch.equal(x, y), (x - y).abs().max()
        assert "activation_checkpointing=False" in res[("size", "tr")]["refused"]


def _lightning_ddp_job(rank):
    """Lightning's ``DDPStrategy``, BatchNorm blocks wrapped in ``configure_model``
    (torch_replay's recipe, or torch's wrapper in its place), ``Trainer.fit`` for two
    steps; the group is joined as under torchrun (``LOCAL_RANK`` set)."""
    try:
        import lightning  # noqa: F401
    except ImportError:  # the test skips with the reason
        return {"skip": "lightning is a test dependency (requirements-dev.txt)"}
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as torch_apply,
    )

    as_torchrun(rank, WORLD)
    apply = {"tr": tr.apply_activation_checkpointing, "torch": torch_apply}

    def configure(lit, how: str) -> None:
        if how in apply:
            apply[how](lit.net, check_fn=_is_stateful)

    out = {}
    for how in ("eager", "torch", "tr"):
        lit = lightning_module(_bn_net(), functools.partial(configure, how=how), _mean_square)
        lightning_trainer(WORLD, "ddp", max_steps=2).fit(lit, _lightning_data())
        out[how] = [t.detach().clone() for t in (*lit.net.parameters(), *lit.net.buffers())]
    return out


def test_lightning_ddp_trains_like_eager(ranks):
    """Lightning DDP (2 processes, ``Trainer.fit``): the recipe gives eager's parameters and
    BatchNorm statistics after two steps, where torch's wrapper in its place does not."""
    for res in _results(ranks, "lightning-ddp"):
        if "skip" in res:
            pytest.skip(res["skip"])
        assert not all(torch.equal(a, b) for a, b in zip(res["eager"], res["torch"], strict=True))
        for x, y in zip(res["eager"], res["tr"], strict=True):
            assert torch.equal(x, y), (x - y).abs().max()


def _accelerate_ddp_job(rank):
    """accelerate on two CPU processes (``MULTI_CPU``: DDP), the recipe (wrap before
    ``prepare``) or torch's wrapper in its place, ``accelerator.backward``, two steps."""
    try:
        from accelerate.state import AcceleratorState
    except ImportError:  # the test skips with the reason
        return {"skip": "accelerate is a test dependency (requirements-dev.txt)"}
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as torch_apply,
    )

    as_torchrun(rank, WORLD)
    apply = {"tr": tr.apply_activation_checkpointing, "torch": torch_apply}
    out = {}
    for how in ("eager", "torch", "tr"):
        acc = accelerator()
        model = _bn_net()
        if how in apply:
            apply[how](model, check_fn=_is_stateful)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        model, opt = acc.prepare(model, opt)
        gen = torch.Generator().manual_seed(1 + rank)
        for _ in range(2):
            acc.backward(model(torch.randn(8, 16, generator=gen)).pow(2).mean())
            opt.step()
            opt.zero_grad()
        distributed = str(acc.state.distributed_type)
        out[how] = (
            distributed,
            [t.detach().clone() for t in (*model.parameters(), *model.buffers())],
        )
    AcceleratorState._reset_state(True)
    return out


def test_accelerate_ddp_trains_like_eager(ranks):
    """accelerate's DDP on two CPU processes: the recipe gives eager's parameters and
    BatchNorm statistics after two steps, where torch's wrapper in its place does not."""
    for res in _results(ranks, "accelerate-ddp"):
        if "skip" in res:
            pytest.skip(res["skip"])
        (kind, eager), (_, torch_own), (_, ours) = res["eager"], res["torch"], res["tr"]
        assert "MULTI_CPU" in kind
        assert not all(torch.equal(a, b) for a, b in zip(eager, torch_own, strict=True))
        for x, y in zip(eager, ours, strict=True):
            assert torch.equal(x, y), (x - y).abs().max()


def _ddp_job(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    for reentrant in (False, True):
        for which, ck in (("torch", tcp.checkpoint), ("tr", tr.checkpoint)):
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[_Block(ck, True, reentrant) for _ in range(3)])
            ddp = DDP(model, static_graph=reentrant)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            gen = torch.Generator().manual_seed(100 + rank)
            grads = []
            for _ in range(10):
                x = torch.randn(8, 16, generator=gen, requires_grad=True)
                ddp(x).pow(2).mean().backward()
                grads.append([p.grad.clone() for p in ddp.parameters()])
                opt.step()
                opt.zero_grad()
            out[(which, reentrant)] = grads
    return out


_JOBS = {
    "fsdp-inside": functools.partial(_fsdp_job, True),
    "fsdp-around": functools.partial(_fsdp_job, False),
    "moco": _moco_job,
    "fsdp-root": _fsdp_root_job,
    "ddp": _ddp_job,
    "accelerate-fsdp2": _accelerate_fsdp2_job,
    "accelerate-ddp": _accelerate_ddp_job,
    "lightning-ddp": _lightning_ddp_job,
    "lightning-model-parallel": _lightning_model_parallel_job,  # last: Lightning's globals
}
"""The jobs the workers run, by name (``_every_job``)."""


def test_ddp_bitwise_against_torch_checkpoint(ranks):
    results = _results(ranks, "ddp")
    for res in results:
        for reentrant in (False, True):
            for a, b in zip(res[("torch", reentrant)], res[("tr", reentrant)], strict=True):
                for x, y in zip(a, b, strict=True):
                    assert torch.equal(x, y), (reentrant, (x - y).abs().max())
    # DDP all-reduces: both ranks hold the same gradients
    for a, b in zip(results[0][("tr", False)], results[1][("tr", False)], strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
