"""Checks to run in a user's own test suite: does the model train with its
checkpointing exactly as it trains without it, and is one checkpointed segment's
gradient right (float64 ``gradcheck``)? Registered as a pytest plugin (the
``torch_replay_testing`` fixture, ``_torch_replay_pytestplugin.py``); see
``docs/integrations.md`` ("Check it in your tests").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    ActivationWrapper,
)

from ._replay.api import checkpoint

__all__ = ["assert_trains_like_eager", "gradcheck_segment", "without_checkpointing"]


def without_checkpointing(
    model: torch.nn.Module, generators: Sequence[torch.Generator] = ()
) -> torch.nn.Module:
    """A deep copy of ``model`` with its checkpointing taken off: torch's (and
    torch_replay's) checkpoint wrappers replaced by the modules they wrap, and
    transformers' activation checkpointing disabled.

    Checkpoint calls written inside a module's own ``forward`` cannot be taken off from
    outside; build the model without them and pass it as ``eager=``.

    Args:
        model: the model with checkpointing.
        generators: generators the model holds that the copy shares (not copied).

    Returns:
        The copy.
    """
    eager = copy.deepcopy(model, memo={id(g): g for g in generators})
    if isinstance(eager, ActivationWrapper):
        eager = eager._checkpoint_wrapped_module
    for module in list(eager.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, ActivationWrapper):
                setattr(module, child_name, child._checkpoint_wrapped_module)
    if getattr(eager, "is_activation_checkpointing", False):
        eager.activation_checkpointing_disable()
    return eager


def _names(model: torch.nn.Module, kind: str) -> list[tuple[str, torch.Tensor]]:
    items = model.named_parameters() if kind == "parameter" else model.named_buffers()
    return [(n.replace(_CHECKPOINT_PREFIX, ""), t) for n, t in items]


def _first_difference(what: str, ours: torch.Tensor | None, ref: torch.Tensor | None) -> str:
    if ours is None or ref is None:
        if ours is None and ref is None:
            return ""
        return f"{what}: None with checkpointing, a tensor without (or the reverse)"
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return f"{what}: {ours.dtype}{list(ours.shape)} with checkpointing, {ref.dtype}{list(ref.shape)} without"
    if torch.equal(ours, ref):
        return ""
    if ours.is_floating_point() or ours.is_complex():
        diff = (ours.double() - ref.double()).abs()
        return f"{what} differs: max |difference| {diff.max().item():.3e} at {diff.argmax().item()} (flat index)"
    return f"{what} differs: {int((ours != ref).sum())} of {ours.numel()} elements"


def assert_trains_like_eager(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    *,
    steps: int = 2,
    eager: torch.nn.Module | None = None,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    between: Callable[[torch.nn.Module], None] | None = None,
    generators: Sequence[torch.Generator] = (),
    seed: int = 0,
) -> None:
    """Assert that ``model`` (with its checkpointing) trains bitwise as eager does.

    Runs ``steps`` optimizer steps on ``model`` and on ``eager`` (default:
    :func:`without_checkpointing` of ``model``, copied before the first step), each step
    from the same seed, and compares, in this order, the loss, every gradient, then
    after the step every parameter and buffer, the default CPU generator (and CUDA's
    where available) and ``generators``. The first difference is named.

    Args:
        model: the model with checkpointing on.
        batch: the step's input, or a list of ``steps`` inputs (one per step).
        loss_fn: ``loss_fn(model, batch)`` returns the scalar loss.
        steps: how many optimizer steps.
        eager: the same model without checkpointing (same parameters and buffers).
        optimizer: builds the optimizer from parameters (default SGD, lr 0.1).
        between: called with the model after the forward, before the backward (a
            buffer updated there, as MoCo's queue or a router bias).
        generators: explicit generators the model draws from: both runs start them
            from their present state, and their states are compared (the default
            ``eager`` copy shares them).
        seed: ``torch.manual_seed`` before each step.

    Returns:
        None.

    Raises:
        AssertionError: naming the step and the first difference (loss, gradient,
            parameter, buffer or generator).
    """
    if eager is None:
        eager = without_checkpointing(model, generators)
    make_opt = optimizer or (lambda params: torch.optim.SGD(params, lr=0.1))
    start = [g.get_state() for g in generators]
    states = []
    with torch.random.fork_rng(devices=[]):  # the caller's default generator is kept
        for run in (model, eager):
            for g, s in zip(generators, start, strict=True):
                g.set_state(s)
            opt = make_opt(run.parameters())
            states.append(
                [
                    _train_step(run, batch, step, loss_fn, opt, between, seed, generators)
                    for step in range(steps)
                ]
            )
    for step, (ours, ref) in enumerate(zip(*states, strict=True)):
        for (what, a), (_, b) in zip(ours, ref, strict=True):
            message = _first_difference(what, a, b)
            if message:
                raise AssertionError(
                    f"torch_replay.testing: step {step + 1} of {steps}: {message} "
                    "(with checkpointing vs without)"
                )


def _train_step(model, batch, step, loss_fn, opt, between, seed, generators):
    torch.manual_seed(seed + step)
    data = batch[step] if isinstance(batch, list) and len(batch) > 1 else batch
    loss = loss_fn(model, data)
    if between is not None:
        between(model)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    record = [("loss", loss.detach().clone())]
    record += [(f"gradient of '{n}'", p.grad) for n, p in _names(model, "parameter")]
    opt.step()
    record += [
        (f"parameter '{n}' after the step", p.detach().clone())
        for n, p in _names(model, "parameter")
    ]
    record += [(f"buffer '{n}'", b.clone()) for n, b in _names(model, "buffer")]
    record.append(("the default CPU generator", torch.get_rng_state()))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record.append(("the default CUDA generator", torch.cuda.get_rng_state()))
    record += [(f"generator {i}", g.get_state()) for i, g in enumerate(generators)]
    return record


def gradcheck_segment(
    function: Callable,
    *inputs: Any,
    use_reentrant: bool = False,
    replay_state: Any = None,
    replay_engine: str = "auto",
    **gradcheck_kwargs: Any,
) -> bool:
    """``torch.autograd.gradcheck`` of one segment run through :func:`tr.checkpoint`,
    in float64.

    Floating-point tensor inputs are cast to float64 and made to require grad; a module
    (``function`` itself) is deep-copied and cast to float64, so the caller's is left as
    it is. With ``replay_state="module"`` the copied module is declared.

    Args:
        function: the segment (a function or an ``nn.Module``).
        *inputs: its positional inputs.
        use_reentrant: as ``tr.checkpoint``.
        replay_state: ``None``, ``"module"`` (the module ``function``) or a list, as
            ``state=`` (tensors in it are used as given).
        replay_engine: as ``tr.checkpoint``'s ``engine=``.
        **gradcheck_kwargs: passed to ``torch.autograd.gradcheck`` (``eps``, ``atol``,
            ``nondet_tol``, ...).

    Returns:
        True when the check passes.

    Raises:
        torch.autograd.gradcheck.GradcheckError: the analytical gradient is wrong.
    """
    if isinstance(function, torch.nn.Module):
        function = copy.deepcopy(function).double()
    if replay_state == "module":
        if not isinstance(function, torch.nn.Module):
            raise ValueError('replay_state="module" needs an nn.Module segment')
        replay_state = [function]
    cast = [
        x.detach().double().requires_grad_(True)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]

    def segment(*args):
        return checkpoint(
            function,
            *args,
            use_reentrant=use_reentrant,
            replay_state=replay_state,
            replay_engine=replay_engine,
        )

    return torch.autograd.gradcheck(segment, tuple(cast), **gradcheck_kwargs)
