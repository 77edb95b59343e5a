"""Drop-in fidelity with torch.utils.checkpoint (Note [Drop-in fidelity]).

Where torch is right, torch_replay behaves the same: signature, defaults, warnings,
global knobs, error texts, non-grad outputs, differentiation inside a segment. And a
keyword of the user's function is never swallowed (Note [Option spelling]). Each test
compares against eager PyTorch or against torch.utils.checkpoint itself.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr

from .reference import BufferedLinear, assert_bitwise, grads

REENTRANT = [False, True]


# ------------------------------------------------------------ signature, warnings


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_equal_torch():
    assert _params(tr.checkpoint) == _params(tcp.checkpoint)
    assert _params(tr.checkpoint_sequential) == _params(tcp.checkpoint_sequential)


# torch 2.14.1's checkpoint signature, as torch/utils/checkpoint.py of that wheel spells it
# (the drop-in reads the installed torch's; these tests give it 2.14's on any torch).
def _torch_2_14_checkpoint(
    function=None,
    *args,
    use_reentrant: bool | None = None,
    preserve_rng_state: bool = True,
    context_fn=tcp.noop_context_fn,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: bool | None = None,
    **kwargs,
): ...


_TORCH_2_14_REENTRANT_ERROR = (
    "Passing `context_fn`, `debug`, or `respect_saved_tensors_hooks` "
    "is only supported when use_reentrant=False."
)


@pytest.fixture
def torch_2_14(monkeypatch):
    """tr.checkpoint following torch 2.14.1's signature (Note [Drop-in signature])."""
    from torch_replay._replay import api as checkpoint_module
    from torch_replay._replay import drop_in as _drop_in

    drop_in = _drop_in.drop_in_of(_torch_2_14_checkpoint, "2.14.1")
    monkeypatch.setattr(checkpoint_module, "DROP_IN", drop_in)
    return drop_in


def _keywords_seen(ckpt, **options):
    """The keywords the checkpointed function receives from ``ckpt(fn, x, **options)``."""
    seen = []

    def fn(a, **kw):
        seen.append(sorted(kw))
        return a.sin()

    x = torch.randn(3, requires_grad=True)
    ckpt(fn, x, use_reentrant=False, **options).sum().backward()
    return seen


def test_torchs_keyword_options_never_reach_the_function():
    """Every keyword option of the installed torch's checkpoint (at its default) is taken
    by the checkpoint, as torch takes it; the function's own keyword reaches it."""
    params = inspect.signature(tcp.checkpoint).parameters
    options = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    options.setdefault("preserve_rng_state", True)
    del options["use_reentrant"]  # passed by _keywords_seen
    options["mine"] = 1
    assert _keywords_seen(tr.checkpoint, **options) == _keywords_seen(tcp.checkpoint, **options)
    assert _keywords_seen(tr.checkpoint, **options)[0] == ["mine"]


def test_signature_and_options_follow_torch_2_14(torch_2_14):
    # tr.checkpoint's own signature is the installed torch's, read at import (the fixture
    # replaces the drop-in's options only): 2.14's only where 2.14 is installed.
    assert _params(tr.checkpoint) == _params(tcp.checkpoint)
    assert list(torch_2_14.signature.parameters.values()) == list(
        inspect.signature(_torch_2_14_checkpoint).parameters.values()
    )
    assert torch_2_14.options == {"preserve_rng_state": True, "respect_saved_tensors_hooks": None}
    assert torch_2_14.function_optional
    assert torch_2_14.reentrant_error == _TORCH_2_14_REENTRANT_ERROR
    seen = _keywords_seen(tr.checkpoint, respect_saved_tensors_hooks=True, mine=1)
    assert seen == [["mine"], ["mine"]]  # the forward and the re-run


def test_respect_saved_tensors_hooks_is_set_on_selective_checkpointing(torch_2_14):
    """torch 2.14 honours the option by setting it on selective checkpointing's caching
    mode; torch_replay sets it the same way."""
    modes = []

    def context_fn():
        forward, recompute = tcp.create_selective_checkpoint_contexts([torch.ops.aten.mm.default])
        modes.append(forward)
        return forward, recompute

    def run(ckpt, **options):
        torch.manual_seed(0)
        w = torch.randn(3, 5, requires_grad=True)
        x = torch.randn(2, 3, requires_grad=True)
        y = ckpt(lambda a: (a @ w).sin(), x, **options)
        y.sum().backward()
        return grads(x, w)

    ours = run(
        tr.checkpoint, use_reentrant=False, context_fn=context_fn, respect_saved_tensors_hooks=True
    )
    assert modes[0].respect_saved_tensors_hooks is True
    assert_bitwise(ours, run(lambda f, a: f(a)))
    with pytest.raises(ValueError) as info:
        run(tr.checkpoint, use_reentrant=True, respect_saved_tensors_hooks=False)
    assert str(info.value) == _TORCH_2_14_REENTRANT_ERROR


def test_decorator_form_of_torch_2_14(torch_2_14):
    def run(decorate):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        forward = decorate(lambda a: model(a) * 2)
        x = torch.randn(2, 4, requires_grad=True)
        forward(x).sum().backward()
        return grads(x, model[0].weight)

    assert_bitwise(run(tr.checkpoint(use_reentrant=False)), run(lambda f: f))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        @tr.checkpoint(use_reentrant=False, preserve_rng_state=False)
        def forward(self, a):
            return self.lin(a).sin()

    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 4, requires_grad=True)
    block(x).sum().backward()
    expected = torch.func.grad(lambda a: block.lin(a).sin().sum())(x)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: bogus"):
        tr.checkpoint(use_reentrant=False, bogus=1)


def test_decorator_form_absent_where_torch_has_none():
    if inspect.signature(tcp.checkpoint).parameters["function"].default is None:
        pytest.skip("the installed torch has the decorator form (torch >= 2.14)")
    with pytest.raises(TypeError) as ours:
        tr.checkpoint(use_reentrant=False)
    with pytest.raises(TypeError) as torchs:
        tcp.checkpoint(use_reentrant=False)
    assert str(ours.value) == str(torchs.value)


def test_an_option_torch_replay_does_not_implement_is_refused_unless_default(monkeypatch):
    from torch_replay._replay import api as checkpoint_module
    from torch_replay._replay import drop_in as _drop_in

    def future(function, *args, use_reentrant=None, new_option: str = "off", **kwargs): ...

    monkeypatch.setattr(checkpoint_module, "DROP_IN", _drop_in.drop_in_of(future, "9.0"))
    assert _keywords_seen(tr.checkpoint, new_option="off") == [[], []]
    calls = []
    with pytest.raises(NotImplementedError, match=r"torch 9.0's checkpoint takes new_option="):
        tr.checkpoint(calls.append, torch.ones(1), use_reentrant=False, new_option="on")
    assert calls == []


@pytest.mark.skipif(
    "respect_saved_tensors_hooks" not in inspect.signature(tcp.checkpoint).parameters,
    reason="the installed torch's checkpoint has no respect_saved_tensors_hooks (< 2.14)",
)
@pytest.mark.parametrize("respect", [None, True, False])
def test_respect_saved_tensors_hooks_like_torch(respect):
    """What selective checkpointing saves goes through the user's saved_tensors_hooks
    exactly when torch's does; no FutureWarning where torch gives none."""

    def run(ckpt, hooked):
        torch.manual_seed(0)
        w = torch.randn(3, 5, requires_grad=True)
        x = torch.randn(2, 3, requires_grad=True)
        packed = []

        def pack(t):
            packed.append(tuple(t.shape))
            return t

        hooks = (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            if hooked
            else contextlib.nullcontext()
        )
        with hooks, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = ckpt(
                lambda a: (a @ w).sin(),
                x,
                use_reentrant=False,
                context_fn=functools.partial(
                    tcp.create_selective_checkpoint_contexts, [torch.ops.aten.mm.default]
                ),
                respect_saved_tensors_hooks=respect,
            )
        y.sum().backward()
        future = sorted({str(w.message) for w in caught if w.category is FutureWarning})
        return grads(x, w), (2, 5) in packed, future

    for hooked in (False, True):
        ours, theirs = run(tr.checkpoint, hooked), run(tcp.checkpoint, hooked)
        assert_bitwise(ours[0], theirs[0])
        assert ours[1:] == theirs[1:]


@pytest.mark.parametrize("ours", [tr.checkpoint, tcp.checkpoint], ids=["ours", "torch"])
def test_use_reentrant_omitted_warns_and_runs_reentrant_like_torch(ours):
    x = torch.randn(3, requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        y = ours(torch.sin, x)
    # Reentrant: torch.autograd.grad through the segment is refused.
    with pytest.raises(RuntimeError, match="torch.utils.checkpoint is incompatible"):
        torch.autograd.grad(y.sum(), x)


def test_checkpoint_sequential_positional_use_reentrant():
    def run(fn):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
        x = torch.randn(2, 4, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an explicit use_reentrant gives no warning
            y = fn(model, 2, x, False)
        y.sum().backward()
        return grads(x, model[0].weight, model[2].weight)

    assert_bitwise(run(tr.checkpoint_sequential), run(tcp.checkpoint_sequential))


def test_checkpoint_sequential_unknown_keyword_is_torchs_value_error():
    model = nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: bogus"):
        tr.checkpoint_sequential(model, 1, x, use_reentrant=False, bogus=1)


# ------------------------------------------------------------ keyword spelling


class Cell(nn.Module):
    """An RNN cell whose forward takes ``state`` (as every RNN/SSM cell does)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 5)
        self.rec = nn.Linear(5, 5)
        self.register_buffer("decay", torch.full((5,), 0.5))

    def forward(self, x, state=None):
        h = self.inp(x)
        if state is not None:
            h = h + self.rec(state) * self.decay
        return torch.tanh(h)


@pytest.mark.parametrize("reentrant", [False])
def test_rnn_cell_state_keyword_reaches_the_function(reentrant):
    def run(ckpt):
        torch.manual_seed(0)
        cell = Cell()
        x = torch.randn(3, 5, requires_grad=True)
        h = torch.randn(3, 5, requires_grad=True)
        y = ckpt(cell, x, state=h)
        y.pow(2).sum().backward()
        return [y.detach()] + grads(x, h, cell.rec.weight)

    def eager(fn, *a, **k):
        return fn(*a, **k)

    ours = run(functools.partial(tr.checkpoint, use_reentrant=reentrant))
    assert_bitwise(ours, run(eager))
    assert ours[2] is not None  # the cell really used the state


def test_rnn_cell_with_replay_state_and_its_own_state():
    """``state=`` goes to the cell, ``replay_state=`` is torch_replay's: the cell's
    buffer changed before backward is preserved for the re-run."""

    def run(use_ckpt):
        torch.manual_seed(0)
        cell = Cell()
        x = torch.randn(3, 5, requires_grad=True)
        h = torch.randn(3, 5, requires_grad=True)
        if use_ckpt:
            y = tr.checkpoint(cell, x, state=h, replay_state=[cell], use_reentrant=False)
        else:
            y = cell(x, state=h)
        # The buffer changes before backward; eager autograd cannot run that, so
        # its reference (the gradient of the forward that ran) changes it after.
        if use_ckpt:
            cell.decay.mul_(3.0)
        y.pow(2).sum().backward()
        return [y.detach()] + grads(x, h, cell.rec.weight)

    assert_bitwise(run(True), run(False))


def test_engine_keyword_of_the_function_reaches_it():
    seen = {}

    def fn(a, engine="none"):
        seen["engine"] = engine
        return a * 2

    x = torch.randn(3, requires_grad=True)
    tr.checkpoint(fn, x, engine="v8", replay_engine="snapshot", use_reentrant=False)
    assert seen["engine"] == "v8"


def test_ambiguous_keyword_is_refused_before_running():
    calls = []

    def fn(a, **kw):
        calls.append(kw)
        return a * 2

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="replay_state"):
        tr.checkpoint(fn, x, state=[torch.zeros(1)], use_reentrant=False)
    with pytest.raises(TypeError, match="replay_engine"):
        tr.checkpoint(fn, x, engine="snapshot", use_reentrant=False)
    assert calls == []
    # Both spellings together: state= is the function's.
    buf = torch.zeros(1)
    tr.checkpoint(fn, x, state="mine", replay_state=[buf], use_reentrant=False)
    assert calls == [{"state": "mine"}]


def test_keyword_answer_follows_a_changed_signature():
    """Whether the function takes ``state=`` is remembered per function (read once, not
    at every call); a forward replaced on the instance, a new ``__signature__`` or a new
    ``__code__`` is read again, as torch_replay reads a signature it has not seen."""
    buf = torch.ones(3)
    seen = []

    class Block(torch.nn.Module):
        def forward(self, a):
            return a * buf

    def takes_state(a, state=None):
        seen.append(state)
        return a * buf

    def run(fn):
        x = torch.randn(3, requires_grad=True)
        y = tr.checkpoint(fn, x, state=[buf], use_reentrant=False)
        y.sum().backward()

    block = Block()
    run(block)  # state= is torch_replay's: the forward takes none
    assert seen == []
    block.forward = takes_state  # now the function's
    run(block)
    assert seen == [[buf], [buf]]  # forward and re-run both got it

    def plain(a):
        assert seen is not None  # (the same free variables as takes_state)
        return a * buf

    run(plain)
    plain.__signature__ = inspect.signature(takes_state)
    with pytest.raises(TypeError):  # passed through: plain() takes no state
        run(plain)
    del plain.__signature__
    run(plain)
    plain.__code__ = takes_state.__code__
    seen.clear()
    run(plain)
    assert seen == [[buf], [buf]]


def test_plain_state_still_means_torch_replays_option_when_the_function_has_none():
    buf = torch.ones(3)

    def fn(a):
        return a * buf

    x = torch.randn(3, requires_grad=True)
    y = tr.checkpoint(fn, x, state=[buf], engine="snapshot", use_reentrant=False)
    buf.add_(1.0)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))  # the forward's buffer, not 2s
    assert tr.last_transaction() is None or tr.last_transaction().engine == "snapshot"


# ------------------------------------------------------- differentiation inside


def _c(fn, early_stop=True):
    def wrapped(*args):
        return tr.checkpoint(fn, *args, use_reentrant=False, early_stop=early_stop)

    return wrapped


def _grad(fn):
    def wrapped(x):
        with torch.enable_grad():
            out = fn(x)
            (g,) = torch.autograd.grad(out, x, create_graph=True)
        return g

    return wrapped


def _f(x):
    return x.sin().exp().sin()


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("observe", [True, False])
def test_nested_differentiation_matches_eager(early_stop, observe, monkeypatch):
    monkeypatch.setattr(tr.config, "observe", observe)
    x = torch.randn((), requires_grad=True, dtype=torch.float64)
    c = functools.partial(_c, early_stop=early_stop)
    cases = [
        (_grad(_f), [_grad(c(_f)), c(_grad(_f))]),
        (_grad(_grad(_f)), [_grad(c(_grad(_f))), c(_grad(_grad(c(_f)))), _grad(c(_grad(c(_f))))]),
    ]
    for expected_fn, actual_fns in cases:
        expected = expected_fn(x)
        (expected_g,) = torch.autograd.grad(expected, x)
        for actual_fn in actual_fns:
            actual = actual_fn(x)
            assert torch.equal(actual, expected)
            (g,) = torch.autograd.grad(actual, x)  # differentiated again
            assert torch.equal(g, expected_g)


def test_inner_grad_after_touching_declared_state_is_refused_and_rolled_back():
    buf = torch.zeros(3)
    x = torch.randn(3, requires_grad=True)

    def seg(a):
        buf.add_(1.0)  # touched before differentiating inside
        y = (a * buf).sin()
        (g,) = torch.autograd.grad(y.sum(), a, create_graph=True)
        return g

    # The re-run inside the forward would start from the state the forward began
    # with while the forward itself has changed it: refused, nothing left behind.
    with pytest.raises(tr.UnsupportedReplayError, match="differentiates its own values"):
        tr.checkpoint(seg, x, state=[buf], use_reentrant=False)
    assert torch.equal(buf, torch.zeros(3))


def test_inner_grad_of_a_segment_with_dropout_later_matches_eager():
    """The re-run made inside the forward is rolled back: the generator and a buffer
    written later in the segment end where eager leaves them."""

    def run(use_ckpt):
        torch.manual_seed(0)
        buf = torch.zeros(3)
        x = torch.randn(3, requires_grad=True)

        def seg(a):
            y = a.sin().exp()
            (g,) = torch.autograd.grad(y.sum(), a, create_graph=True)
            buf.add_(1.0)
            return torch.nn.functional.dropout(g, 0.5, training=True)

        if use_ckpt:
            out = tr.checkpoint(seg, x, state=[buf], use_reentrant=False, early_stop=False)
        else:
            out = seg(x)
        after = torch.rand(2)
        out.sum().backward()
        return [out.detach(), buf.clone(), after, x.grad]

    assert_bitwise(run(True), run(False))


# ----------------------------------------------------------------- non-grad outputs


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_outputs_without_grad_are_returned_like_torch(reentrant):
    def seg(a):
        with torch.no_grad():
            side = a * 3
        return a.sin(), side, 7

    def run(ckpt):
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        y, side, n = ckpt(seg, x, use_reentrant=reentrant)
        (y.sum() + side.sum()).backward()
        return [y.detach(), side, x.grad], n, side.requires_grad

    ours, theirs = run(tr.checkpoint), run(tcp.checkpoint)
    assert_bitwise(ours[0], theirs[0])
    assert ours[1:] == theirs[1:]


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_segment_with_no_grad_output_at_all_is_like_torch(reentrant):
    buf = torch.zeros(3)
    x = torch.randn(3)  # does not require grad

    def seg(a):
        buf.add_(1.0)
        return a * 2

    def run(ckpt):
        buf.zero_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = ckpt(seg, x, use_reentrant=reentrant)
        return y, buf.clone(), sorted({str(w.message) for w in caught})

    ours, theirs = run(tr.checkpoint), run(tcp.checkpoint)
    assert torch.equal(ours[0], theirs[0]) and not ours[0].requires_grad
    assert torch.equal(ours[1], theirs[1])  # the write happened once, as in torch
    assert ours[2] == theirs[2]  # torch's "None of the inputs" warning when reentrant


# --------------------------------------------------------------------- global knobs


def _counted(counter):
    def seg(a):
        b = a.sin()
        counter["mid"] += 1
        c = b.exp()
        counter["end"] += 1
        return c

    return seg


@pytest.mark.parametrize("knob", [True, False])
@pytest.mark.parametrize("local", [True, False])
def test_set_checkpoint_early_stop_is_honoured(knob, local):
    def run(ckpt):
        counter = {"mid": 0, "end": 0}
        x = torch.randn(3, requires_grad=True)
        with tcp.set_checkpoint_early_stop(knob):
            y = ckpt(_counted(counter), x, use_reentrant=False, early_stop=local)
        y.sum().backward()
        return counter

    assert run(tr.checkpoint) == run(tcp.checkpoint)


def _rerun_error(ckpt, rerun, *, debug: bool = False) -> str:
    """The CheckpointError text of a segment whose forward computes ``a.sin()`` and whose
    re-run computes ``rerun(a)`` (with torch's checkpoint debug mode when ``debug``)."""
    calls = {"n": 0}

    def seg(a):
        calls["n"] += 1
        return a.sin() if calls["n"] == 1 else rerun(a)

    x = torch.randn(3, requires_grad=True)
    with tcp.set_checkpoint_debug_enabled(True) if debug else contextlib.nullcontext():
        y = ckpt(seg, x, use_reentrant=False)
    with pytest.raises(tcp.CheckpointError) as info:
        y.sum().backward()
    return str(info.value)


def test_set_checkpoint_debug_enabled_is_honoured(monkeypatch):
    # torch's debug mode logs every operator through the "LoggingTensor" logger,
    # whose records pytest's log capture (attached to it once an earlier debug run
    # left it non-propagating) cannot format: keep only torch's own handler.
    logger = logging.getLogger("LoggingTensor")
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "handlers", [])

    ours, theirs = (
        _rerun_error(ckpt, lambda a: a[:2].cos(), debug=True)
        for ckpt in (tr.checkpoint, tcp.checkpoint)
    )
    for text in (ours, theirs):
        assert "Operations executed during the original forward" in text
        assert "aten.sin" in text


def test_graph_exec_group_recomputes_once_like_torch():
    def run(ckpt):
        counter = {"mid": 0, "end": 0}
        x = torch.randn(3, requires_grad=True)

        def seg(a):
            counter["mid"] += 1
            return a.sin(), a.cos()

        y1, y2 = ckpt(seg, x, use_reentrant=False)
        with tcp.GraphExecGroup():
            torch.autograd.grad(y1.sum(), x, retain_graph=True)
            torch.autograd.grad(y2.sum(), x, retain_graph=True)
        return counter["mid"]

    assert run(tr.checkpoint) == run(tcp.checkpoint) == 2  # forward + one re-run


def test_graph_exec_group_overlap_error_like_torch():
    def run(ckpt):
        x = torch.randn(3, requires_grad=True)
        y = ckpt(lambda a: a.sin().exp(), x, use_reentrant=False)
        with tcp.GraphExecGroup():
            torch.autograd.grad(y.sum(), x, retain_graph=True)
            with pytest.raises(tcp.CheckpointError) as info:
                torch.autograd.grad(y.sum(), x, retain_graph=True)
        return str(info.value)

    ours, theirs = run(tr.checkpoint), run(tcp.checkpoint)
    assert "GraphExecGroup" in ours and "GraphExecGroup" in theirs


def test_determinism_error_starts_with_torchs_text():
    ours, theirs = (
        _rerun_error(ckpt, lambda a: a[:2].sin()) for ckpt in (tr.checkpoint, tcp.checkpoint)
    )
    assert ours.splitlines()[0] == theirs.splitlines()[0]


# ------------------------------------------------------------ sequential with state


@pytest.mark.parametrize("reentrant", REENTRANT)
def test_checkpoint_sequential_state_protects_the_last_chunk(reentrant):
    class Shift(BufferedLinear):
        def __init__(self):
            super().__init__(4, "shift", lambda: torch.zeros(4))

        def forward(self, x):
            return torch.tanh(self.lin(x) * (1 + self.shift))

    def run(use_ckpt):
        torch.manual_seed(0)
        model = nn.Sequential(Shift(), Shift(), Shift(), Shift())
        x = torch.randn(2, 4, requires_grad=True)
        if use_ckpt:
            y = tr.checkpoint_sequential(model, 2, x, reentrant, state=[model])
        else:
            y = model(x)
        if use_ckpt:  # every chunk's buffer changes before backward (an EMA)
            for m in model:
                m.shift.add_(0.25)
        y.pow(2).sum().backward()  # eager's reference: the forward that ran
        return grads(x, *(m.lin.weight for m in model))

    assert_bitwise(run(True), run(False))
