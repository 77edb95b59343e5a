"""The torch cohort: generated programs lowered to real torch modules, run eagerly,
under torch.utils.checkpoint and under torch_replay.checkpoint."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp

# ---------------------------------------------------------------------- cohort

COHORT_KINDS = ("local", "local", "hidden", "hidden", "overlap")
COHORT_METHODS = (
    "torch-nonreentrant",
    "torch-reentrant",
    "tr-auto",
    "tr-snapshot",
    "tr-journal",
    "tr-readset",
    "tr-guard",
    "tr-auto-reentrant",
    "tr-auto-nostate",
)


@dataclass(kw_only=True, slots=True)
class CohortSpec:
    """One generated cohort program (all choices drawn from its seed)."""

    seed: int
    """Program seed."""
    kind: str
    """``local`` (segment state is local views), ``hidden`` (module buffers that a later
    segment updates: EMA, ring queue, typed-alias counter) or ``overlap`` (contains a raw
    overlapping copy)."""
    d: int
    """Width."""
    ops: list[tuple]
    """In-place view operations of the first segment."""
    dropout: float
    """Dropout probability (default generator)."""
    explicit_noise: float
    """Noise scale drawn from an explicit generator (hidden programs)."""
    momentum: float
    """EMA momentum of the hidden buffer."""


def _cohort_spec(seed: int, kind: str) -> CohortSpec:
    r = random.Random(seed)
    d = r.randint(4, 10)
    ops: list[tuple] = []
    for _ in range(r.randint(3, 6)):
        length = r.randint(1, d - 1)
        a = r.randint(0, d - length)
        shift = r.choice([-2, -1, 1, 2])
        b = min(max(a + shift, 0), d + 2 - length)
        f = r.choice(["tanh", "sin", "sigmoid"])
        c1 = r.uniform(0.3, 0.9) * r.choice([-1, 1])
        c2 = r.uniform(0.3, 0.9) * r.choice([-1, 1])
        ops.append(("mix", a, b, length, f, c1, c2, r.uniform(-0.3, 0.3)))
        if r.random() < 0.4:
            ops.append(("alias32", a, length))
    if kind == "overlap":
        length = r.randint(2, d - 1)
        ops.insert(r.randint(0, len(ops)), ("rawcopy", length))
    return CohortSpec(
        seed=seed,
        kind=kind,
        d=d,
        ops=ops,
        dropout=r.choice([0.1, 0.2, 0.3]),
        explicit_noise=0.1 if kind == "hidden" else 0.0,
        momentum=r.uniform(0.5, 0.9),
    )


_F = {"tanh": torch.tanh, "sin": torch.sin, "sigmoid": torch.sigmoid}


class CohortModule(nn.Module):
    """A generated program lowered to torch: parameters, buffers (float64 state, a float32
    statistics buffer with an int32 typed-alias counter, a ring queue with an int64
    pointer), views, in-place ops, dropout and an explicit generator."""

    def __init__(self, spec: CohortSpec) -> None:
        super().__init__()
        self.spec = spec
        g = torch.Generator().manual_seed(spec.seed)
        d = spec.d
        dt = torch.float64
        self.w = nn.Parameter(torch.randn(d, d, generator=g, dtype=dt) / math.sqrt(d))
        self.register_buffer("hidden", torch.randn(d + 2, generator=g, dtype=dt))
        self.register_buffer("stats", torch.zeros(d + 2, dtype=torch.float32))
        self.register_buffer("queue", torch.randn(3, d, generator=g, dtype=dt))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.int64))
        self.noise_gen = torch.Generator().manual_seed(spec.seed + 1)

    def segment_a(self, x: torch.Tensor) -> torch.Tensor:
        """Views of one buffer written in place; reads hidden state additively."""
        s = self.spec
        d = s.d
        h = self.w @ x
        buf = torch.zeros(d + 2, dtype=h.dtype)
        buf[:d] = h
        if s.kind == "hidden":
            state, stats = self.hidden, self.stats
            q = self.queue[0]
        else:  # the same shapes, local to the segment
            state = torch.linspace(-1.0, 1.0, d + 2, dtype=h.dtype)
            stats = torch.zeros(d + 2, dtype=torch.float32)
            q = torch.linspace(0.5, -0.5, d, dtype=h.dtype)
        counter = stats.view(torch.int32)  # typed alias: same bytes
        for op in s.ops:
            if op[0] == "mix":
                _, a, b, n, f, c1, c2, bias = op
                # The right side is computed first (versions before the write), then
                # written through an overlapping view of the same buffer.
                buf[b : b + n] = _F[f](c1 * buf[a : a + n] + c2 * state[a : a + n] + bias)
            elif op[0] == "alias32":
                _, a, n = op
                stats[a : a + n] = buf[a : a + n].detach().float()
                counter[d + 1] += 1  # integer write through the int32 view
            elif op[0] == "rawcopy":
                buf[1 : 1 + op[1]].copy_(buf[0 : op[1]])  # raw overlapping copy
            elif op[0] == "tempcopy":  # the same copy through a temporary (JAX's reference)
                buf[1 : 1 + op[1]] = buf[0 : op[1]].clone()
        y = buf[:d] + q * 0.5
        if s.explicit_noise:
            y = y + s.explicit_noise * torch.rand(d, generator=self.noise_gen, dtype=y.dtype)
        return F.dropout(torch.tanh(y), s.dropout, training=True)

    def segment_b(self, y: torch.Tensor) -> torch.Tensor:
        """Hidden programs update the state segment A read (EMA, queue, counter)."""
        s = self.spec
        if s.kind == "hidden":
            with torch.no_grad():
                m = s.momentum
                self.hidden[: s.d].mul_(m).add_((1 - m) * y.detach())
                self.queue[int(self.ptr) % 3].copy_(y.detach())
                self.ptr += 1
                self.stats.view(torch.int32)[0] += 1
        return torch.sin(y) * 0.5


def _cohort_inputs(spec: CohortSpec) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec.seed + 2)
    return torch.randn(spec.d, generator=g, dtype=torch.float64).requires_grad_()


def _checkpointed(
    method: str, fn: Callable, x: torch.Tensor, module: CohortModule, preserve: bool
) -> torch.Tensor:
    import torch_replay as tr

    if method == "eager":
        return fn(x)
    if method.startswith("torch-"):
        return tcp.checkpoint(
            fn, x, use_reentrant=method == "torch-reentrant", preserve_rng_state=preserve
        )
    parts = method.split("-")
    engine = parts[1]
    state = (
        None if method.endswith("nostate") else [module, module.noise_gen, torch.default_generator]
    )
    return tr.checkpoint(
        fn,
        x,
        state=state,
        engine=engine,
        use_reentrant="reentrant" in parts,
        preserve_rng_state=preserve,
    )


def _run_cohort(spec: CohortSpec, method: str, preserve: bool) -> dict[str, Any]:
    """One execution: forward through two segments, a draw from both generators
    (the world moves on), backward; returns loss, gradients and the state afterwards."""
    torch.manual_seed(spec.seed + 3)
    module = CohortModule(spec)
    x = _cohort_inputs(spec)
    y = _checkpointed(method, module.segment_a, x, module, preserve)
    z = _checkpointed(method, module.segment_b, y, module, preserve)
    loss = (y * torch.linspace(0.5, 1.5, spec.d, dtype=y.dtype)).sum() + z.sum()
    torch.rand(3)  # later draws move the generators before backward
    torch.rand(3, generator=module.noise_gen)
    loss.backward()
    return {
        "loss": loss.detach().clone(),
        "grads": [x.grad.clone(), module.w.grad.clone()],
        "state": [bytes(b.untyped_storage()) for b in module.buffers()],
        "rng": [bytes(torch.get_rng_state().numpy()), bytes(module.noise_gen.get_state().numpy())],
    }


def _classify(ref: dict[str, Any] | None, got: dict[str, Any]) -> tuple[str, float]:
    if ref is None:
        return "wrong", math.inf  # eager refused but this method answered
    diff = max(float((a - b).abs().max()) for a, b in zip(ref["grads"], got["grads"], strict=True))
    same = (
        diff == 0.0
        and torch.equal(ref["loss"], got["loss"])
        and ref["state"] == got["state"]
        and ref["rng"] == got["rng"]
    )
    return ("matched" if same else "wrong"), diff


def _condition(spec: CohortSpec, preserve: bool) -> str:
    if spec.kind == "overlap":
        return "overlapping copy"
    if not preserve:
        return "RNG off"
    return "local view" if spec.kind == "local" else "hidden buffer"
