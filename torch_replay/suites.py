"""Replay contract suites: generated programs that check the replay contract, rerunnable by anyone.

::

    python -m torch_replay.suites {numeric,bytes,engines,complex-step,alias-stress,cohort,all}
        [--quick] [--seed S] [--programs N] [--out DIR]

Each suite prints a progress bar and a line per target (measured figure and target). With
``--out DIR`` it also writes ``DIR/suites_<suite>.json`` (every measured figure and its target)
and ``DIR/suites.md`` (one table per suite run); without ``--out`` nothing is written.
The default sizes (1,024 programs for numeric and bytes, 1,200 for engines, 96 for
complex-step, 50 for alias-stress and the cohort) take several minutes each on a small CPU;
``--quick`` runs a few programs per suite (:data:`QUICK_SIZES`; a minute or two, most of it
the cohort). The reference suites (numeric,
bytes, engines, complex-step, alias-stress) run the torch-free interpreter of the C++ core's
replay contract; the cohort lowers generated programs to real torch modules and runs them
eagerly, under ``torch.utils.checkpoint`` and under ``torch_replay.checkpoint``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp

from ._ext import require_extension

__all__ = [
    "COHORT_METHODS",
    "SUITES",
    "SuiteResult",
    "main",
    "run_suite",
]

SUITES = ("numeric", "bytes", "engines", "complex-step", "alias-stress", "cohort")
DEFAULT_SIZES = {
    "numeric": 1024,
    "bytes": 1024,
    "engines": 1200,
    "complex-step": 96,
    "alias-stress": 50,
    "cohort": 50,
}
QUICK_SIZES = {
    "numeric": 64,
    "bytes": 64,
    "engines": 64,
    "complex-step": 8,
    "alias-stress": 4,
    "cohort": 2,
}
"""Sizes of ``--quick`` (the small run)."""
DEFAULT_SEEDS = {"cohort": 420000}
REFERENCE_ENGINES = ("eager", "snapshot", "journal", "readset", "guard")


@dataclass(kw_only=True, slots=True)
class SuiteResult:
    """What one suite measured."""

    suite: str
    """Suite name."""
    params: dict[str, Any]
    """Seed, size and knobs."""
    measured: dict[str, Any]
    """Every figure, by name."""
    targets: list[dict[str, Any]]
    """One row per target: ``name``, ``target``, ``measured``, ``passed``."""
    seconds: float = 0.0
    """Wall time."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """One record per execution (cohort only)."""
    table: list[list[str]] = field(default_factory=list)
    """Extra markdown table rows (cohort summary), first row the header."""

    @property
    def passed(self) -> bool:
        """True if every target is met."""
        return all(t["passed"] for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "suite": self.suite,
            "params": self.params,
            "measured": self.measured,
            "targets": self.targets,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "table": self.table,
            "records": self.records,
        }


class _Progress:
    """A one-line progress bar on stderr (silent when ``quiet``)."""

    def __init__(self, label: str, total: int, quiet: bool) -> None:
        self.label, self.total, self.quiet = label, max(total, 1), quiet
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self.last < 0.1 and done < self.total):
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total)
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\r{self.label:<13}[{bar}] {done}/{self.total} {now - self.start:6.1f}s")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _target(name: str, target: str, measured: Any, passed: bool) -> dict[str, Any]:
    return {"name": name, "target": target, "measured": measured, "passed": bool(passed)}


def _knobs(seed: int) -> dict[str, Any]:
    """Per-program generator knobs, varied with the seed so a suite covers the space."""
    r = random.Random(seed * 7919 + 17)
    ops = r.randint(3, 16)
    return {
        "buffers": r.randint(2, 5),
        "ops": ops,
        "segments": r.randint(1, min(4, ops)),
        "alias_rate": r.choice([0.0, 0.3, 0.6]),
        "overlap_rate": r.choice([0.0, 0.3, 0.6]),
        "rng_rate": r.choice([0.0, 0.3, 0.6]),
        "int_write_rate": r.choice([0.0, 0.1, 0.2]),
    }


def _program(seed: int, **extra: Any):
    C = require_extension()
    knobs = _knobs(seed)
    knobs.update(extra)
    return C.contract.generate_program(seed, **knobs)


# ------------------------------------------------------------ reference suites


def suite_numeric(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Scalar outputs reproduced exactly, reverse vs forward-mode gradients, and a control
    replay that reads the final storage instead of versions (SPEC 2.4, numeric suite).

    Args:
        seed: first program seed (programs use ``seed .. seed + programs - 1``).
        programs: number of programs.
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    bar = _Progress("numeric", programs, quiet)
    exact = detected = coords = unsupported = 0
    worst = 0.0
    for i in range(programs):
        r = C.contract.check_numeric(_program(seed + i))
        exact += r["outputs_exact"]
        detected += r["control_detected"]
        coords += r["coordinates"]
        unsupported += r["unsupported"]
        worst = max(worst, r["max_grad_mismatch"])
        bar.update(i + 1)
    m = {
        "programs": programs,
        "outputs_exact": exact,
        "max_grad_mismatch_vs_forward_jacobian": worst,
        "gradient_coordinates": coords,
        "unsupported_coordinates": unsupported,
        "control_detected": detected,
    }
    t = [
        _target(
            "scalar outputs exact",
            f"{programs}/{programs}",
            f"{exact}/{programs}",
            exact == programs,
        ),
        _target(
            "max gradient mismatch", "<= 1e-15 (source 8.88e-16)", f"{worst:.3g}", worst <= 1e-15
        ),
        _target(
            "final-storage control detected",
            f"{programs}/{programs}",
            f"{detected}/{programs}",
            detected == programs,
        ),
    ]
    return SuiteResult(
        suite="numeric", params={"seed": seed, "programs": programs}, measured=m, targets=t
    )


def suite_bytes(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """The byte rule P(B0, R0) = (B_T, R_T) per segment: snapshot replay, region undo/redo,
    read-set, guard, and replay from a wrong generator state (SPEC 2.4, byte suite).

    Args:
        seed: first program seed.
        programs: number of programs (inputs).
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    bar = _Progress("bytes", programs, quiet)
    keys = ["snapshot_ok", "undo_ok", "redo_ok", "readset_ok", "wrong_rng_detected"]
    whole = dict.fromkeys(keys, 0)
    segments = guard_ok = guard_refused = control_wrong = ops = 0
    for i in range(programs):
        r = C.contract.check_bytes(
            _program(seed + i, cross_width_aliases=True, ensure_overwrite=False)
        )
        for k in keys:
            whole[k] += r[k] == r["segments"]
        segments += r["segments"]
        guard_ok += r["guard_ok"]
        guard_refused += r["guard_refused"]
        control_wrong += r["no_restore_wrong"]
        ops += r["storage_ops"]
        bar.update(i + 1)
    m = {
        "programs": programs,
        "segments": segments,
        "storage_ops": ops,
        **{f"inputs_{k}": v for k, v in whole.items()},
        "guard_segments_exact": guard_ok,
        "guard_segments_refused": guard_refused,
        "control_replay_from_final_bytes_wrong_segments": control_wrong,
    }
    t = [
        _target(
            "snapshot replay matches",
            f"{programs}/{programs}",
            f"{whole['snapshot_ok']}/{programs}",
            whole["snapshot_ok"] == programs,
        ),
        _target(
            "region undo matches (undo to B0, replay to B_T, redo to end)",
            f"{programs}/{programs}",
            f"{min(whole['undo_ok'], whole['redo_ok'])}/{programs}",
            whole["undo_ok"] == programs and whole["redo_ok"] == programs,
        ),
        _target(
            "read-set replay matches",
            f"{programs}/{programs}",
            f"{whole['readset_ok']}/{programs}",
            whole["readset_ok"] == programs,
        ),
        _target(
            "guard exact or refused, never wrong",
            f"{segments}",
            f"{guard_ok}+{guard_refused}",
            guard_ok + guard_refused == segments,
        ),
        _target(
            "wrong generator state detected",
            f"{programs}/{programs}",
            f"{whole['wrong_rng_detected']}/{programs}",
            whole["wrong_rng_detected"] == programs,
        ),
    ]
    return SuiteResult(
        suite="bytes",
        params={"seed": seed, "programs": programs, "cross_width_aliases": True},
        measured=m,
        targets=t,
    )


def suite_engines(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Checkpointed backward with every preservation engine of the reference semantics:
    each segment replayed newest first from what its engine restores (SPEC 2.4, engines).

    Args:
        seed: first program seed.
        programs: number of programs; each runs under every engine.
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    bar = _Progress("engines", programs, quiet)
    per: dict[str, dict[str, Any]] = {
        e: {
            "runs": 0,
            "refused": 0,
            "max_grad_error": 0.0,
            "max_diff_eager": 0.0,
            "restored": 0,
            "repeat_identical": 0,
            "retained_bytes": 0,
        }
        for e in (*REFERENCE_ENGINES, "none")
    }
    for i in range(programs):
        p = _program(seed + i, ensure_overwrite=False)
        for e in (*REFERENCE_ENGINES, "none"):
            r = C.contract.check_engine(p, e)
            d = per[e]
            d["runs"] += 1
            if r["refused"]:
                d["refused"] += 1
                continue
            d["max_grad_error"] = max(d["max_grad_error"], r["max_grad_error"])
            d["max_diff_eager"] = max(d["max_diff_eager"], r["max_diff_eager"])
            d["restored"] += r["state_restored"]
            d["repeat_identical"] += r["repeat_identical"]
            d["retained_bytes"] += r["retained_bytes"]
        bar.update(i + 1)
    worst = max(per[e]["max_grad_error"] for e in REFERENCE_ENGINES)
    exact_runs = sum(per[e]["runs"] - per[e]["refused"] for e in REFERENCE_ENGINES)
    restored = sum(per[e]["restored"] for e in REFERENCE_ENGINES)
    repeated = sum(per[e]["repeat_identical"] for e in REFERENCE_ENGINES)
    none = per["none"]
    none_wrong = none["max_diff_eager"]
    m = {"programs": programs, "engines": per, "max_grad_error": worst}
    t = [
        _target(
            f"max gradient error, {programs} programs x {len(REFERENCE_ENGINES)} engines",
            "<= 1.56e-15",
            f"{worst:.3g}",
            worst <= 1.56e-15,
        ),
        _target(
            "live state restored after backward",
            f"{exact_runs}",
            f"{restored}",
            restored == exact_runs,
        ),
        _target(
            "repeated backward identical", f"{exact_runs}", f"{repeated}", repeated == exact_runs
        ),
        _target(
            "guard refuses instead of answering when state changed",
            "refused only",
            f"{per['guard']['refused']} refused, "
            f"max diff of the rest {per['guard']['max_diff_eager']:.3g}",
            per["guard"]["max_diff_eager"] == 0.0,
        ),
        _target(
            "control (no preservation, generator restored) is wrong somewhere",
            "> 0",
            f"max diff {none_wrong:.3g}",
            none_wrong > 0,
        ),
    ]
    return SuiteResult(
        suite="engines", params={"seed": seed, "programs": programs}, measured=m, targets=t
    )


def suite_complex_step(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Complex-step derivatives (h = 1e-30) against reverse accumulation (SPEC 2.4).

    Args:
        seed: first program seed.
        programs: number of programs.
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    bar = _Progress("complex-step", programs, quiet)
    coords = unsupported = 0
    worst = 0.0
    for i in range(programs):
        r = C.contract.check_complex_step(_program(seed + i, buffers=4, min_elems=12, max_elems=16))
        coords += r["coordinates"]
        unsupported += r["unsupported"]
        worst = max(worst, r["max_mismatch"])
        bar.update(i + 1)
    m = {
        "programs": programs,
        "coordinates": coords,
        "unsupported_coordinates": unsupported,
        "max_mismatch": worst,
    }
    t = [
        _target(
            "coordinates", ">= 4,544 (at 96 programs)", f"{coords}", coords >= 4544 * programs / 96
        ),
        _target("max mismatch", "<= 1e-15", f"{worst:.3g}", worst <= 1e-15),
    ]
    return SuiteResult(
        suite="complex-step", params={"seed": seed, "programs": programs}, measured=m, targets=t
    )


ALIAS_WORKLOADS = {
    # Typed aliases everywhere: float32/int32 views over float64 storage and back.
    "typed-alias": {
        "alias_rate": 0.8,
        "overlap_rate": 0.2,
        "rng_rate": 0.3,
        "int_write_rate": 0.2,
        "cross_width_aliases": True,
    },
    # Ring-buffer / queue style: many overlapping shifted writes, noise.
    "queue": {
        "alias_rate": 0.3,
        "overlap_rate": 0.8,
        "rng_rate": 0.5,
        "int_write_rate": 0.1,
        "cross_width_aliases": True,
    },
    # Counters: many integer writes on gradient paths (float gradients unsupported).
    "counters": {
        "alias_rate": 0.5,
        "overlap_rate": 0.3,
        "rng_rate": 0.2,
        "int_write_rate": 0.5,
        "cross_width_aliases": True,
    },
}


def suite_alias_stress(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Joint alias stress: ``programs`` seeds x 3 workloads x 2 inputs, 16 storage ops each;
    every supported recovery (5 engines) equal in bytes, generator state, alias storage and
    repeated backward; float gradients through integer writes counted as unsupported.

    Args:
        seed: first seed.
        programs: number of seeds (source: 50).
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    bar = _Progress("alias-stress", programs * len(ALIAS_WORKLOADS), quiet)
    inputs = ops = recoveries = supported = equal = refused = unsupported_coords = 0
    coords = 0
    done = 0
    for i in range(programs):
        for knobs in ALIAS_WORKLOADS.values():
            for init in (1, 2):
                p = C.contract.generate_program(
                    seed + i,
                    buffers=3,
                    ops=16,
                    segments=4,
                    init_seed=init * 1000003 + seed + i,
                    ensure_overwrite=False,
                    **knobs,
                )
                inputs += 1
                ops += p.num_writes
                b = C.contract.check_bytes(p)
                bytes_ok = (
                    b["snapshot_ok"]
                    == b["undo_ok"]
                    == b["redo_ok"]
                    == b["readset_ok"]
                    == b["wrong_rng_detected"]
                    == b["segments"]
                )
                ev = C.contract.evaluate(p)
                unsupported_coords += sum(g is None for g in ev["grad"])
                coords += len(ev["grad"])
                for e in REFERENCE_ENGINES:
                    recoveries += 1
                    r = C.contract.check_engine(p, e)
                    if r["refused"]:
                        refused += 1
                        continue
                    supported += 1
                    equal += bool(
                        bytes_ok
                        and r["state_restored"]
                        and r["repeat_identical"]
                        and r["max_diff_eager"] == 0.0
                    )
            done += 1
            bar.update(done)
    m = {
        "seeds": programs,
        "workloads": list(ALIAS_WORKLOADS),
        "inputs": inputs,
        "storage_ops": ops,
        "recoveries": recoveries,
        "supported_recoveries": supported,
        "equal_recoveries": equal,
        "guard_refusals": refused,
        "gradient_coordinates": coords,
        "unsupported_coordinates": unsupported_coords,
    }
    t = [
        _target("inputs", "300 (at 50 seeds)", f"{inputs}", inputs == programs * 6),
        _target("storage ops", "4,800 (at 50 seeds)", f"{ops}", ops == programs * 96),
        _target(
            "supported recoveries equal (bytes, generator, alias storage, repeat)",
            "all",
            f"{equal}/{supported}",
            equal == supported,
        ),
        _target(
            "float gradients through integer writes",
            "unsupported, never a value",
            f"{unsupported_coords} unsupported",
            True,
        ),
    ]
    return SuiteResult(
        suite="alias-stress", params={"seed": seed, "seeds": programs}, measured=m, targets=t
    )


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


# ------------------------------------------------------------ cohort, JAX family

JAX_METHODS = (
    "jax-eager",
    "jax-torch-draws",
    "jax-checkpoint",
    "jax-checkpoint-dots",
    "jax-checkpoint-jit",
    "jax-inplace",
    "jax-numpy-checkpoint",
    "jax-holder-eager",
    "jax-holder-checkpoint",
)
"""One execution each per cohort program (see :func:`_run_jax`): ``jax-eager`` is the
reference; ``jax-torch-draws`` checks the lowering against torch eager; the three
``jax-checkpoint*`` are the functional conditions; ``jax-inplace`` and
``jax-numpy-checkpoint`` are in-place executions, ``jax-holder-*`` an impure holder."""
JAX_FUNCTIONAL = ("jax-checkpoint", "jax-checkpoint-dots", "jax-checkpoint-jit")
JAX_TOLERANCE = 1e-12
"""Relative tolerance of the two comparisons that cannot be bitwise: ``jax-torch-draws``
(XLA's and torch's float64 ``tanh``/``sin``/``sigmoid`` are different implementations) and
``jax-checkpoint-jit`` (XLA fuses the compiled program differently from op-by-op eager, and
differently with and without rematerialization: a few ulps). Every other JAX comparison is
bitwise."""


def _jax_condition(spec: CohortSpec, method: str) -> str:
    if method in ("jax-inplace", "jax-numpy-checkpoint"):
        return "in-place"
    if method.startswith("jax-holder"):
        return "impure holder"
    return _condition(spec, True)


def _jax_rejection(exc: Exception) -> bool:
    """True if ``exc`` is JAX refusing the program (not a bug of this suite): a JAX tracer
    error (leaked tracer, array conversion, concretization) or the immutable-array TypeError."""
    import jax

    if isinstance(exc, jax.errors.JAXTypeError):
        return True
    return isinstance(exc, TypeError) and "immutable" in str(exc)


def _jax_constants(spec: CohortSpec) -> dict[str, Any]:
    """The torch program's initial values (parameter, input, buffers, linspace constants) as
    NumPy arrays, so both frameworks start from the same bytes."""
    module = CohortModule(spec)
    d, dt = spec.d, torch.float64
    return {
        "w": module.w.detach().numpy().copy(),
        "x": _cohort_inputs(spec).detach().numpy().copy(),
        "state": {k: b.numpy().copy() for k, b in module.named_buffers()},
        "local_state": torch.linspace(-1.0, 1.0, d + 2, dtype=dt).numpy(),
        "local_q": torch.linspace(0.5, -0.5, d, dtype=dt).numpy(),
        "loss_w": torch.linspace(0.5, 1.5, d, dtype=dt).numpy(),
    }


def _torch_draws(spec: CohortSpec) -> tuple[Any, Any]:
    """The noise and the dropout scale torch eager draws in segment A: the first draws of the
    explicit generator and of the default generator seeded as in :func:`_run_cohort`."""
    d = spec.d
    noise = None
    if spec.explicit_noise:
        g = torch.Generator().manual_seed(spec.seed + 1)
        noise = torch.rand(d, generator=g, dtype=torch.float64).numpy()
    torch.manual_seed(spec.seed + 3)
    mask = F.dropout(torch.ones(d, dtype=torch.float64), spec.dropout, training=True)
    return noise, mask.numpy()


def _jax_segments(spec: CohortSpec, c: dict[str, Any], write: str = "functional", buf0=None):
    """The program lowered to JAX: ``segment_a(w, x, state, keys, draws) -> (y, stats, keys)``
    and ``segment_b(y, state) -> (z, state)``, the same math as :class:`CohortModule`.

    ``write="functional"`` writes with ``x.at[i].set(v)`` (a new array); ``"inplace"`` writes
    ``buf[i] = v`` like the torch code, on a JAX array (``buf0=None``) or on the NumPy buffer
    ``buf0``. Random draws come from explicit keys ``(default, noise)``, split once per draw
    like the torch program's two generators, unless ``draws = (noise, mask)`` is given.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    d = spec.d
    fs = {"tanh": jnp.tanh, "sin": jnp.sin, "sigmoid": jax.nn.sigmoid}

    def put(arr, idx, val):
        if write == "functional":
            return arr.at[idx].set(val)
        arr[idx] = val  # JAX arrays refuse; NumPy refuses a tracer
        return arr

    def segment_a(w, x, state, keys, draws):
        h = w @ x
        buf = put(jnp.zeros(d + 2, h.dtype) if buf0 is None else buf0, slice(0, d), h)
        if spec.kind == "hidden":
            st, stats, q = state["hidden"], state["stats"], state["queue"][0]
        else:
            st, stats = jnp.asarray(c["local_state"]), jnp.zeros(d + 2, jnp.float32)
            q = jnp.asarray(c["local_q"])
        for op in spec.ops:
            if op[0] == "mix":
                _, a, b, n, f, c1, c2, bias = op
                buf = put(
                    buf, slice(b, b + n), fs[f](c1 * buf[a : a + n] + c2 * st[a : a + n] + bias)
                )
            elif op[0] == "alias32":
                _, a, n = op
                val = lax.stop_gradient(buf[a : a + n]).astype(jnp.float32)
                stats = put(stats, slice(a, a + n), val)
                counter = lax.bitcast_convert_type(stats, jnp.int32)  # typed alias
                stats = lax.bitcast_convert_type(counter.at[d + 1].add(1), jnp.float32)
            else:  # "rawcopy": the functional copy reads the source before writing
                buf = put(buf, slice(1, 1 + op[1]), buf[0 : op[1]])
        y = buf[:d] + q * 0.5
        kd, kn = keys
        if draws is None:
            noise = None
            if spec.explicit_noise:
                kn, sub = jax.random.split(kn)
                noise = jax.random.uniform(sub, (d,), jnp.float64)
            kd, sub = jax.random.split(kd)
            keep = jax.random.bernoulli(sub, 1 - spec.dropout, (d,))
            mask = keep.astype(jnp.float64) / (1 - spec.dropout)
        else:
            noise, mask = draws
        if spec.explicit_noise:
            y = y + spec.explicit_noise * noise
        return jnp.tanh(y) * mask, stats, (kd, kn)

    def segment_b(y, state):
        if spec.kind == "hidden":
            m, yd = spec.momentum, lax.stop_gradient(y)
            hidden = state["hidden"].at[:d].set(state["hidden"][:d] * m + (1 - m) * yd)
            counter = lax.bitcast_convert_type(state["stats"], jnp.int32).at[0].add(1)
            state = {
                "hidden": hidden,
                "stats": lax.bitcast_convert_type(counter, jnp.float32),
                "queue": state["queue"].at[state["ptr"] % 3].set(yd),
                "ptr": state["ptr"] + 1,
            }
        return jnp.sin(y) * 0.5, state

    return segment_a, segment_b


def _run_jax(spec: CohortSpec, method: str, c: dict[str, Any]) -> dict[str, Any]:
    """One JAX execution of ``spec``: forward through both segments, value and gradient
    w.r.t. ``(x, w)``, then one more draw from each key (the world moves on, as in torch).
    Raises whatever JAX raises."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    d = spec.d
    keys0 = (jax.random.PRNGKey(spec.seed + 3), jax.random.PRNGKey(spec.seed + 1))
    state0 = {k: jnp.asarray(v) for k, v in c["state"].items()}
    loss_w = jnp.asarray(c["loss_w"])
    w, x = jnp.asarray(c["w"]), jnp.asarray(c["x"])
    policy = {
        "jax-checkpoint-dots": jax.checkpoint_policies.dots_saveable,
    }.get(method)
    wrap = (lambda f: jax.checkpoint(f, policy=policy)) if "checkpoint" in method else None
    draws = None
    if method == "jax-torch-draws":
        draws = tuple(None if v is None else jnp.asarray(v) for v in _torch_draws(spec))
    if method.startswith("jax-holder"):
        seg_a, seg_b = _jax_segments(spec, c)
        holder = types.SimpleNamespace(state=dict(state0), keys=keys0)  # impure holder

        def a_impure(w, x):
            y, stats, holder.keys = seg_a(w, x, holder.state, holder.keys, None)
            if spec.kind == "hidden":
                holder.state["stats"] = stats
            return y

        def b_impure(y):
            z, holder.state = seg_b(y, holder.state)
            return z

        if wrap:
            a_impure, b_impure = wrap(a_impure), wrap(b_impure)

        def loss_fn(x, w):
            y = a_impure(w, x)
            return (y * loss_w).sum() + b_impure(y).sum(), None

    else:
        if method in ("jax-inplace", "jax-numpy-checkpoint"):
            buf0 = np.zeros(d + 2) if method == "jax-numpy-checkpoint" else None
            seg_a, seg_b = _jax_segments(spec, c, write="inplace", buf0=buf0)
        else:
            seg_a, seg_b = _jax_segments(spec, c)
        if wrap:
            seg_a, seg_b = wrap(seg_a), wrap(seg_b)

        def loss_fn(x, w):
            y, stats, keys = seg_a(w, x, state0, keys0, draws)
            state = {**state0, "stats": stats} if spec.kind == "hidden" else state0
            z, state = seg_b(y, state)
            return (y * loss_w).sum() + z.sum(), (state, keys)

    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    if method == "jax-checkpoint-jit":
        grad_fn = jax.jit(grad_fn)
    (loss, aux), grads = grad_fn(x, w)
    if method.startswith("jax-holder"):
        state, keys = holder.state, holder.keys
    else:
        state, keys = aux
    keys = tuple(jax.random.split(k)[0] for k in keys)  # later draws move the keys
    return {
        "loss": np.asarray(loss),
        "grads": [np.asarray(g) for g in grads],
        "state": {k: np.asarray(v) for k, v in state.items()},
        "rng": [np.asarray(k) for k in keys],
    }


def _torch_as_jax(ref: dict[str, Any]) -> dict[str, Any]:
    """Torch eager's result in :func:`_run_jax`'s format (generator states left out: torch
    generators and threefry keys are not comparable)."""
    import numpy as np

    dtypes = {"hidden": np.float64, "stats": np.float32, "queue": np.float64, "ptr": np.int64}
    state = {
        k: np.frombuffer(b, dt).copy()
        for (k, dt), b in zip(dtypes.items(), ref["state"], strict=True)
    }
    return {
        "loss": ref["loss"].numpy(),
        "grads": [g.numpy() for g in ref["grads"]],
        "state": state,
        "rng": None,
    }


def _jax_compare(
    spec: CohortSpec, ref: dict[str, Any], got: dict[str, Any], tol: float | None
) -> dict[str, Any]:
    """Outcome of one execution against a reference in :func:`_run_jax`'s format.

    ``tol=None``: bitwise (loss, gradients, every state array, both keys). Otherwise loss,
    gradients and float64 state within ``tol`` relative (``|a - b| <= tol * max(1, |b|)``),
    the float32 statistics within one ulp except the int32 counters (exact), the pointer and
    the keys exact. ``grad_diff`` is the largest relative gradient difference."""
    import numpy as np

    def rel(a, b) -> float:
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        return float((abs(a - b) / np.maximum(1.0, abs(b))).max())

    def same(a, b) -> bool:
        return np.asarray(a).tobytes() == np.asarray(b).tobytes()

    pairs = list(zip(ref["grads"], got["grads"], strict=True))
    diff = max(rel(g, r) for r, g in pairs)
    rs, gs = ref["state"], got["state"]
    bitwise = (
        same(ref["loss"], got["loss"])
        and all(same(r, g) for r, g in pairs)
        and all(same(rs[k].ravel(), gs[k].ravel()) for k in rs)
    )
    keys_ok = ref["rng"] is None or all(
        same(r, g) for r, g in zip(ref["rng"], got["rng"], strict=True)
    )
    if tol is None:
        ok = bitwise
    else:
        d = spec.d
        ri = rs["stats"].view(np.int32).astype(np.int64)
        gi = gs["stats"].view(np.int32).astype(np.int64)
        ok = (
            rel(got["loss"], ref["loss"]) <= tol
            and diff <= tol
            and all(rel(gs[k], rs[k]) <= tol for k in ("hidden", "queue"))
            and abs(ri[:d] - gi[:d]).max() <= 1
            and same(ri[d:], gi[d:])
            and same(rs["ptr"].ravel(), gs["ptr"].ravel())
        )
    return {
        "outcome": "matched" if ok and keys_ok else "wrong",
        "grad_diff": diff,
        "bitwise": bool(bitwise and keys_ok),
    }


def _cohort_jax(spec: CohortSpec, torch_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every JAX execution of one program (float64). ``torch_ref`` is torch eager's result
    (for overlapping-copy programs, which torch rejects, the program with the copy made
    through a temporary)."""
    c = _jax_constants(spec)
    records = []
    ref = _run_jax(spec, "jax-eager", c)
    for method in JAX_METHODS:
        rec: dict[str, Any] = {
            "family": "jax",
            "seed": spec.seed,
            "kind": spec.kind,
            "method": method,
            "condition": _jax_condition(spec, method),
        }
        if method == "jax-eager":
            rec.update(outcome="reference", grad_diff=0.0)
            records.append(rec)
            continue
        rec["reference"] = "torch-eager" if method == "jax-torch-draws" else "jax-eager"
        if method == "jax-torch-draws" and spec.kind == "overlap":
            rec["reference"] = "torch-eager, overlapping copy through a temporary"
        try:
            got = _run_jax(spec, method, c)
        except Exception as exc:
            if not _jax_rejection(exc):
                raise  # a bug of this suite, not a finding
            rec["outcome"] = "rejected"
            rec["error"] = type(exc).__name__
            rec["message"] = str(exc).splitlines()[0][:200]
        else:
            if method == "jax-torch-draws":
                rec.update(_jax_compare(spec, _torch_as_jax(torch_ref), got, JAX_TOLERANCE))
            else:
                tol = JAX_TOLERANCE if method == "jax-checkpoint-jit" else None
                rec.update(_jax_compare(spec, ref, got, tol))
        records.append(rec)
    return records


def suite_cohort(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Generated programs lowered to torch modules, run eagerly, under
    ``torch.utils.checkpoint`` (both variants) and ``torch_replay.checkpoint`` (each engine,
    with and without ``state=``), with RNG preservation on and off; one record per
    execution. Where JAX is importable, each program also runs as the JAX family
    (:data:`JAX_METHODS`, float64 on CPU): functional versions under ``jax.checkpoint`` and
    the in-place / impure-holder variants JAX must reject (SPEC 2.4, cohort).

    Args:
        seed: first seed (source: 420000); seeds ``seed .. seed + programs - 1``.
        programs: number of seeds (source: 50); each gives 5 programs (2 local-view,
            2 hidden-buffer, 1 raw overlapping copy).
        quiet: no progress bar.

    Returns:
        The suite's result (``records`` holds every execution).
    """
    try:
        import jax
    except ImportError:
        jax = None
        jax_status = "not installed: JAX family skipped (torch side only)"
    else:
        jax_status = f"jax {jax.__version__} on {jax.default_backend()}, float64"
    specs = [
        _cohort_spec(s * 10 + k, kind)
        for s in range(seed, seed + programs)
        for k, kind in enumerate(COHORT_KINDS)
    ]
    bar = _Progress("cohort", len(specs), quiet)
    records: list[dict[str, Any]] = []
    jax_records: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        try:
            ref = _run_cohort(spec, "eager", True)
            records.append(
                {
                    "seed": spec.seed,
                    "kind": spec.kind,
                    "method": "eager",
                    "preserve_rng_state": True,
                    "condition": _condition(spec, True),
                    "outcome": "reference",
                    "grad_diff": 0.0,
                }
            )
        except Exception as exc:  # noqa: BLE001 - the outcome is the record
            ref = None
            records.append(
                {
                    "seed": spec.seed,
                    "kind": spec.kind,
                    "method": "eager",
                    "preserve_rng_state": True,
                    "condition": _condition(spec, True),
                    "outcome": "rejected",
                    "error": type(exc).__name__,
                }
            )
        for preserve in (True, False) if spec.kind != "overlap" else (True,):
            for method in COHORT_METHODS:
                rec = {
                    "seed": spec.seed,
                    "kind": spec.kind,
                    "method": method,
                    "preserve_rng_state": preserve,
                    "condition": _condition(spec, preserve),
                }
                try:
                    got = _run_cohort(spec, method, preserve)
                    rec["outcome"], rec["grad_diff"] = _classify(ref, got)
                except Exception as exc:  # noqa: BLE001
                    rec["outcome"] = "rejected"
                    rec["error"] = type(exc).__name__
                    rec["message"] = str(exc).splitlines()[0][:200]
                records.append(rec)
        if jax is not None:
            torch_ref = ref
            if spec.kind == "overlap":  # torch rejects it: compare with the temporary copy
                ops = [("tempcopy", *o[1:]) if o[0] == "rawcopy" else o for o in spec.ops]
                torch_ref = _run_cohort(dataclasses.replace(spec, ops=ops), "eager", True)
            with jax.enable_x64(True):
                jax_records.extend(_cohort_jax(spec, torch_ref))
        bar.update(i + 1)
    conditions = ("local view", "hidden buffer", "overlapping copy", "RNG off")
    summary: dict[str, dict[str, dict[str, int]]] = {}
    for c in conditions:
        summary[c] = {}
        for method in ("eager", *COHORT_METHODS):
            cnt = {"matched": 0, "wrong": 0, "rejected": 0}
            for r in records:
                if r["condition"] == c and r["method"] == method and r["outcome"] in cnt:
                    cnt[r["outcome"]] += 1
            if sum(cnt.values()):
                summary[c][method] = cnt
    header = ["condition", "method", "matched", "wrong", "rejected"]
    table = [header] + [
        [c, meth, str(v["matched"]), str(v["wrong"]), str(v["rejected"])]
        for c, ms in summary.items()
        for meth, v in ms.items()
    ]

    def count(cond: str, methods: Iterable[str], outcome: str) -> tuple[int, int]:
        rs = [r for r in records if r["condition"] == cond and r["method"] in methods]
        return sum(r["outcome"] == outcome for r in rs), len(rs)

    torch_m = ("torch-nonreentrant", "torch-reentrant")
    ours = ("tr-auto", "tr-snapshot", "tr-journal", "tr-readset", "tr-auto-reentrant")
    lv = count("local view", torch_m, "matched")
    hb = count("hidden buffer", torch_m, "wrong")
    ol = count("overlapping copy", ("eager", *COHORT_METHODS), "rejected")
    rng = count("RNG off", torch_m, "wrong")
    our_right = [count(c, ours, "matched") for c in ("local view", "hidden buffer", "RNG off")]
    # Every torch_replay method, except the one that opts out of everything (no state=,
    # preserve_rng_state=False): that one behaves as torch does and is reported apart.
    our_wrong = sum(count(c, COHORT_METHODS[2:], "wrong")[0] for c in conditions if c != "RNG off")
    our_wrong += count("RNG off", COHORT_METHODS[2:-1], "wrong")[0]
    nostate_rng_off = count("RNG off", ("tr-auto-nostate",), "wrong")
    max_diff = max(
        (
            r.get("grad_diff", 0.0)
            for r in records
            if r["method"] in ours and r["outcome"] == "matched"
        ),
        default=0.0,
    )
    jax_summary: dict[str, dict[str, dict[str, int]]] = {}
    for r in jax_records:
        cnt = jax_summary.setdefault(r["condition"], {}).setdefault(
            r["method"], {"matched": 0, "wrong": 0, "rejected": 0}
        )
        if r["outcome"] in cnt:
            cnt[r["outcome"]] += 1
    table += [
        [c, meth, str(v["matched"]), str(v["wrong"]), str(v["rejected"])]
        for c, ms in jax_summary.items()
        for meth, v in ms.items()
        if sum(v.values())
    ]
    m = {
        "seeds": f"{seed}-{seed + programs - 1}",
        "programs": len(specs),
        "records": len(records) + len(jax_records),
        "torch_records": len(records),
        "jax_records": len(jax_records),
        "jax": jax_status,
        "summary": summary,
        "jax_summary": jax_summary,
        "max_grad_diff_ours_matched": max_diff,
        "nostate_rng_off_wrong": f"{nostate_rng_off[0]}/{nostate_rng_off[1]}",
    }
    t = [
        _target(
            "torch native, local view",
            "right on all (source 200/200)",
            f"{lv[0]}/{lv[1]} right",
            lv[0] == lv[1],
        ),
        _target(
            "torch native, hidden buffer",
            "wrong on all (source 200/200)",
            f"{hb[0]}/{hb[1]} wrong",
            hb[0] == hb[1],
        ),
        _target(
            "raw overlapping copy",
            "rejected even eagerly (source 100)",
            f"{ol[0]}/{ol[1]} rejected",
            ol[0] == ol[1],
        ),
        _target(
            "torch native, RNG preservation off",
            "diverges on all non-copy (source 400)",
            f"{rng[0]}/{rng[1]} wrong",
            rng[0] == rng[1],
        ),
        _target(
            "ours (state declared: auto/snapshot/journal/readset, reentrant auto)",
            "right on every supported condition",
            ", ".join(f"{a}/{b}" for a, b in our_right),
            all(a == b for a, b in our_right),
        ),
        _target(
            "ours never silently wrong (incl. guard; no state= with RNG on)",
            "0 wrong",
            f"{our_wrong} wrong",
            our_wrong == 0,
        ),
        _target(
            "ours with no state= and preserve_rng_state=False (opted out, as torch)",
            "reported",
            f"{nostate_rng_off[0]}/{nostate_rng_off[1]} wrong",
            True,
        ),
    ]
    if jax is not None:
        t += _jax_targets(jax_records)
        m["max_rel_diff_jax_vs_torch"] = max(
            (r["grad_diff"] for r in jax_records if r["method"] == "jax-torch-draws"),
            default=0.0,
        )
    return SuiteResult(
        suite="cohort",
        params={"seed": seed, "seeds": programs},
        measured=m,
        targets=t,
        records=records + jax_records,
        table=table,
    )


def _jax_targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def count(methods: Iterable[str], outcome: str) -> tuple[int, int]:
        rs = [r for r in records if r["method"] in methods]
        return sum(r["outcome"] == outcome for r in rs), len(rs)

    fn = count(JAX_FUNCTIONAL, "matched")
    bitwise = sum(bool(r.get("bitwise")) for r in records if r["method"] in JAX_FUNCTIONAL)
    tv = count(("jax-torch-draws",), "matched")
    ip = count(("jax-inplace", "jax-numpy-checkpoint"), "rejected")
    ho = count(("jax-holder-checkpoint",), "rejected")
    he = count(("jax-holder-eager",), "matched")
    return [
        _target(
            "JAX functional under jax.checkpoint (nothing saved, dots saved, jit) vs JAX "
            f"eager: bitwise, jit within {JAX_TOLERANCE:g}",
            "right on all (source 500)",
            f"{fn[0]}/{fn[1]} right ({bitwise} bitwise)",
            fn[0] == fn[1],
        ),
        _target(
            "JAX lowering fed torch's draws vs torch eager",
            f"within {JAX_TOLERANCE:g} relative on all",
            f"{tv[0]}/{tv[1]} right",
            tv[0] == tv[1],
        ),
        _target(
            "JAX in-place execution (JAX array; NumPy buffer under jax.checkpoint)",
            "rejected",
            f"{ip[0]}/{ip[1]} rejected",
            ip[0] == ip[1],
        ),
        _target(
            "JAX impure-holder checkpointing",
            "rejected",
            f"{ho[0]}/{ho[1]} rejected",
            ho[0] == ho[1],
        ),
        _target(
            "JAX impure holder without jax.checkpoint (control)",
            "reported",
            f"{he[0]}/{he[1]} right",
            True,
        ),
    ]


# ------------------------------------------------------------------------ CLI

_RUNNERS: dict[str, Callable[[int, int, bool], SuiteResult]] = {
    "numeric": suite_numeric,
    "bytes": suite_bytes,
    "engines": suite_engines,
    "complex-step": suite_complex_step,
    "alias-stress": suite_alias_stress,
    "cohort": suite_cohort,
}


def run_suite(
    name: str, *, seed: int | None = None, programs: int | None = None, quiet: bool = True
) -> SuiteResult:
    """Run one suite.

    Args:
        name: one of :data:`SUITES`.
        seed: first seed (default: 0, the cohort 420000).
        programs: size (default: :data:`DEFAULT_SIZES`).
        quiet: no progress bar.

    Returns:
        The suite's result.

    Raises:
        ValueError: unknown suite name or a size below 1.
    """
    if name not in _RUNNERS:
        raise ValueError(f"suite must be one of {SUITES}, got {name!r}")
    seed = DEFAULT_SEEDS.get(name, 0) if seed is None else seed
    programs = DEFAULT_SIZES[name] if programs is None else programs
    if programs < 1:
        raise ValueError(f"--programs must be at least 1, got {programs}")
    start = time.monotonic()
    result = _RUNNERS[name](seed, programs, quiet)
    result.seconds = time.monotonic() - start
    return result


def _markdown(results: list[SuiteResult], command: str) -> str:
    lines = [
        "# Replay contract suites",
        "",
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores.",
        "",
    ]
    for r in results:
        lines += [
            f"## {r.suite} ({'PASS' if r.passed else 'FAIL'}, {r.seconds:.1f} s)",
            "",
            f"Parameters: `{json.dumps(r.params)}`",
            "",
            "| target | required | measured | ok |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {t['name']} | {t['target']} | {t['measured']} | {'yes' if t['passed'] else 'NO'} |"
            for t in r.targets
        ]
        if r.suite == "cohort":
            lines += [
                "",
                f"JAX: {r.measured['jax']}. Records: {r.measured['records']} "
                f"({r.measured['programs']} programs): torch {r.measured['torch_records']}, "
                f"JAX {r.measured.get('jax_records', 0)}.",
            ]
        if r.table:
            lines += ["", "| " + " | ".join(r.table[0]) + " |", "|" + "---|" * len(r.table[0])]
            lines += ["| " + " | ".join(row) + " |" for row in r.table[1:]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        0 if every target of every suite run is met, else 1.
    """
    ap = argparse.ArgumentParser(
        prog="python -m torch_replay.suites",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("suite", choices=[*SUITES, "all"])
    ap.add_argument("--seed", type=int, default=None, help="first seed (default per suite)")
    ap.add_argument(
        "--programs",
        type=int,
        default=None,
        help="programs per suite (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_SIZES.items())
        + ")",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the small run: " + ", ".join(f"{k} {v}" for k, v in QUICK_SIZES.items()),
    )
    ap.add_argument(
        "--out", default=None, help="directory to write suites.md and suites_<suite>.json into"
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    command = "python -m torch_replay.suites " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results = []
    for name in names:
        programs = args.programs
        if programs is None and args.quick:
            programs = QUICK_SIZES[name]
        r = run_suite(name, seed=args.seed, programs=programs, quiet=args.quiet)
        results.append(r)
        print(f"{name}: {r.seconds:.1f} s")
        if args.out:
            with open(os.path.join(args.out, f"suites_{name}.json"), "w") as f:
                # The cohort's records are many: one line each keeps the file small.
                json.dump(
                    {"command": command, **r.to_dict()},
                    f,
                    indent=None if r.records else 1,
                    default=str,
                )
        for t in r.targets:
            print(
                f"[{'ok' if t['passed'] else 'FAIL'}] {name}: {t['name']}: {t['measured']} "
                f"(target {t['target']})"
            )
    if args.out:
        with open(os.path.join(args.out, "suites.md"), "w") as f:
            f.write(_markdown(results, command))
        print(f"wrote {os.path.join(args.out, 'suites.md')}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
