"""Budget regimes: joint planner vs its baselines, measured in fresh processes (CPU).

    python -m benchmarks.bench_budgets [--rounds 30] [--steps 10] [--threads 1]
                                       [--workloads queue,dense] [--calibration costs.json]
                                       [--json raw.json] [--out budgets.md]

For each workload (``queue``: sparse writes into a ring buffer with many live
versions; ``dense``: every segment rewrites the whole buffer, write ratio 1):

1. its segments are calibrated in a fresh process (``measure_segments``: one
   option on every segment, per-segment retained / transient / time);
2. budgets are derived from those costs so that three regimes
   appear: ``eager fits`` (budget = the all-eager peak), ``eager/whole
   infeasible`` (halfway between the joint and the eager/whole minimum
   budgets) and ``pressure`` (halfway between the eager/whole minimum and the
   all-eager peak: eager/whole is feasible but needs snapshots); per planner the
   smallest budget whose plan is all-eager is found by bisection;
3. per regime the policies are planned: ``joint``, ``fixed journal`` / ``fixed
   readset`` (every segment), ``eager/whole`` (exact costs, eager and snapshot
   only) and ``state-agnostic`` (preserved bytes left out; its true peak and
   overshoot are reported);
4. every distinct policy runs in ``--rounds`` fresh processes, interleaved in a
   shuffled order per round; each process runs one warm-up step and
   ``--steps`` timed training steps (medians of wall and of process CPU time kept),
   measures the peak RSS over the timed steps (VmHWM after a reset, minus RSS
   before), and in the first round also the tracked peak of
   ``PlannedSequential.measure``.

Threads: every child uses ``--threads`` torch threads (default 1). With 2 threads on
the shared 2-core machine a preempted OpenMP thread stalls its partner at every
parallel region's barrier: the median step of a grid shape took 5-19x its one-thread
time (``benchmarks/results/threads.md``); with one thread the process CPU time of a
step is what the other work on the machine inflates least, so the ratios are given on
CPU time, with wall time beside them.

Time ratios are ratios of mean step times over rounds with a 95% paired
bootstrap interval (rounds resampled, 4,000 resamples).
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
import time

import torch

import torch_replay as tr
from benchmarks.lib.cli import add_out_quick, emit, make_parser, run_module
from torch_replay import calibrate as cal
from torch_replay.planned import PlannedSequential
from torch_replay.planner import Option, plan_peak

MIB = 2**20
WORKLOADS = {
    "queue": ("torch_replay.calibrate:queue_workload", {}),
    "dense": ("torch_replay.calibrate:dense_workload", {}),
}
OBJECTIVES = {"joint": "joint", "eager/whole": "eager_whole", "state-agnostic": "state_agnostic"}
ABBREV = {"eager": "E", "snapshot": "S", "journal": "J", "readset": "R", "guard": "G"}


def build(workload: str):
    spec, kwargs = WORKLOADS[workload]
    return cal.resolve_factory(spec)(**kwargs)


# --------------------------------------------------------------------- children


def child_calibrate(workload: str, reps: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    w = build(workload)
    return cal.measure_segments(w, ["eager", "snapshot", "journal", "readset"], reps=reps)


def child_run(workload: str, choices: list[str], steps: int, track: bool, threads: int) -> dict:
    torch.set_num_threads(threads)
    w = build(workload)
    model = PlannedSequential(w.segments, state=w.state, choices=choices)
    static = model.default_persistent()
    model.profile_step(w.make_input(), track_memory=False)  # warm-up
    physical = cal.PhysicalPeak("cpu")
    physical.start()
    times, cpu = [], []
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        x = w.make_input()
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(x)
        out.float().pow(2).mean().backward()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rss = physical.peak()
    res = {
        "step_s": statistics.median(times),
        "cpu_s": statistics.median(cpu),
        "preempted": resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches,
        "rss_peak_delta": rss,
        "persistent": static,
    }
    if track:
        res["tracked_peak"] = model.measure(w.make_input()).measured_peak
    return res


def run_child(args: list[str]) -> dict:
    out = run_module("benchmarks.bench_budgets", args)
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ plans


def options_of(cost: dict) -> list[list[Option]]:
    return [[Option(**o) for o in seg] for seg in cost["segments"]]


def fixed_peak(opts: list[list[Option]], choices: list[str], persistent: int) -> int:
    chosen = [next(o for o in seg if o.name == c) for seg, c in zip(opts, choices, strict=True)]
    return plan_peak(chosen, persistent)


def fixed_time(opts: list[list[Option]], choices: list[str]) -> float:
    return sum(
        next(o for o in seg if o.name == c).time for seg, c in zip(opts, choices, strict=True)
    )


def min_budget(opts, persistent, objective) -> int:
    try:
        return tr.plan(opts, budget=0, persistent=persistent, objective=objective).min_budget
    except tr.InfeasibleBudgetError as e:
        return e.min_budget


def all_eager_from(opts, persistent: int, objective: str, *, lo: int, hi: int) -> int | None:
    """The smallest budget in [lo, hi] whose ``objective`` plan is all-eager (bisection:
    a budget that fits the all-eager plan keeps it once it is the fastest), or None."""

    def eager(budget: int) -> bool:
        try:
            p = tr.plan(opts, budget=budget, persistent=persistent, objective=objective)
        except tr.InfeasibleBudgetError:
            return False
        return all(c == "eager" for c in p.choices)

    if not eager(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if eager(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def policies(opts: list[list[Option]], persistent: int) -> tuple[dict, list[dict]]:
    n = len(opts)
    eager_peak = fixed_peak(opts, ["eager"] * n, persistent)
    joint_min = min_budget(opts, persistent, "joint")
    ew_min = min_budget(opts, persistent, "eager_whole")
    budgets = {"eager fits": eager_peak}
    if joint_min < ew_min:
        budgets["eager/whole infeasible"] = (joint_min + ew_min) // 2
    if ew_min < eager_peak:
        budgets["pressure"] = (ew_min + eager_peak) // 2
    info = {
        "eager_peak": eager_peak,
        "joint_min": joint_min,
        "eager_whole_min": ew_min,
        "all_eager_from": {
            obj: all_eager_from(opts, persistent, obj, lo=min(joint_min, ew_min), hi=eager_peak)
            for obj in OBJECTIVES.values()
        },
    }
    regimes = []
    for regime, m in budgets.items():
        rows = []
        for label, objective in OBJECTIVES.items():
            try:
                p = tr.plan(opts, budget=m, persistent=persistent, objective=objective)
                rows.append(
                    {
                        "policy": label,
                        "feasible": p.fits,
                        "choices": p.choices,
                        "predicted_peak": p.peak,
                        "charged_peak": p.predicted.peak,
                        "model_time": p.time,
                        "overshoot": p.overshoot,
                    }
                )
            except tr.InfeasibleBudgetError as e:
                rows.append(
                    {
                        "policy": label,
                        "feasible": False,
                        "choices": None,
                        "min_budget": e.min_budget,
                    }
                )
        for engine in ("journal", "readset"):
            choices = [engine] * n
            peak = fixed_peak(opts, choices, persistent)
            rows.append(
                {
                    "policy": f"fixed {engine}",
                    "feasible": peak <= m,
                    "choices": choices,
                    "predicted_peak": peak,
                    "charged_peak": peak,
                    "model_time": fixed_time(opts, choices),
                    "overshoot": max(0, peak - m),
                }
            )
        regimes.append({"regime": regime, "budget": m, "rows": rows})
    return info, regimes


# ------------------------------------------------------------------- statistics


def ratio_ci(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """mean(a)/mean(b) with a 95% paired bootstrap interval (pairs = rounds)."""
    ratio = statistics.fmean(a) / statistics.fmean(b)
    rng = random.Random(seed)
    n = len(a)
    boot = []
    for _ in range(4000):
        idx = [rng.randrange(n) for _ in range(n)]
        boot.append(sum(a[i] for i in idx) / sum(b[i] for i in idx))
    boot.sort()
    return ratio, boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]


# ------------------------------------------------------------------------- main


def mib(n) -> str:
    return f"{n / MIB:,.2f}"


def short(choices) -> str:
    return "".join(ABBREV[c] for c in choices) if choices else "-"


def bench_workload(workload: str, rounds: int, steps: int, reps: int, threads: int) -> dict:
    print(f"[{workload}] calibrating", file=sys.stderr, flush=True)
    cost = run_child(["_calibrate", workload, str(reps), str(threads)])
    opts = options_of(cost)
    persistent = cost["persistent"]
    info, regimes = policies(opts, persistent)
    distinct: dict[str, list[str]] = {}
    for r in regimes:
        for row in r["rows"]:
            if row["choices"] is not None:
                distinct.setdefault(short(row["choices"]), row["choices"])
    keys = sorted(distinct)
    samples: dict[str, list[dict]] = {k: [] for k in keys}
    rng = random.Random(1)
    start = time.perf_counter()
    for rnd in range(rounds):
        order = keys[:]
        rng.shuffle(order)
        for k in order:
            args = ["_run", workload, ",".join(distinct[k]), str(steps), str(int(rnd == 0))]
            samples[k].append(run_child(args + [str(threads)]))
        print(
            f"\r[{workload}] round {rnd + 1}/{rounds} ({len(keys)} policies) "
            f"{time.perf_counter() - start:6.0f}s",
            end="",
            file=sys.stderr,
            flush=True,
        )
    print(file=sys.stderr)
    return {
        "workload": workload,
        "description": build(workload).description,
        "costs": cost,
        "persistent": persistent,
        "info": info,
        "regimes": regimes,
        "samples": samples,
    }


def _ratio(s: dict, jk: str | None, k: str, key: str) -> str:
    if not jk or k == jk:
        return "1 (same plan)" if k == jk else "-"
    q, lo, hi = ratio_ci([x[key] for x in s[jk]], [x[key] for x in s[k]])
    return f"{q:.3f} [{lo:.3f}, {hi:.3f}]"


def table(res: dict) -> list[str]:
    s = res["samples"]
    info = res["info"]
    rss = {k: statistics.median(x["rss_peak_delta"] for x in v) for k, v in s.items()}
    tracked = {k: v[0].get("tracked_peak") for k, v in s.items()}
    eager_from = ", ".join(
        f"{label} {mib(info['all_eager_from'][obj]) if info['all_eager_from'][obj] else 'never'}"
        for label, obj in OBJECTIVES.items()
    )
    lines = [
        f"### Workload `{res['workload']}`: {res['description']}",
        "",
        f"persistent P = {mib(res['persistent'])} MiB; all-eager peak "
        f"{mib(info['eager_peak'])} MiB; smallest feasible budget: joint "
        f"{mib(info['joint_min'])} MiB, eager/whole {mib(info['eager_whole_min'])} MiB; "
        f"smallest budget whose plan is all-eager (MiB): {eager_from}.",
        "",
        "Per-segment calibrated costs (retained / transient MiB, time ms):",
        "",
        "| segment | " + " | ".join(o["name"] for o in res["costs"]["segments"][0]) + " |",
        "|---|" + "---|" * len(res["costs"]["segments"][0]),
    ]
    for i, seg in enumerate(res["costs"]["segments"]):
        cells = [
            f"{o['retained'] / MIB:.2f} / {o['transient'] / MIB:.2f} / {o['time'] * 1e3:.1f}"
            for o in seg
        ]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| regime | budget MiB | policy | feasible | plan | predicted peak MiB "
        "| tracked peak MiB | RSS peak MiB | overshoot MiB | CPU s / step | wall s / step "
        "| joint / this, CPU [95% CI] | joint / this, wall [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["regimes"]:
        joint = next(x for x in r["rows"] if x["policy"] == "joint")
        jk = short(joint["choices"]) if joint["choices"] else None
        for row in r["rows"]:
            if row["choices"] is None:
                lines.append(
                    f"| {r['regime']} | {mib(r['budget'])} | {row['policy']} | **no** "
                    f"(min budget {mib(row['min_budget'])}) |" + " - |" * 9
                )
                continue
            k = short(row["choices"])
            static = s[k][0]["persistent"]
            lines.append(
                f"| {r['regime']} | {mib(r['budget'])} | {row['policy']} "
                f"| {'yes' if row['feasible'] else '**no**'} | `{k}` | {mib(row['predicted_peak'])} "
                f"| {mib(tracked[k]) if tracked[k] else '-'} | {mib(static + rss[k])} "
                f"| {mib(row['overshoot'])} | {statistics.fmean(x['cpu_s'] for x in s[k]):.4f} "
                f"| {statistics.fmean(x['step_s'] for x in s[k]):.4f} "
                f"| {_ratio(s, jk, k, 'cpu_s')} | {_ratio(s, jk, k, 'step_s')} |"
            )
    n = len(next(iter(s.values())))
    preempted = statistics.median(x["preempted"] for v in s.values() for x in v)
    lines += [
        "",
        f"{n} fresh processes per distinct plan; plan letters: E eager, S snapshot, J journal, "
        f"R readset. Median involuntary context switches per process over its timed steps: "
        f"{preempted:g}.",
    ]
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_calibrate":
        wl, reps, threads = sys.argv[2:5]
        print(json.dumps(child_calibrate(wl, int(reps), int(threads))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        wl, choices, steps, track, threads = sys.argv[2:7]
        res = child_run(wl, choices.split(","), int(steps), track == "1", int(threads))
        print(json.dumps(res))
        return 0
    p = make_parser(__doc__, whole_doc=True)
    p.add_argument(
        "--rounds", default="30", help="fresh processes per plan; one, or one per workload"
    )
    p.add_argument("--steps", type=int, default=5, help="timed steps per process (median kept)")
    p.add_argument("--reps", type=int, default=5, help="calibration steps per option")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads per child (see the docstring)"
    )
    p.add_argument("--workloads", default="queue,dense")
    p.add_argument("--calibration", help="a costs JSON of the shape grid to summarise")
    p.add_argument("--json", help="write the raw results here")
    add_out_quick(p, quick=None)
    p.add_argument("--from-json", help="rebuild the tables from a --json file (no runs)")
    p.add_argument("--command", help="the command line to print (with --from-json)")
    p.add_argument("--load", help="the load average to state (with --from-json)")
    a = p.parse_args()
    load = os.getloadavg()
    if a.from_json:
        with open(a.from_json) as f:
            results = json.load(f)
    else:
        names = a.workloads.split(",")
        rounds = [int(r) for r in a.rounds.split(",")]
        rounds += [rounds[-1]] * (len(names) - len(rounds))
        results = [
            bench_workload(w, r, a.steps, a.reps, a.threads)
            for w, r in zip(names, rounds, strict=False)
        ]
    after = os.getloadavg()
    command = a.command or f"python -m benchmarks.bench_budgets {' '.join(sys.argv[1:])}"
    load_text = a.load or (
        f"1-minute load average {load[0]:.1f} before, {after[0]:.1f} after "
        f"(15-minute {after[2]:.1f})"
    )
    lines = [
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs (shared), {a.threads} torch "
        f"thread(s) per child; {load_text}; see the script's docstring for the method.",
        "",
    ]
    if a.calibration:
        doc = json.loads(open(a.calibration).read())
        lines += ["## Calibration grid", "", cal.summary(doc)]
    lines += ["## Budget regimes", ""]
    for res in results:
        lines += table(res) + [""]
    md = "\n".join(lines) + "\n"
    if a.json and not a.from_json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return emit(md, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
