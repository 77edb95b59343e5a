"""The MoCo run's tables and figure: the summary over seeds, the methods table, the score
files per seed, the comparison with the source's figures (:data:`SOURCE`) and what differs
from it (:data:`DIFFERENCES`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .config import MIB

__all__ = ["DIFFERENCES", "SOURCE", "plot", "seed_table", "source_table", "summarize", "table"]

# The source's figures (H100, ResNet18 on CIFAR-100, 64 MiB queue, 100 encoder
# epochs + 25 probe epochs, six seeds; memory over the five paired seeds).
SOURCE = {
    "joint_mib": 1229.74,
    "eager_mib": 1389.41,
    "snapshot_mib": 1004.62,
    "joint_vs_eager": -0.1149,
    "snapshot_vs_joint": -0.2241,
    "time_ratio_geomean": 1.008024,
    "time_ratio_range": (0.984483, 1.019058),
    "accuracy": (0.2716, 0.2370, 0.2662, 0.2740, 0.2375, 0.2644),
}


DIFFERENCES = """\
- **Scale.** Source: ResNet18 (widths 64-512), CIFAR-100, 64 MiB queue, 100 encoder
  epochs + 25 probe epochs, H100. Here: the same architecture at `--width` (widths scaled by
  width/64), synthetic 10-class 32x32 data made from a seeded generator (nothing downloaded),
  a `--queue-mib` queue, `--steps` steps, 25 probe epochs, CPU FP32 with one thread.
  Accuracies are therefore not comparable (10 synthetic classes vs CIFAR-100).
- **Memory.** Source: allocator peaks on GPU. Here: live tensor bytes created during the
  step (a dispatch mode) plus what the engines hold in C++ (snapshot / read-set copies and the
  live save around a replay), plus the bytes alive at the step's start (both encoders, the
  queue, SGD momentum, the two views), as `PlannedSequential.measure` counts. Exact for
  tensors, blind to allocator slack and workspaces.
- **Byte-identity.** Source: all seven score files identical. Here torch's checkpoint cannot
  be: its re-run of the head reads the queue after the in-place enqueue (and updates BatchNorm
  statistics a second time); it is shown to differ. The region journal records the
  enqueue too (a write outside any segment is journaled before it happens; Note [Write
  watch] in `csrc/aten/write_watch.h`), keeping only the enqueued rows (0.07 MiB against
  the snapshot's 8 MiB here); so the remaining six methods are byte-identical, the
  source's seven less torch's checkpoint, which the source did not run.
- **Plans.** The joint and eager/whole planners choose from costs calibrated on this model
  (`--budget-frac` of the way from the joint minimum to the all-eager peak). Preserving the
  dense queue costs about as many bytes as the head's own activations, so a plan gains little
  by recomputing the head (dense queues gain nothing from regions, as in the source); and
  since this step's peak is segment 0's re-run, a plan that recomputes segment 0 has the whole
  snapshot's peak, where the source's joint plan sat between delayed eager and whole
  snapshot. For segments without declared state, snapshot and read-set cost the same bytes,
  so which one a plan names follows calibration noise.
- **Time.** One shared CPU: recomputation costs a larger share of a step than on an H100, and
  torch_replay's per-operator observer adds to every checkpointed segment, so the ratios are
  well above the source's 1.008.
"""


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def summarize(results: dict[int, dict[str, dict[str, Any]]], methods: Sequence[str]) -> dict:
    """Aggregate per-seed results per method (means of bytes, geomean of time ratios)."""
    summary: dict[str, Any] = {}
    for m in methods:
        rows = [results[s][m] for s in results if m in results[s]]
        ok = [r for r in rows if r["error"] is None]
        entry: dict[str, Any] = {"runs": len(ok), "of": len(rows)}
        if not ok:
            entry["error"] = rows[0]["error"] if rows else "not run"
            entry["failed_step"] = rows[0].get("failed_step") if rows else None
            summary[m] = entry
            continue
        entry["choices"] = ok[0]["choices"]
        entry["enqueue"] = ok[0]["enqueue"]
        peaks = [r["peak_bytes"] for r in ok if r["peak_bytes"] is not None]
        entry["peak_mib"] = statistics.fmean(peaks) / MIB if peaks else None
        entry["engine_mib"] = statistics.fmean(r["engine_peak_bytes"] for r in ok) / MIB
        pred = [r["predicted_peak_bytes"] for r in ok if r["predicted_peak_bytes"] is not None]
        entry["predicted_mib"] = statistics.fmean(pred) / MIB if pred else None
        entry["accuracy"] = [r["accuracy"] for r in ok]
        ratios = []
        for s in results:
            eager = results[s].get("eager")
            r = results[s].get(m)
            if eager and r and eager["error"] is None and r["error"] is None:
                if r["step_times"] and eager["step_times"]:
                    ratios.append(sum(r["step_times"]) / sum(eager["step_times"]))
        entry["time_ratios"] = ratios
        entry["time_ratio_geomean"] = _geomean(ratios) if ratios else None
        summary[m] = entry
    identity = {}
    for s, res in results.items():
        ref = res.get("eager", {}).get("sha256")
        identity[s] = {
            m: (r.get("sha256") == ref if r.get("sha256") else None) for m, r in res.items()
        }
    summary["_identity"] = identity
    return summary


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _abbrev(choices: Sequence[str]) -> str:
    short = {
        "eager": "E",
        "snapshot": "S",
        "journal": "J",
        "readset": "R",
        "guard": "G",
        "torch": "T",
    }
    return "".join(short.get(c, "?") for c in choices)


def table(summary: dict, methods: Sequence[str]) -> str:
    """The main Markdown table."""
    eager = summary.get("eager", {}).get("peak_mib")
    lines = [
        "| method | segments | enqueue | peak MiB | vs eager | engine MiB | predicted MiB "
        "| step time / eager | probe acc | scores = eager's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ident = summary["_identity"]
    for m in methods:
        e = summary[m]
        if "error" in e:
            step = e.get("failed_step")
            where = f" (step {step})" if step is not None else ""
            msg = e["error"].replace("|", "\\|")
            lines.append(f"| {m} | did not run{where}: {msg} | | | | | | | | |")
            continue
        peak = e["peak_mib"]
        vs = f"{100 * (peak / eager - 1):+.2f}%" if peak is not None and eager else "n/a"
        tr = e["time_ratio_geomean"]
        trs = e["time_ratios"]
        tcell = f"{tr:.3f} [{min(trs):.3f}, {max(trs):.3f}]" if tr is not None else "n/a"
        acc = statistics.fmean(e["accuracy"])
        same = [ident[s].get(m) for s in ident if ident[s].get(m) is not None]
        scell = f"{sum(same)}/{len(same)} seeds"
        enq = "after bwd" if e["enqueue"] == "after backward" else "fwd..bwd"
        lines.append(
            f"| {m} | {_abbrev(e['choices'])} | {enq} | {_fmt(peak)} | {vs} | "
            f"{_fmt(e['engine_mib'], '.3f')} | {_fmt(e['predicted_mib'])} | {tcell} | "
            f"{100 * acc:.2f}% | {scell} |"
        )
    return "\n".join(lines)


def seed_table(results: dict[int, dict[str, dict[str, Any]]], methods: Sequence[str]) -> str:
    """Per seed: eager's score hash, which methods match it, torch's hash, accuracy."""
    lines = [
        "| seed | eager score SHA-256 | identical to it | torch_checkpoint SHA-256 | "
        "torch max abs param diff | probe acc (eager / torch) |",
        "|---|---|---|---|---|---|",
    ]
    for s, res in results.items():
        ref = res.get("eager", {}).get("sha256")
        same = [m for m in methods if m in res and res[m].get("sha256") == ref and ref]
        tc = res.get("torch_checkpoint", {})
        acc_e = res.get("eager", {}).get("accuracy")
        acc_t = tc.get("accuracy")
        lines.append(
            f"| {s} | `{(ref or 'n/a')[:16]}` | {', '.join(same)} | `{(tc.get('sha256') or 'n/a')[:16]}` | "
            f"{_fmt(tc.get('max_param_diff_vs_eager'), '.3e')} | "
            f"{_fmt(acc_e and 100 * acc_e)}% / {_fmt(acc_t and 100 * acc_t)}% |"
        )
    return "\n".join(lines)


def source_table(summary: dict) -> str:
    """The source's application figures beside ours."""

    def peak(m: str) -> float | None:
        return summary.get(m, {}).get("peak_mib")

    e, j, s = peak("eager"), peak("joint"), peak("snapshot")
    rel = lambda a, b: f"{100 * (a / b - 1):+.2f}%" if a and b else "n/a"  # noqa: E731
    jt = summary.get("joint", {})
    trs = jt.get("time_ratios") or []
    ours_t = f"{jt['time_ratio_geomean']:.3f} [{min(trs):.3f}, {max(trs):.3f}]" if trs else "n/a"
    eacc = summary.get("eager", {}).get("accuracy", [])
    src = SOURCE
    return "\n".join(
        [
            "| figure | source (H100, full scale) | here (CPU, this scale) |",
            "|---|---|---|",
            f"| delayed eager peak | {src['eager_mib']:,.2f} MiB | {_fmt(e)} MiB |",
            f"| joint plan peak | {src['joint_mib']:,.2f} MiB | {_fmt(j)} MiB |",
            f"| whole snapshot peak | {src['snapshot_mib']:,.2f} MiB | {_fmt(s)} MiB |",
            f"| joint vs delayed eager | {100 * src['joint_vs_eager']:+.2f}% | {rel(j, e)} |",
            f"| whole snapshot vs joint | {100 * src['snapshot_vs_joint']:+.2f}% | {rel(s, j)} |",
            f"| encoder time ratio joint / eager, geomean [range] | "
            f"{src['time_ratio_geomean']:.3f} [{src['time_ratio_range'][0]:.3f}, "
            f"{src['time_ratio_range'][1]:.3f}] | {ours_t} |",
            "| score files byte-identical within a seed | all 7 methods, 6 seeds | "
            f"{_identity_line(summary)} |",
            f"| probe accuracy per seed | {', '.join(f'{100 * a:.2f}%' for a in src['accuracy'])} "
            f"(CIFAR-100) | {', '.join(f'{100 * a:.2f}%' for a in eacc)} |",
        ]
    )


def _identity_line(summary: dict) -> str:
    ident = summary["_identity"]
    parts = []
    for s, res in ident.items():
        same = sorted(m for m, v in res.items() if v)
        diff = sorted(m for m, v in res.items() if v is False)
        parts.append(
            f"{s}: {len(same)} identical" + (f", {'/'.join(diff)} differs" if diff else "")
        )
    return "; ".join(parts)


def plot(summary: dict, methods: Sequence[str], path: str) -> bool:
    """Two panels: measured peak (MiB) and step time ratio to eager, per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: plot skipped (pip install matplotlib)")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = list(range(len(methods)))
    eager = summary.get("eager", {}).get("peak_mib")
    for x, m in zip(xs, methods, strict=True):
        e = summary[m]
        if "error" in e:
            for ax in (ax1, ax2):
                ax.text(
                    x,
                    0.02,
                    "did not run",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                    color="crimson",
                )
            continue
        color = "tab:red" if m == "torch_checkpoint" else "tab:blue"
        if e["peak_mib"] is not None:
            ax1.bar(x, e["peak_mib"], color=color)
            if e["engine_mib"]:
                ax1.bar(x, e["engine_mib"], color="tab:orange")
        if e["time_ratio_geomean"] is not None:
            lo, hi = min(e["time_ratios"]), max(e["time_ratios"])
            g = e["time_ratio_geomean"]
            ax2.bar(x, g, color=color)
            ax2.errorbar(x, g, yerr=[[g - lo], [hi - g]], color="black", capsize=3)
    if eager:
        for frac, label in (
            (1 + SOURCE["joint_vs_eager"], "source joint/eager"),
            (SOURCE["snapshot_mib"] / SOURCE["eager_mib"], "source snapshot/eager"),
        ):
            ax1.axhline(eager * frac, ls="--", lw=1, color="gray")
            ax1.text(len(methods) - 0.5, eager * frac, label, fontsize=7, ha="right", va="bottom")
    ax2.axhline(1.0, color="gray", lw=1)
    ax2.axhline(SOURCE["time_ratio_geomean"], ls="--", lw=1, color="gray")
    ax2.text(
        len(methods) - 0.5,
        SOURCE["time_ratio_geomean"],
        "source joint/eager",
        fontsize=7,
        ha="right",
        va="bottom",
    )
    for ax in (ax1, ax2):
        ax.set_xticks(xs, methods, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("measured peak, MiB (orange: largest engine bytes)")
    ax2.set_ylabel("step time / eager (geomean, seed range)")
    ax1.set_title("peak allocated memory per training step")
    ax2.set_title("step time, side by side in one process")
    fig.suptitle(
        "MoCo, negative queue enqueued in place; red: torch.utils.checkpoint (diverges)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
