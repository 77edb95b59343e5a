"""The reference suites (numeric, bytes, engines, complex-step, alias-stress) on the
C++ replay-contract interpreter (csrc/core/contract_*.cpp), which drives the shipped
preservation engines."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._ext import require_extension
from .report import REFERENCE_ENGINES, SuiteResult, _program, _Progress, _target

# ------------------------------------------------------------ reference suites


def _per_program(
    label: str,
    programs: int,
    quiet: bool,
    check: Callable[[int], Mapping[str, Any]],
    sums: Sequence[str],
    largest: str,
) -> tuple[dict[str, int], float]:
    """``check(i)`` for every program ``i`` under a progress bar: the sums of the
    ``sums`` fields of its results and the largest ``largest`` field."""
    bar = _Progress(label, programs, quiet)
    total = dict.fromkeys(sums, 0)
    worst = 0.0
    for i in range(programs):
        r = check(i)
        for k in sums:
            total[k] += r[k]
        worst = max(worst, r[largest])
        bar.update(i + 1)
    return total, worst


def _every(name: str, done: int, programs: int) -> dict[str, Any]:
    """A target met when all ``programs`` were: ``done/programs`` against ``programs/programs``."""
    return _target(name, f"{programs}/{programs}", f"{done}/{programs}", done == programs)


def suite_numeric(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Scalar outputs reproduced exactly, reverse vs forward-mode gradients, and a control
    replay that reads the final storage instead of versions (design.md §2.4, numeric suite).

    Args:
        seed: first program seed (programs use ``seed .. seed + programs - 1``).
        programs: number of programs.
        quiet: no progress bar.

    Returns:
        The suite's result.
    """
    C = require_extension()
    n, worst = _per_program(
        "numeric",
        programs,
        quiet,
        lambda i: C.contract.check_numeric(_program(seed + i)),
        ("outputs_exact", "control_detected", "coordinates", "unsupported"),
        "max_grad_mismatch",
    )
    m = {
        "programs": programs,
        "outputs_exact": n["outputs_exact"],
        "max_grad_mismatch_vs_forward_jacobian": worst,
        "gradient_coordinates": n["coordinates"],
        "unsupported_coordinates": n["unsupported"],
        "control_detected": n["control_detected"],
    }
    t = [
        _every("scalar outputs exact", n["outputs_exact"], programs),
        _target(
            "max gradient mismatch", "<= 1e-15 (source 8.88e-16)", f"{worst:.3g}", worst <= 1e-15
        ),
        _every("final-storage control detected", n["control_detected"], programs),
    ]
    return SuiteResult(
        suite="numeric", params={"seed": seed, "programs": programs}, measured=m, targets=t
    )


def suite_bytes(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """The byte rule P(B0, R0) = (B_T, R_T) per segment: snapshot replay, region undo/redo,
    read-set, guard, and replay from a wrong generator state (design.md §2.4, byte suite).

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
        _every("snapshot replay matches", whole["snapshot_ok"], programs),
        _target(
            "region undo matches (undo to B0, replay to B_T, redo to end)",
            f"{programs}/{programs}",
            f"{min(whole['undo_ok'], whole['redo_ok'])}/{programs}",
            whole["undo_ok"] == programs and whole["redo_ok"] == programs,
        ),
        _every("read-set replay matches", whole["readset_ok"], programs),
        _target(
            "guard exact or refused, never wrong",
            f"{segments}",
            f"{guard_ok}+{guard_refused}",
            guard_ok + guard_refused == segments,
        ),
        _every("wrong generator state detected", whole["wrong_rng_detected"], programs),
    ]
    return SuiteResult(
        suite="bytes",
        params={"seed": seed, "programs": programs, "cross_width_aliases": True},
        measured=m,
        targets=t,
    )


def suite_engines(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Checkpointed backward with every preservation engine of the reference semantics:
    each segment replayed newest first from what its engine restores (design.md §2.4, engines).

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
    """Complex-step derivatives (h = 1e-30) against reverse accumulation (design.md §2.4).

    Args:
        seed: the seed of the first program, as for :func:`suite_numeric`.
        programs: how many programs to check.
        quiet: whether to hide the progress bar.

    Returns:
        The suite's measured figures and targets.
    """
    C = require_extension()
    n, worst = _per_program(
        "complex-step",
        programs,
        quiet,
        lambda i: C.contract.check_complex_step(
            _program(seed + i, buffers=4, min_elems=12, max_elems=16)
        ),
        ("coordinates", "unsupported"),
        "max_mismatch",
    )
    coords = n["coordinates"]
    m = {
        "programs": programs,
        "coordinates": coords,
        "unsupported_coordinates": n["unsupported"],
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
