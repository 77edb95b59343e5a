"""The tables of ``benchmarks/bench_inductor.py``: per-graph rows, summary, markdown."""

from __future__ import annotations

import os
import shlex
import sys
import time

import torch

# --------------------------------------------------------------------------- output


def kib(x):
    return "-" if x is None else f"{x / 1024:.1f}"


def pct(new, old):
    if new is None or old in (None, 0):
        return "-"
    return f"{100.0 * (new - old) / old:+.1f}%"


def ratio(a, b):
    return "-" if not a or b is None else f"{b / a:.2f}"


def command_line():
    exe = sys.executable
    if exe.startswith(os.getcwd() + os.sep):
        exe = os.path.relpath(exe)
    return "nice -n 10 " + shlex.join([exe, os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def _geomean(xs):
    import math

    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _cert(g):
    """The program the pass runs is at the lower bound (modelled peaks are byte-exact)."""
    return (
        g["modelled_ours"] is not None
        and g["lower_bound"] is not None
        and g["modelled_ours"] <= g["lower_bound"]
    )


def _rewrite(g):
    """Measured peak of the pass's own rewrite with its best order (deployed or not)."""
    if g["deployed"]:
        return g["measured_ours"]
    return (g["variants"].get("default") or {}).get("measured_permuted_peak")


def summarize(rows):
    graphs = [g for r in rows for g in r["graphs"]]
    regen = [g["regen"] for g in graphs if g["regen"] and "measured" in g["regen"]]
    regen_better = [x for x in regen if x["better_order"]]
    gb = [g for g in graphs if g["regen"] and g["regen"].get("better_order")]
    s = {
        "configs": len(rows),
        "graphs": len(graphs),
        "deployed": sum(g["deployed"] for g in graphs),
        "deployed_permutation": sum(g["deployed"] and g["variant"] == "default" for g in graphs),
        "deployed_variant": sum(g["deployed"] and g["variant"] != "default" for g in graphs),
        "configs_deployed": sum(any(g["deployed"] for g in r["graphs"]) for r in rows),
        "certified": sum(_cert(g) for g in graphs),
        "byte_exact": sum(g["byte_exact"] is True for g in graphs),
        "bitwise_configs": sum(bool(r["bitwise"]) for r in rows),
        "ours_above_default": sum(
            g["measured_ours"] is not None
            and g["measured_default"] is not None
            and g["measured_ours"] > g["measured_default"]
            for g in graphs
        ),
        "ours_above_reorder_off": sum(
            g["measured_ours"] is not None
            and g["measured_reorder_off"] is not None
            and g["measured_ours"] > g["measured_reorder_off"]
            for g in graphs
        ),
        "step_peak_higher": sum(
            r["step_peak_ours"] > r["step_peak_plain"]
            for r in rows
            if r["step_peak_ours"] is not None and r["step_peak_plain"] is not None
        ),
        "step_peak_lower": sum(
            r["step_peak_ours"] < r["step_peak_plain"]
            for r in rows
            if r["step_peak_ours"] is not None and r["step_peak_plain"] is not None
        ),
        "regen_graphs": len(regen_better),
        "regen_missed_prediction": sum(x["measured"] > x["predicted"] for x in regen_better),
        "regen_below_prediction": sum(x["measured"] < x["predicted"] for x in regen_better),
        "regen_worse_than_default": sum(g["regen"]["measured"] > g["measured_default"] for g in gb),
        "regen_above_ours": sum(g["regen"]["measured"] > g["measured_ours"] for g in gb),
        "regen_above_rewrite": sum(
            _rewrite(g) is not None and g["regen"]["measured"] > _rewrite(g) for g in gb
        ),
        "regen_below_rewrite": sum(
            _rewrite(g) is not None and g["regen"]["measured"] < _rewrite(g) for g in gb
        ),
        "rewrite_missed_prediction": sum(
            _rewrite(g) is not None and _rewrite(g) > g["regen"]["predicted"] for g in gb
        ),
        "regen_not_bitwise": sum(not x["bitwise"] for x in regen),
        "regen_errors": sum(1 for g in graphs if g["regen"] and "error" in g["regen"]),
        "cold_ratio_geomean": _geomean([r["cold_ours_s"] / r["cold_plain_s"] for r in rows]),
        "cold_ratio_max": max((r["cold_ours_s"] / r["cold_plain_s"] for r in rows), default=0),
        "warm_ratio_geomean": _geomean([r["warm_ours_s"] / r["warm_plain_s"] for r in rows]),
        "warm_ratio_max": max((r["warm_ours_s"] / r["warm_plain_s"] for r in rows), default=0),
        "cold_plain_total_s": sum(r["cold_plain_s"] for r in rows),
        "cold_ours_total_s": sum(r["cold_ours_s"] for r in rows),
        "warm_plain_total_s": sum(r["warm_plain_s"] for r in rows),
        "warm_ours_total_s": sum(r["warm_ours_s"] for r in rows),
    }
    return s


def render(rows, failures, started, done, tv_info, commands=None, wall_s=None):
    s = summarize(rows)
    commands = commands or [command_line()]
    lines = [
        "# Inductor pass on 20+ architectures: CPU FP32, one thread",
        "",
        *[f"Command: `{c}`" for c in commands],
        "",
        f"torch {torch.__version__}; {tv_info}. Peaks in KiB."
        + ("" if done else " **Partial: the run is still going or was cut.**"),
        "",
        "## Per graph",
        "",
        "Peaks of one call as the runtime makes it (inputs the caller holds are not counted; "
        "inputs the call owns, a backward's saved activations, count from the start and are "
        "freed at their last use), measured by the counting CPU allocator. `default` = "
        "Inductor's default program, modelled / measured; `reorder off` = measured peak of "
        "the `reorder_for_peak_memory=False` program; `ours` = the program the pass runs from "
        "the second call (`program`: the variant, `+perm` when permuted), modelled / measured; "
        "`bound` = min-cut lower bound on any order of the chosen program, `cert` = ours equals "
        "it; `rewrite meas` = measured peak of the pass's own rewrite with its best order "
        "(deployed or not); `regen` = the pass's better order fed back to Inductor's scheduler and "
        "regenerated (`benchmarks/regenerate.py`): predicted (the pass's modelled peak of "
        "that order) / measured, `-` where the pass found no better order.",
        "",
        "| mode | model | graph | units | default | reorder off | program | ours | saving | "
        "bound | cert | rewrite meas | regen pred / meas | regen vs rewrite |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for g in r["graphs"]:
            prog = g["variant"]
            if g["deployed"] and g["modelled_ours"] is not None:
                perm = g["variant"] == "default" or (
                    g["variants"].get(g["variant"], {}).get("deployed") is True
                )
                prog += " +perm" if perm else ""
            rg = g["regen"]
            if rg is None:
                regen_s, vs = "-", "-"
            elif "error" in rg:
                regen_s, vs = f"error: {rg['error'][:60]}", "-"
            else:
                regen_s = f"{kib(rg['predicted'])} / {kib(rg['measured'])}"
                if not rg["bitwise"]:
                    regen_s += " (not bitwise)"
                vs = pct(rg["measured"], _rewrite(g))
            lines.append(
                f"| {r['mode']} | {r['model']} | {g['kind']} | {g['units']} | "
                f"{kib(g['modelled_default'])} / {kib(g['measured_default'])} | "
                f"{kib(g['measured_reorder_off'])} | {prog} | "
                f"{kib(g['modelled_ours'])} / {kib(g['measured_ours'])} | "
                f"{pct(g['measured_ours'], g['measured_default'])} | {kib(g['lower_bound'])} | "
                f"{'yes' if _cert(g) else 'no'} | {kib(_rewrite(g)) if rg else '-'} | "
                f"{regen_s} | {vs} |"
            )
    lines += [
        "",
        "## Per step",
        "",
        "`step peak` = peak of one whole step (the third; forward and, in training, backward) "
        "above what was live at its start, from the profiler's CPU memory events "
        "(`torch.profiler`, `profile_memory=True`), plain Inductor vs the pass. `bitwise` = "
        "outputs (and gradients) of the first step equal to plain Inductor's. Compile s = "
        "first step minus the fastest of two steady steps, in this process: `cold` with an "
        "empty cache directory and Inductor's in-memory caches cleared, `warm` with the "
        "directory the cold run filled (in-memory caches cleared, dynamo reset); ours cold "
        "excludes the benchmark's own capture for the regeneration column. `warm cached` = "
        "graphs whose decision came from the pass's cache in the warm run.",
        "",
        "| mode | model | step peak plain | step peak ours | change | bitwise | cold plain / "
        "ours | ratio | warm plain / ours | ratio | warm cached |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['model']} | {kib(r['step_peak_plain'])} | "
            f"{kib(r['step_peak_ours'])} | {pct(r['step_peak_ours'], r['step_peak_plain'])} | "
            f"{r['bitwise']} | {r['cold_plain_s']:.1f} / {r['cold_ours_s']:.1f} | "
            f"{ratio(r['cold_plain_s'], r['cold_ours_s'])} | {r['warm_plain_s']:.2f} / "
            f"{r['warm_ours_s']:.2f} | {ratio(r['warm_plain_s'], r['warm_ours_s'])} | "
            f"{r['warm_from_cache']}/{r['warm_graphs']} |"
        )
    lines += [
        "",
        "## Summary",
        "",
        f"- {s['configs']} model/mode configurations, {s['graphs']} graphs; outputs bitwise "
        f"equal to plain Inductor in {s['bitwise_configs']}/{s['configs']}.",
        f"- Deployed: {s['deployed']}/{s['graphs']} graphs ({s['deployed_permutation']} "
        f"permutations of the default program, {s['deployed_variant']} variant programs), "
        f"in {s['configs_deployed']}/{s['configs']} configurations. Certified optimal (peak of "
        f"the chosen program = min-cut bound): {s['certified']}/{s['graphs']}. Byte-exact "
        f"(modelled == measured): {s['byte_exact']}/{s['graphs']}.",
        f"- Ours measured above Inductor's default program: {s['ours_above_default']} graphs; "
        f"above the reorder-off program: {s['ours_above_reorder_off']}. Real-step peak "
        f"(profiler) higher with the pass: {s['step_peak_higher']}/{s['configs']}, lower: "
        f"{s['step_peak_lower']}/{s['configs']}.",
        f"- Regeneration (graphs where the pass found a better order: {s['regen_graphs']}): "
        f"measured above the prediction in {s['regen_missed_prediction']}, below it in "
        f"{s['regen_below_prediction']}; above Inductor's default program in "
        f"{s['regen_worse_than_default']}; above the pass's own rewrite of that order in "
        f"{s['regen_above_rewrite']}, below it in {s['regen_below_rewrite']} (the rewrite "
        f"missed the prediction in {s['rewrite_missed_prediction']}); above the program the "
        f"pass runs in {s['regen_above_ours']}; not bitwise equal to the default program in "
        f"{s['regen_not_bitwise']}; failed in {s['regen_errors']} (source: missed the "
        "predicted peak in 22 of 54 CPU training configurations, worse in 9).",
        f"- Compile time ours / plain Inductor, in this process: cold geometric mean "
        f"{s['cold_ratio_geomean']:.2f}x (max {s['cold_ratio_max']:.2f}x; totals "
        f"{s['cold_ours_total_s']:.0f} / {s['cold_plain_total_s']:.0f} s), warm geometric mean "
        f"{s['warm_ratio_geomean']:.2f}x (max {s['warm_ratio_max']:.2f}x; totals "
        f"{s['warm_ours_total_s']:.1f} / {s['warm_plain_total_s']:.1f} s).",
        "- Wall time of the benchmark: "
        f"{(wall_s if wall_s is not None else time.perf_counter() - started) / 60:.1f} min.",
        "",
        "Reasons per graph:",
        "",
    ]
    for r in rows:
        for g in r["graphs"]:
            lines.append(f"- {r['mode']} / {r['model']} / {g['kind']}: {g['reason'][:300]}")
            if g["regen"] and g["regen"].get("notes"):
                lines.append(f"  - regen: {'; '.join(g['regen']['notes'])}")
    for f in failures:
        lines.append(f"- FAILED: {f}")
    return lines, s
