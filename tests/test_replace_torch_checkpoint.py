"""tr.replace_torch_checkpoint(): a library that calls torch.utils.checkpoint itself runs
tr.checkpoint inside the block (Note [Replacing torch's checkpoint] in
torch_replay/_replay/replace.py). The libraries here are tiny modules made in the test,
one that binds the name at import (``from torch.utils.checkpoint import checkpoint``) and
one that looks it up at call time (timm 1.0's way); no third-party package is needed."""

from __future__ import annotations

import contextlib
import sys
import threading
import types
import warnings

import pytest
import torch
import torch.utils.checkpoint as tcp
from torch import nn

import torch_replay as tr
from tests.reference import assert_bitwise
from torch_replay._replay import replace as _replace
from torch_replay._replay.segment import collect_transactions

# torch's functions, held in a tuple: a module-level name bound to them would itself be
# replaced inside a block (every module-level name that *is* torch's function is).
_TORCH = (tcp.checkpoint, tcp.checkpoint_sequential)

_BOUND = """
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

def run(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    return x

def run_sequential(blocks, x):
    return checkpoint_sequential(blocks, 2, x, use_reentrant=False)
"""

_CALL_TIME = """
import torch.utils.checkpoint

def run_function(start, end, functions):
    def forward(_x):
        for j in range(start, end + 1):
            _x = functions[j](_x)
        return _x
    return forward

def checkpoint_seq(functions, x, every=1):
    functions = tuple(functions)
    for start in range(0, len(functions), every):
        end = min(start + every - 1, len(functions) - 1)
        x = torch.utils.checkpoint.checkpoint(run_function(start, end, functions), x,
                                              use_reentrant=False)
    return x

def run(blocks, x):
    return checkpoint_seq(blocks, x)
"""


def _library(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def libs():
    made = {
        "bound": _library("_tr_lib_bound", _BOUND),
        "call": _library("_tr_lib_call", _CALL_TIME),
    }
    yield made
    for module in made.values():
        sys.modules.pop(module.__name__, None)


def _blocks():
    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh()) for _ in range(4)]
    )


def _train(run, block_ctx=contextlib.nullcontext, steps=2):
    """Two SGD steps; each forward inside ``block_ctx()``, each backward after it.
    Returns the losses, the gradients of each step, the parameters and buffers after,
    and the number of torch_replay segments."""
    model = _blocks()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    losses, grads, segments = [], [], 0
    for _ in range(steps):
        x = torch.randn(6, 8, generator=gen, requires_grad=True)
        with collect_transactions() as txns, block_ctx():
            loss = run(model, x).pow(2).mean()
        loss.backward()  # after the block
        segments += len(txns)
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()] + [x.grad])
        opt.step()
        opt.zero_grad()
    params = [p.detach().clone() for p in model.parameters()]
    return losses, grads, params, [b.clone() for b in model.buffers()], segments


def _eager(model, x):
    return model(x)


@pytest.mark.parametrize("kind", ["bound", "call", "sequential"])
def test_library_batchnorm_trains_like_eager_inside_the_block(libs, kind, one_thread):
    """A library checkpointing BatchNorm blocks with torch's checkpoint: the statistics
    move twice per step (the re-run), so buffers and then everything differ from eager;
    inside the block the same library code gives eager's loss, gradients, parameters and
    buffers bitwise, with the backward run after the block ended."""
    run = {
        "bound": libs["bound"].run,
        "call": libs["call"].run,
        "sequential": libs["bound"].run_sequential,
    }[kind]
    eager = _train(_eager)
    theirs = _train(run)
    ours = _train(run, tr.replace_torch_checkpoint)
    assert theirs[4] == 0
    assert ours[4] == (2 * 2 if kind == "sequential" else 4 * 2)
    assert not all(torch.equal(a, b) for a, b in zip(theirs[3], eager[3], strict=True))
    assert_bitwise(ours[0], eager[0])
    for step, step_e in zip(ours[1], eager[1], strict=True):
        assert_bitwise(step, step_e)
    assert_bitwise(ours[2], eager[2])
    assert_bitwise(ours[3], eager[3])


def test_names_are_torchs_again_after_the_block(libs):
    bound = libs["bound"]
    assert bound.checkpoint is _TORCH[0]
    with tr.replace_torch_checkpoint():
        assert tcp.checkpoint is _replace.checkpoint
        assert tcp.checkpoint_sequential is _replace.checkpoint_sequential
        assert bound.checkpoint is _replace.checkpoint
        assert bound.checkpoint_sequential is _replace.checkpoint_sequential
        # torch's own wrapper module bound the name at import too
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw

        assert cw.torch_utils_checkpoint is _replace.checkpoint
        # torch_replay's own reference (compiled.py) is torch's on purpose
        from torch_replay._replay import compiled

        assert compiled._torch_checkpoint is _TORCH[0]
    assert tcp.checkpoint is _TORCH[0]
    assert tcp.checkpoint_sequential is _TORCH[1]
    assert bound.checkpoint is _TORCH[0]
    assert bound.checkpoint_sequential is _TORCH[1]
    assert cw.torch_utils_checkpoint is _TORCH[0]
    assert not _replace._PATCH.installed()


def test_an_exception_inside_the_block_restores_and_propagates(libs):
    with pytest.raises(RuntimeError, match="boom"), tr.replace_torch_checkpoint():
        assert libs["bound"].checkpoint is _replace.checkpoint
        raise RuntimeError("boom")
    assert tcp.checkpoint is _TORCH[0]
    assert libs["bound"].checkpoint is _TORCH[0]

    # ... also one raised by the checkpointed function itself
    def bad(x):
        raise ValueError("inside the segment")

    with pytest.raises(ValueError, match="inside the segment"), tr.replace_torch_checkpoint():
        libs["bound"].checkpoint(bad, torch.ones(2, requires_grad=True), use_reentrant=False)
    assert libs["bound"].checkpoint is _TORCH[0]
    assert not _replace._PATCH.installed()


def test_nested_blocks_innermost_options_win(libs):
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    x = torch.randn(5, 4, requires_grad=True)
    with tr.replace_torch_checkpoint(engine="journal"):
        with collect_transactions() as txns:
            libs["bound"].run([block], x).sum().backward()
        with tr.replace_torch_checkpoint(engine="snapshot"), collect_transactions() as inner:
            libs["call"].run([block], x).sum().backward()
        assert tcp.checkpoint is _replace.checkpoint  # the outer block still holds
        with collect_transactions() as after:
            libs["bound"].run([block], x).sum().backward()
    assert [t.engine for t in txns] == ["journal"]
    assert [t.engine for t in inner] == ["snapshot"]
    assert [t.engine for t in after] == ["journal"]
    assert tcp.checkpoint is _TORCH[0]


def test_decorator_and_reuse_of_one_instance(libs):
    replaced = tr.replace_torch_checkpoint()

    @replaced
    def forward(block, x):
        assert tcp.checkpoint is _replace.checkpoint
        return libs["bound"].run([block], x)

    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    for _ in range(2):
        forward(block, torch.randn(5, 4, requires_grad=True)).sum().backward()
        assert tcp.checkpoint is _TORCH[0]
    assert block[1].num_batches_tracked.item() == 2  # once per step
    with replaced, replaced:  # one instance, nested
        assert tcp.checkpoint is _replace.checkpoint
    assert tcp.checkpoint is _TORCH[0]


def test_other_threads_keep_torchs_checkpoint(libs):
    """The options belong to the calling context: a thread outside any block checkpoints
    with torch's function while the patch is installed for another thread."""
    counts = {}

    def other():
        block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        libs["bound"].run([block], torch.randn(5, 4, requires_grad=True)).sum().backward()
        counts["other"] = block[1].num_batches_tracked.item()

    with tr.replace_torch_checkpoint():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        libs["bound"].run([block], torch.randn(5, 4, requires_grad=True)).sum().backward()
        counts["inside"] = block[1].num_batches_tracked.item()
    assert counts == {"other": 2, "inside": 1}  # torch's re-run counts the batch again


def test_a_module_imported_inside_the_block_is_restored():
    with tr.replace_torch_checkpoint():
        late = _library("_tr_lib_late", _BOUND)
        assert late.checkpoint is _replace.checkpoint
    try:
        assert late.checkpoint is _TORCH[0]
        assert late.checkpoint_sequential is _TORCH[1]
    finally:
        sys.modules.pop("_tr_lib_late", None)


def test_replacement_outside_a_block_is_torchs():
    """A replacement someone kept (a name bound and not restorable) calls torch's."""
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    x = torch.randn(5, 4, requires_grad=True)
    with collect_transactions() as txns:
        _replace.checkpoint(block, x, use_reentrant=False).sum().backward()
    assert txns == [] and block[1].num_batches_tracked.item() == 2


def test_state_module_declares_what_the_function_runs():
    blocks = [nn.Linear(2, 2) for _ in range(4)]
    outer = nn.Sequential(*blocks)
    lib = _library("_tr_lib_owners", _CALL_TIME)
    try:
        chunk = lib.run_function(1, 2, tuple(blocks))
        assert _replace.owners_of(chunk) == blocks[1:3]
    finally:
        sys.modules.pop("_tr_lib_owners", None)
    assert _replace.owners_of(outer) == [outer]
    assert _replace.owners_of(outer.forward) == [outer]
    import functools

    assert _replace.owners_of(functools.partial(outer.forward)) == [outer]
    assert _replace.owners_of(lambda x: outer(blocks[0](x))) == [outer]  # outermost
    assert _replace.owners_of(torch.tanh) == []
    options = _replace.Options.checked("module", "auto", "test")
    assert options.state_for(torch.tanh) is None
    assert options.sequential_state(outer) == [outer]
    assert options.sequential_state(blocks) == blocks


def test_a_callers_own_options_and_keywords_pass(libs):
    """replay_state= / replay_engine= given by the caller win; a state= keyword is the
    checkpointed function's (as torch would pass it)."""
    seen = []

    def fn(x, state=None):
        seen.append(state)
        return x * 2

    x = torch.ones(3, requires_grad=True)
    with tr.replace_torch_checkpoint(engine="journal"), collect_transactions() as txns:
        tcp.checkpoint(fn, x, state="mine", use_reentrant=False).sum().backward()
        tcp.checkpoint(fn, x, use_reentrant=False, replay_engine="snapshot").sum().backward()
    assert seen[0] == "mine" and seen[-1] is None
    assert [t.engine for t in txns] == ["journal", "snapshot"]


def test_omitted_use_reentrant_warns_at_the_library_call(libs):
    lib = _library(
        "_tr_lib_warn",
        "import torch.utils.checkpoint as t\ndef go(f, x):\n    return t.checkpoint(f, x)\n",
    )
    try:
        with tr.replace_torch_checkpoint(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lib.go(torch.tanh, torch.ones(2, requires_grad=True)).sum().backward()
        [w] = [w for w in caught if "use_reentrant" in str(w.message)]
        assert w.filename == "_tr_lib_warn"
    finally:
        sys.modules.pop("_tr_lib_warn", None)


def test_clear_errors_for_bad_input():
    with pytest.raises(TypeError, match=r"@tr.replace_torch_checkpoint\(\)"):
        tr.replace_torch_checkpoint(lambda: None)
    with pytest.raises(ValueError, match="'module'"):
        tr.replace_torch_checkpoint(state="layer")
    with pytest.raises(TypeError, match="got a int"):
        tr.replace_torch_checkpoint(state=[1])
    with pytest.raises(TypeError, match="got int"):
        tr.replace_torch_checkpoint(state=3)
    with pytest.raises(ValueError, match="engine= must be one of"):
        tr.replace_torch_checkpoint(engine="bogus")
    assert tcp.checkpoint is _TORCH[0]
    assert "engine='auto'" in repr(tr.replace_torch_checkpoint())


def test_a_declared_list_is_declared_for_every_call(libs):
    """state=[tensor]: a buffer the segment reads and that changes before backward is
    preserved (the list applies to each call)."""
    shift = torch.zeros(4)
    lin = nn.Linear(4, 4)

    def seg(x):
        return torch.tanh(lin(x) + shift)

    x = torch.randn(3, 4, requires_grad=True)
    ref = torch.autograd.grad(seg(x).sum(), lin.weight)[0]
    with tr.replace_torch_checkpoint(state=[shift]):
        y = libs["bound"].checkpoint(seg, x, use_reentrant=False)
    shift.add_(1.0)
    (got,) = torch.autograd.grad(y.sum(), lin.weight)
    assert torch.equal(got, ref)
