"""Reads of pre-existing state through alias-annotated composite operators (Note
[Alias-annotated composites] in csrc/aten/op_observer.h): ``to``, ``double``,
``float``, ``half``, ``contiguous``, ``reshape``, ``type_as``, ``flatten`` may return
their argument or a fresh copy. A segment that reads a buffer through one of them, the
buffer changed before backward, must give eager's gradient (declared, with an engine
that preserves; undeclared under detect="preserve") or a named refusal (undeclared under
detect="reads"; the guard), never another gradient,
with both observers and both checkpoint variants. The reference is eager PyTorch: the
gradient of the forward that ran."""

from __future__ import annotations

import pytest
import torch

import torch_replay as tr

from .reference import REENTRANT

CONVERSIONS = {
    "to_dtype": lambda b: b.to(torch.float64),
    "to_other": lambda b: b.to(torch.zeros((), dtype=torch.float64)),
    "double": lambda b: b.double(),
    "half": lambda b: b.half(),
    "bfloat16": lambda b: b.bfloat16(),
    "float_of_double": lambda b: b.double().float(),
    "int": lambda b: b.mul(4).int(),
    "long": lambda b: b.mul(4).long(),
    "type_as": lambda b: b.type_as(torch.zeros(1, dtype=torch.float64)),
    "contiguous": lambda b: b.view(3, 4).t().contiguous().view(-1),
    "reshape": lambda b: b.view(3, 4).t().reshape(-1),
    "flatten": lambda b: b.view(3, 4).t().flatten(),
    "expand_as": lambda b: b[:1].expand_as(b).contiguous(),
}


def _segment(conv, buf):
    def fn(x):
        return (x * conv(buf).to(x.dtype)).exp()

    return fn


def _run(conv, reentrant, **options):
    """(eager's gradient, the checkpoint's gradient or the ReplayError it raised)."""
    buf = torch.linspace(0.5, 1.5, 12)
    x = torch.randn(12, dtype=torch.float64, requires_grad=True)
    fn = _segment(conv, buf)
    fn(x).sum().backward()
    ref, x.grad = x.grad, None
    try:
        y = tr.checkpoint(fn, x, use_reentrant=reentrant, **options)
        with torch.no_grad():
            buf[3] = 9.0  # changed before backward
        y.sum().backward()
    except tr.ReplayError as e:
        return ref, e
    return ref, x.grad


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("name", sorted(CONVERSIONS))
@pytest.mark.parametrize("detect", ["reads", "preserve"])
def test_undeclared_read_through_a_conversion(observer, name, reentrant, detect, monkeypatch):
    """detect="reads": a named refusal; "preserve" (the default): eager's gradient."""
    monkeypatch.setattr(tr.config, "detect", detect)
    ref, got = _run(CONVERSIONS[name], reentrant)
    if detect == "reads":
        assert isinstance(got, tr.StateMutationError), (name, got)
    else:
        assert isinstance(got, torch.Tensor) and torch.equal(got, ref), (name, got)


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("engine", ["auto", "snapshot", "journal", "readset"])
@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_declared_read_through_a_conversion_gives_eager(observer, name, engine, reentrant):
    buf = torch.linspace(0.5, 1.5, 12)
    x = torch.randn(12, dtype=torch.float64, requires_grad=True)
    fn = _segment(CONVERSIONS[name], buf)
    fn(x).sum().backward()
    ref, x.grad = x.grad, None
    y = tr.checkpoint(fn, x, use_reentrant=reentrant, state=[buf], engine=engine)
    with torch.no_grad():
        buf[3] = 9.0
    y.sum().backward()
    assert torch.equal(x.grad, ref), name
    assert buf[3].item() == 9.0  # the live value is put back after the re-run


@pytest.mark.parametrize("reentrant", REENTRANT)
@pytest.mark.parametrize("name", ["to_dtype", "contiguous", "half"])
def test_guard_refuses_a_declared_read_through_a_conversion(observer, name, reentrant, monkeypatch):
    """The guard keeps nothing: a declared read it guards is refused at every detect
    level, as an undeclared one is under "reads"."""
    monkeypatch.setattr(tr.config, "detect", "reads")
    _, got = _run(CONVERSIONS[name], reentrant, state=None)
    assert isinstance(got, tr.StateMutationError)
    monkeypatch.setattr(tr.config, "detect", "preserve")
    buf = torch.linspace(0.5, 1.5, 12)
    x = torch.randn(12, dtype=torch.float64, requires_grad=True)
    y = tr.checkpoint(
        _segment(CONVERSIONS[name], buf),
        x,
        use_reentrant=reentrant,
        state=[buf],
        engine="guard",
    )
    with torch.no_grad():
        buf[3] = 9.0
    with pytest.raises(tr.StateMutationError):
        y.sum().backward()


def test_unchanged_state_read_through_a_conversion_runs_as_torch(observer):
    """Nothing changes before backward: the same gradient as torch's checkpoint."""
    buf = torch.linspace(0.5, 1.5, 12)
    x = torch.randn(12, dtype=torch.float64, requires_grad=True)
    fn = _segment(CONVERSIONS["to_dtype"], buf)
    torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False).sum().backward()
    ref, x.grad = x.grad, None
    tr.checkpoint(fn, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, ref)
