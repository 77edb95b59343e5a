"""The cohort suite: runs the cohort's programs with every method and checks the targets."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .cohort_jax import JAX_FUNCTIONAL, JAX_TOLERANCE, _cohort_jax
from .cohort_program import (
    COHORT_KINDS,
    COHORT_METHODS,
    CohortSpec,
    _classify,
    _cohort_spec,
    _condition,
    _run_cohort,
)
from .report import SuiteResult, _all_of, _Progress, _target


def _record(spec: CohortSpec, method: str, preserve: bool) -> dict[str, Any]:
    """The fields every record of one execution starts with."""
    return {
        "seed": spec.seed,
        "kind": spec.kind,
        "method": method,
        "preserve_rng_state": preserve,
        "condition": _condition(spec, preserve),
    }


def suite_cohort(seed: int, programs: int, quiet: bool = False) -> SuiteResult:
    """Generated programs lowered to torch modules, run eagerly, under
    ``torch.utils.checkpoint`` (both variants) and ``torch_replay.checkpoint`` (each engine,
    with and without ``state=``), with RNG preservation on and off; one record per
    execution. Where JAX is importable, each program also runs as the JAX family
    (:data:`JAX_METHODS`, float64 on CPU): functional versions under ``jax.checkpoint`` and
    the in-place / impure-holder variants JAX must reject (design.md §2.4, cohort).

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
        eager = _record(spec, "eager", True)
        try:
            ref = _run_cohort(spec, "eager", True)
            records.append({**eager, "outcome": "reference", "grad_diff": 0.0})
        except Exception as exc:  # noqa: BLE001 - the outcome is the record
            ref = None
            records.append({**eager, "outcome": "rejected", "error": type(exc).__name__})
        for preserve in (True, False) if spec.kind != "overlap" else (True,):
            for method in COHORT_METHODS:
                rec = _record(spec, method, preserve)
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
        _all_of("torch native, local view", "right on all (source 200/200)", lv, "right"),
        _all_of("torch native, hidden buffer", "wrong on all (source 200/200)", hb, "wrong"),
        _all_of("raw overlapping copy", "rejected even eagerly (source 100)", ol, "rejected"),
        _all_of(
            "torch native, RNG preservation off",
            "diverges on all non-copy (source 400)",
            rng,
            "wrong",
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
        _all_of(
            "JAX lowering fed torch's draws vs torch eager",
            f"within {JAX_TOLERANCE:g} relative on all",
            tv,
            "right",
        ),
        _all_of(
            "JAX in-place execution (JAX array; NumPy buffer under jax.checkpoint)",
            "rejected",
            ip,
            "rejected",
        ),
        _all_of("JAX impure-holder checkpointing", "rejected", ho, "rejected"),
        _target(
            "JAX impure holder without jax.checkpoint (control)",
            "reported",
            f"{he[0]}/{he[1]} right",
            True,
        ),
    ]
