"""Checkpoint benchmarks (CPU, this machine). Prints ratios measured side by side.

    python -m benchmarks.bench_checkpoint overhead  [--reps 15] [--device cuda]
    python -m benchmarks.bench_checkpoint journal   [--reps 3] [--mib 256]
    python -m benchmarks.bench_checkpoint all --quick      # small run: a minute or two, prints only
    python -m benchmarks.bench_checkpoint all --out benchmarks/results/checkpoint.md

Nothing is written unless --out is given (then also <out>.json, the results kept between
partial runs). The full run takes tens of minutes on a small CPU; --quick measures a
256-wide model with 3 repetitions and a 16 MiB buffer with 1 and 8 live versions.

overhead: torch_replay.checkpoint vs torch.utils.checkpoint on a pure model (no state):
    median step time (forward + backward) over interleaved repetitions, and the peak of
    live tensor bytes during the step (a dispatch-mode tracker of every storage an operator
    makes; identical method for both).
journal: region journal vs whole snapshot on one declared buffer (--mib MiB) at write ratios
    0.001 / 0.01 / 0.1 / 1 with 1 / 8 / 64 live versions (segments that each write their
    share of the buffer, all alive until backward). Each configuration runs in a fresh
    process; peak = the process's peak RSS during the measured steps (VmHWM, reset through
    /proc/self/clear_refs after a warm-up) minus its RSS at that reset (so it counts what
    preservation adds, plus activations), step time = median. `--where outside`: the
    segments only read the buffer and the writes happen in the training loop, after each
    segment and before backward (a MoCo enqueue); the journal copies on write there too.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import weakref

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, emit, make_parser, run_module

# ------------------------------------------------------------------- overhead


class PeakTracker(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak of live bytes of storages created by operators while active."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen = set()

    def _free(self, key, nbytes):
        self.seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                s = t.untyped_storage()
                key = s.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    self.live += s.nbytes()
                    weakref.finalize(s, self._free, key, s.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def make_model(width=1024, depth=8):
    torch.manual_seed(0)
    return nn.ModuleList(
        nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        for _ in range(depth)
    )


def step(model, x, ckpt, reentrant):
    h = x
    for block in model:
        h = ckpt(block, h, use_reentrant=reentrant) + h
    h.pow(2).mean().backward()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_overhead(reps: int, device: str = "cpu", width: int = 1024) -> dict:
    model = make_model(width).to(device)
    x = torch.randn(256, width, device=device, requires_grad=True)
    methods = {"torch": tcp.checkpoint, "torch_replay": tr.checkpoint}
    out = {}
    for reentrant in (False, True):
        times = {k: [] for k in methods}
        for _ in range(2):  # warm-up
            for ckpt in methods.values():
                step(model, x, ckpt, reentrant)
        for _ in range(reps):  # interleaved
            for name, ckpt in methods.items():
                model.zero_grad(set_to_none=True)
                x.grad = None
                _sync(device)
                t0 = time.perf_counter()
                step(model, x, ckpt, reentrant)
                _sync(device)
                times[name].append(time.perf_counter() - t0)
        peaks = {}
        for name, ckpt in methods.items():
            gc.collect()
            tracker = PeakTracker()
            with tracker:
                step(model, x, ckpt, reentrant)
            peaks[name] = tracker.peak
        med = {k: statistics.median(v) for k, v in times.items()}
        out[f"use_reentrant={reentrant}"] = {
            "device": device,
            "width": width,
            "median_s": med,
            "time_ratio": med["torch_replay"] / med["torch"],
            "peak_bytes": peaks,
            "peak_ratio": peaks["torch_replay"] / peaks["torch"],
        }
    return out


# -------------------------------------------------------------------- journal


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the process's peak RSS (VmHWM) to its current RSS and return that, in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def journal_child(
    engine: str, mib: int, ratio: float, versions: int, reps: int, where: str = "inside"
) -> dict:
    row = 4096  # bytes per row (1024 float32)
    rows = mib * 2**20 // row
    buf = torch.zeros(rows, row // 4)
    buf.add_(1.0)  # touch every page
    lin = nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    w = max(1, int(round(ratio * rows)))

    def write(i):
        start = (i * w) % rows
        end = min(rows, start + w)
        with torch.no_grad():
            buf[start:end] = float(i)  # the sparse (or dense) write

    def seg(inp, i):
        s = buf[(i * w) % rows, :64]  # a small read
        if where == "inside":
            write(i)
        return torch.tanh(lin(inp) * s)

    # Warm up (imports, first-call allocations) with a cheap configuration, then take
    # the baseline: the peak RSS reached from here on is what this configuration adds.
    small = torch.zeros(16)
    tr.checkpoint(seg, x, 0, state=[small], engine=engine, use_reentrant=False).sum().backward()
    gc.collect()
    base = reset_peak_rss()
    times = []
    retained = transient = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        loss = 0
        txns = []
        for i in range(versions):
            loss = (
                loss
                + tr.checkpoint(seg, x, i, state=[buf], engine=engine, use_reentrant=False).sum()
            )
            txns.append(tr.last_transaction())
            if where == "outside":
                write(i)  # in the training loop, before backward
        retained = (
            sum(t.retained_bytes for t in txns)
            if engine == "snapshot"
            else (txns[0].retained_bytes)
        )
        loss.backward()
        transient = max(t.replay_transient_bytes for t in txns)
        del txns, loss
        times.append(time.perf_counter() - t0)
    return {
        "peak_rss_delta": peak_rss() - base,
        "median_s": statistics.median(times),
        "retained_bytes": retained,
        "replay_transient_bytes": transient,
    }


def _run_child(engine, mib_, ratio, versions, reps, where="inside") -> dict:
    args = ["_child", engine, str(mib_), str(ratio), str(versions), str(reps), where]
    proc = run_module("benchmarks.bench_checkpoint", args)
    if proc.returncode != 0:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        return {"error": f"{why} (killed: out of memory?)" if proc.returncode == -9 else why}
    return json.loads(proc.stdout.splitlines()[-1])


def bench_journal(
    reps: int, mib_: int, versions_list, ratios, rows: dict, where: str = "inside"
) -> dict:
    """Measure the grid (or part of it); rows is keyed by "where/versions/ratio" and
    updated."""
    for versions in versions_list:
        for ratio in ratios:
            res = {}
            for engine in ("snapshot", "journal"):
                r = reps if versions < 64 else max(1, reps // 2)
                res[engine] = _run_child(engine, mib_, ratio, versions, r, where)
            row = {"versions": versions, "write_ratio": ratio, "mib": mib_, "where": where, **res}
            if "error" not in res["snapshot"] and "error" not in res["journal"]:
                s_, j_ = res["snapshot"], res["journal"]
                row["peak_ratio"] = j_["peak_rss_delta"] / max(1, s_["peak_rss_delta"])
                row["model_peak_ratio"] = (
                    j_["retained_bytes"] + j_["replay_transient_bytes"]
                ) / max(1, s_["retained_bytes"] + s_["replay_transient_bytes"])
                row["time_ratio"] = j_["median_s"] / s_["median_s"]
            rows[f"{where}/{versions}/{ratio}"] = row
            print(json.dumps(row), flush=True)
    return rows


def mib(n):
    return f"{n / 2**20:,.1f}"


def markdown(overhead, journal, args) -> str:
    lines = [
        "Commands: `python -m benchmarks.bench_checkpoint all --out benchmarks/results/checkpoint.md`"
        " (rows measured by later partial runs, e.g. `journal --versions 64 --ratios 1`, replace"
        f" theirs; this file was last written by `... {' '.join(args)}`)",
        "",
    ]
    lines.append(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads"
    )
    if overhead:
        lines += [
            "",
            "## Overhead on a pure model (8 residual MLP blocks, "
            f"{next(iter(overhead.values())).get('width', 1024)} wide, batch 256, "
            f"{next(iter(overhead.values())).get('device', 'cpu')})",
            "",
            "| variant | torch step (s) | torch_replay step (s) | time ratio | peak ratio |",
            "|---|---|---|---|---|",
        ]
        for k, v in overhead.items():
            lines.append(
                f"| {k} | {v['median_s']['torch']:.4f} | {v['median_s']['torch_replay']:.4f} "
                f"| {v['time_ratio']:.3f} | {v['peak_ratio']:.3f} |"
            )
    if journal:
        lines += [
            "",
            "## Region journal vs whole snapshot (one declared buffer)",
            "",
            "| writes | buffer MiB | live versions | write ratio | snapshot peak MiB "
            "| journal peak MiB | peak ratio (RSS) | peak ratio (model) | snapshot step s "
            "| journal step s | time ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(
            journal.values(),
            key=lambda r: (r.get("where", "inside"), r["versions"], r["write_ratio"]),
        ):
            s_, j_ = r["snapshot"], r["journal"]
            if "error" in s_ or "error" in j_:
                lines.append(
                    f"| {r.get('where', 'inside')} | {r['mib']} | {r['versions']} | "
                    f"{r['write_ratio']} | {s_.get('error', mib(s_.get('peak_rss_delta', 0)))} | "
                    f"{j_.get('error', mib(j_.get('peak_rss_delta', 0)))} | | | | | |"
                )
                continue
            lines.append(
                f"| {r.get('where', 'inside')} | {r['mib']} | {r['versions']} | "
                f"{r['write_ratio']} | {mib(s_['peak_rss_delta'])} | "
                f"{mib(j_['peak_rss_delta'])} | {r['peak_ratio']:.4f} | {r['model_peak_ratio']:.4f} | "
                f"{s_['median_s']:.3f} | {j_['median_s']:.3f} | {r['time_ratio']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        engine, mb, ratio, versions, reps, where = sys.argv[2:8]
        print(
            json.dumps(
                journal_child(engine, int(mb), float(ratio), int(versions), int(reps), where)
            )
        )
        return 0
    p = make_parser(__doc__, whole_doc=True)
    p.add_argument(
        "what",
        choices=["overhead", "journal", "all", "report"],
        help="overhead, journal, both, or report (reprint the table from --json)",
    )
    add_out_quick(
        p,
        out="markdown table to write",
        quick="small run: --reps 3 --mib 16 --versions 1,8 --width 256",
    )
    p.add_argument(
        "--reps", type=int, default=None, help="repetitions (default: overhead 15, journal 3)"
    )
    p.add_argument("--mib", type=int, default=256, help="journal: declared buffer size in MiB")
    p.add_argument("--versions", default="1,8,64", help="live versions to measure")
    p.add_argument("--ratios", default="0.001,0.01,0.1,1", help="write ratios to measure")
    p.add_argument(
        "--where",
        default="inside,outside",
        help="journal: where the writes happen: inside the segments, outside (training loop)",
    )
    p.add_argument(
        "--json",
        default=None,
        help="results kept between partial runs (default: beside --out; none without --out)",
    )
    p.add_argument("--device", default="cpu", help="overhead: cpu or cuda")
    p.add_argument("--width", type=int, default=1024, help="overhead: model width (small run: 256)")
    a = p.parse_args()
    if a.quick:
        a.reps, a.mib, a.versions, a.width = a.reps or 3, 16, "1,8", 256
    data = {"overhead": None, "journal": {}}
    if a.json is None and a.out:
        a.json = os.path.splitext(a.out)[0] + ".json"
    if a.json and os.path.exists(a.json):
        with open(a.json) as f:
            data = json.load(f)
    if a.what in ("overhead", "all"):
        data["overhead"] = bench_overhead(a.reps or 15, a.device, a.width)
        print(json.dumps(data["overhead"], indent=1))
    if a.what in ("journal", "all"):
        versions = [int(v) for v in a.versions.split(",")]
        ratios = [float(r) for r in a.ratios.split(",")]
        for where in a.where.split(","):
            bench_journal(a.reps or 3, a.mib, versions, ratios, data["journal"], where)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)
    md = markdown(data["overhead"], data["journal"], sys.argv[1:])
    return emit(md, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
