"""``tr.checkpoint`` inside a ``torch.compile``-d region.

Note [Checkpoint under torch.compile]
Dynamo cannot trace the eager machinery of ``tr.checkpoint`` (the pybind
``Transaction``, the C++ segment Function, the operator observer): tracing it
would break the graph at every segment and run the model eagerly. Under
``torch.compiler.is_compiling()`` a segment is therefore routed through
``torch.utils.checkpoint.checkpoint`` itself, which Dynamo turns into the
higher-order op ``tag_activation_checkpoint`` (``torch/_higher_order_ops/wrap.py``,
``CheckpointHigherOrderVariable`` in ``torch/_dynamo/variables/higher_order_ops.py``):
the same graphs and graph breaks as torch's checkpoint, and AOTAutograd's
partitioner recomputes the tagged region in the backward graph.

What the replay contract becomes there:

* The traced graph states every tensor the region reads (the HOP's inputs) and
  writes (functionalised input mutations, applied once: a recomputed BatchNorm
  does not update its statistics twice). The backward recompute reads the
  values AOTAutograd saved: for a tensor that is a graph input (a buffer, a
  parameter, a captured tensor), that is the live tensor itself.
* Declared state (``state=``) that does not require grad is passed to the region
  as an explicit input holding its forward value: ``torch_replay::snapshot`` (an
  opaque op, so the partitioner saves its result rather than recomputing it
  from the live tensor) copies it before the region, the region reads the copy
  (``torch.func.functional_call``-style reparametrisation of the module that owns
  it), and the copy is written back after the region, so writes the segment
  makes land in the live tensor once. A change made before backward no longer
  reaches the recompute: the gradient is eager's.
* Undeclared state, and declared tensors that require grad (parameters), are
  saved by AOTAutograd as graph inputs; an in-place change before backward is
  refused by autograd's version-counter check (torch's "modified by an inplace
  operation" error, raised inside the compiled backward, where no torch_replay
  class can be substituted): never silently wrong, as in eager (writes through
  ``.data`` or ``set_`` bypass version counters there too: declare such state).
  This holds at every ``tr.config.detect`` level, ``"preserve"`` included:
  preserving a read copy-on-write needs the eager write watch, which a compiled
  graph does not run, and the alternative, a whole copy of every module buffer
  per step, costs 1.116x on the ResNet row of
  benchmarks/results/compile_checkpoint.md. So a compiled segment is torch's
  (same graph, same refusal) unless its state is declared.
* Random numbers: with ``torch._functorch.config.activation_memory_budget`` < 1
  the partitioner may move random ops into the backward graph, where they draw
  fresh numbers (torch issue #190758). Under such a budget the region is given a
  selective-checkpoint policy that saves the outputs of random ops
  (``MUST_SAVE``); a budget of 0 ignores every policy and is refused for
  regions that draw random numbers.
* State that cannot be passed as an input (a declared tensor that no module of
  the segment owns, a declared generator) falls back to the eager
  ``tr.checkpoint`` behind a graph break, with a warning that says why.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as _tcp
from torch.nn.utils.stateless import _reparametrize_module

from ..errors import UnsupportedReplayError
from .call import SegmentCall
from .segment import module_of

__all__ = ["checkpoint_compiled", "constant_under_compile", "snapshot"]

# torch's own function, which Dynamo turns into the region: kept even if a caller
# swaps torch.utils.checkpoint.checkpoint for torch_replay's (docs/dropin.md).
_torch_checkpoint = _tcp.checkpoint


@torch.library.custom_op("torch_replay::snapshot", mutates_args=())
def snapshot(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` that compilers keep rather than recompute (Note [Checkpoint
    under torch.compile]): the forward value of declared state."""
    return x.clone()


@snapshot.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# ---------------------------------------------------------------- random ops


def _budget() -> float:
    import torch._functorch.config as fconfig

    return float(getattr(fconfig, "activation_memory_budget", 1.0))


def _rng_policy(ctx, func, *args, **kwargs):
    """Selective-checkpoint policy: the outputs of random ops are saved, not redrawn."""
    if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
        if _budget() <= 0:
            raise UnsupportedReplayError(
                "torch_replay.checkpoint under torch.compile: the checkpointed region draws "
                f"random numbers ({func}) and torch._functorch.config.activation_memory_budget "
                "is 0, under which AOTAutograd recomputes every op in backward, random ops "
                "included, with fresh numbers (torch issue #190758). Raise the budget above 0 "
                "or move the random op out of the checkpointed region."
            )
        return _tcp.CheckpointPolicy.MUST_SAVE
    return _tcp.CheckpointPolicy.PREFER_RECOMPUTE


def rng_context_fn():
    """The context_fn given to a compiled region under a memory budget < 1."""
    return _tcp.create_selective_checkpoint_contexts(_rng_policy)


def constant_under_compile(fn):
    """Dynamo calls ``fn`` while tracing and uses its result as a constant (what
    ``torch._dynamo.assume_constant_result`` marks), without importing Dynamo for
    eager users."""
    fn._dynamo_marked_constant = True
    return fn


@constant_under_compile
def _budget_below_one() -> bool:
    return _budget() < 1.0


# ------------------------------------------------------------ declared state


def _owners(function, state):
    """Where the declared tensors live: ``(module, {dotted name: tensor})``, the one
    module the region is reparametrised with (the segment's own module, or the one
    declared module of a plain function), or ``(None, reason)`` when the state
    cannot be handed to the region as inputs."""
    if state is None:
        return None, None
    if isinstance(state, (torch.Tensor, torch.nn.Module, torch.Generator)):
        state = [state]
    root = module_of(function)
    declared = [m for m in state if isinstance(m, torch.nn.Module)]
    if root is None and len(declared) == 1:
        root = declared[0]
    where = (
        {id(m): p for p, m in root.named_modules(remove_duplicate=False)}
        if root is not None
        else {}
    )
    mapping: dict[str, torch.Tensor] = {}

    def add(name, t):
        if t is not None and not t.requires_grad:
            mapping[name] = t  # parameters: guarded by autograd's version counters

    for i, item in enumerate(state):
        if isinstance(item, torch.nn.Module):
            if id(item) not in where:
                return None, (
                    f"state[{i}] is a module that is not part of the checkpointed module "
                    "(or, for a plain function, more than one module was declared)"
                )
            prefix = where[id(item)] + "." if where[id(item)] else ""
            for n, b in item.named_buffers():
                add(prefix + n, b)
            for n, p in item.named_parameters():
                add(prefix + n, p)
        elif isinstance(item, torch.Tensor):
            if item.requires_grad:
                continue
            found = None
            if root is not None:
                for n, b in root.named_buffers(remove_duplicate=False):
                    if b is item:
                        found = n
                        break
            if found is None:
                return None, (
                    f"state[{i}] is a tensor that no module of the segment owns as a buffer, "
                    "so it cannot be handed to the compiled region as an input"
                )
            add(found, item)
        elif isinstance(item, torch.Generator):
            return None, f"state[{i}] is a torch.Generator"
        else:
            raise TypeError(
                f"state[{i}] is a {type(item).__name__}; state= takes tensors, "
                "nn.Modules (their buffers and parameters) and torch.Generators only"
            )
    return (root, mapping) if mapping else None, None


def _reparametrized(function, root, names, nargs: int):
    """``function`` reading ``root``'s tensors ``names`` from trailing inputs."""

    def body(*flat, **kwargs):
        args, values = flat[:nargs], flat[nargs:]
        with _reparametrize_module(root, dict(zip(names, values, strict=True))):
            return function(*args, **kwargs)

    return body


def _eager_segment_impl(eager, function, args, kwargs, options):
    return eager(function, *args, **options, **kwargs)


# Dynamo never traces it (a graph break); Dynamo is imported at the first call only.
_eager_segment = torch._disable_dynamo(_eager_segment_impl)


_warned: set[str] = set()


def checkpoint_compiled(
    call: SegmentCall, args: tuple[Any, ...], kwargs: dict[str, Any], *, eager: Callable[..., Any]
) -> Any:
    """The segment as Dynamo's ``tag_activation_checkpoint`` region (Note [Checkpoint
    under torch.compile]). ``call.engine`` and ``call.early_stop`` are not used there:
    declared state is kept by saving its forward value, and the partitioner decides what
    the backward recomputes. ``eager`` is the eager ``torch_replay.checkpoint``, run
    behind a graph break when the state cannot be handed to the region (passed in, so
    that this module does not import the one that calls it). ``call.torch_options`` are
    the installed torch's further keyword options (Note [Drop-in signature] in
    ``torch_replay/_replay/drop_in.py``), passed on to torch's checkpoint as given."""
    function, state, use_reentrant = call.function, call.state, call.use_reentrant
    context_fn, preserve, torch_options = (
        call.context_fn,
        call.preserve_rng_state,
        call.torch_options,
    )
    owned, reason = _owners(function, state)
    if reason is not None:
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(
                "torch_replay.checkpoint under torch.compile: "
                + reason
                + "; this segment runs eagerly behind a graph break (declare the module "
                "that owns the tensor instead, or pass the tensor as an argument).",
                stacklevel=3,
            )
        options = call.keywords()
        del options["replay_engine"], options["early_stop"]  # as the region: torch's own
        if use_reentrant is None:
            options["use_reentrant"] = True  # torch's default
        return _eager_segment(eager, function, args, kwargs, options)
    if context_fn is _tcp.noop_context_fn and _budget_below_one():
        # AOTAutograd traces every region non-reentrantly (torch/_higher_order_ops/
        # wrap.py), so saying so changes nothing but admits the policy.
        context_fn, use_reentrant = rng_context_fn, False
    options: dict[str, Any] = {"preserve_rng_state": preserve, **torch_options}
    if use_reentrant is not None:
        options["use_reentrant"] = use_reentrant
    if use_reentrant is False:
        options.update(determinism_check=call.determinism_check, debug=call.debug)
        if context_fn is not _tcp.noop_context_fn:
            options["context_fn"] = context_fn  # Dynamo takes user functions and partials
    if owned is None:
        return _torch_checkpoint(function, *args, **options, **kwargs)
    root, mapping = owned
    live = list(mapping.values())
    copies = [snapshot(t) for t in live]
    body = _reparametrized(function, root, list(mapping), len(args))
    out = _torch_checkpoint(body, *args, *copies, **options, **kwargs)
    with torch.no_grad():
        for t, c in zip(live, copies, strict=True):
            t.copy_(c)  # what the segment wrote, once
    return out
