"""Benchmark of the min-cut lower bounds and the exact search (torch_replay.schedule).

Reproduces the published random-DAG table (how often max(F,R), F, R and the
event cut EC equal the optimum on 800 random DAGs; worst OPT/bound ratio), an
adversarial local search over 13-vertex DAGs for the worst ratio, and the speed
target (both trap bounds on a 259-unit graph in under 1 s).

Generators (the published table only says "random DAGs"; both are reported):
  buffer model (headline, the shape of compiled unit graphs): n uniform in
    [6, 16] units in a random topological order; 0-2 graph inputs; each unit
    produces 0-2 buffers (mean 1); each buffer is read by 0-3 random later
    units; a buffer is an output with probability 1/6; 0-2 extra precedence
    edges; sizes uniform in [1, 100].
  vertex model (classic vertex-weighted DAG, harsher): n uniform in [6, 16];
    every forward pair is an edge with probability p uniform in [0.15, 0.45];
    each vertex produces one tensor of size in [1, 100] read by all its
    successors; sink tensors are graph outputs.
The optimum comes from the exhaustive DP over downsets.

Run:
    .venv/bin/python -m benchmarks.bench_bounds                  # prints only
    .venv/bin/python -m benchmarks.bench_bounds --graphs 50 --restarts 2 --steps 100   # small run
    .venv/bin/python -m benchmarks.bench_bounds --out benchmarks/results/bounds.md
Nothing is written without --out.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.cli import add_out_quick, make_parser
from torch_replay import schedule

CORE = None


def buffer_dag(rng: random.Random, n: int, max_size: int = 100, min_size: int = 1) -> dict:
    """Units producing 0-2 buffers read by 0-3 random later units (the buffer model above;
    ``tests/test_schedule.py`` draws its problems from it through Hypothesis's
    ``st.randoms()``).

    Args:
        rng: the source of every draw (``random.Random`` or a Hypothesis random).
        n: the number of units.
        max_size: the largest buffer size.
        min_size: the smallest buffer size.

    Returns:
        The keyword arguments of :class:`torch_replay.schedule.Problem`.
    """
    label = list(range(n))
    rng.shuffle(label)
    sizes: list[int] = []
    producer: list[int] = []
    consumers: list[list[int]] = []
    outputs: list[int] = []
    makers = [-1] * rng.randint(0, 2) + [u for u in range(n) for _ in range(rng.randint(0, 2))]
    for p in makers:
        later = list(range(p + 1, n))
        reads = [rng.choice(later) for _ in range(rng.randint(0, 3))] if later else []
        sizes.append(rng.randint(min_size, max_size))
        producer.append(-1 if p < 0 else label[p])
        consumers.append([label[c] for c in reads])
        if rng.randint(0, 5) == 0:
            outputs.append(len(sizes) - 1)
    edges = []
    if n >= 2:  # an extra edge needs two units
        for _ in range(rng.randint(0, 2)):
            a = rng.randint(0, n - 2)
            edges.append((label[a], label[rng.randint(a + 1, n - 1)]))
    return dict(
        sizes=sizes,
        producer=producer,
        consumers=consumers,
        outputs=outputs,
        num_units=n,
        extra_edges=edges,
    )


def vertex_dag(rng: random.Random, n: int, p: float, max_size: int = 100) -> dict:
    """Vertex-weighted random DAG: vertex v's tensor is read by its successors."""
    succ = [[v for v in range(u + 1, n) if rng.random() < p] for u in range(n)]
    label = list(range(n))
    rng.shuffle(label)  # hide the generation order
    return dict(
        sizes=[rng.randint(1, max_size) for _ in range(n)],
        producer=[label[u] for u in range(n)],
        consumers=[[label[v] for v in succ[u]] for u in range(n)],
        outputs=[u for u in range(n) if not succ[u]],
        num_units=n,
    )


def training_graph(rng: random.Random, layers: int) -> dict:
    """A forward/backward chain with residuals: 2 * layers + 1 units."""
    sizes: list[int] = []
    prod: list[int] = []
    cons: list[list[int]] = []
    outs: list[int] = []

    def buf(size: int, p: int) -> int:
        sizes.append(size)
        prod.append(p)
        cons.append([])
        return len(sizes) - 1

    u = 0
    acts = [buf(rng.randint(1, 64) << 10, -1)]
    weights = []
    for i in range(layers):
        w = buf(rng.randint(1, 16) << 10, -1)
        cons[acts[-1]].append(u)
        cons[w].append(u)
        if i >= 2 and rng.random() < 0.3:
            cons[acts[-2]].append(u)
        weights.append(w)
        acts.append(buf(rng.randint(1, 64) << 10, u))
        u += 1
    cons[acts[-1]].append(u)
    g = buf(1 << 10, u)
    u += 1
    for i in reversed(range(layers)):
        cons[g].append(u)
        cons[acts[i]].append(u)
        cons[weights[i]].append(u)
        if rng.random() < 0.5:
            cons[acts[i + 1]].append(u)
        outs.append(buf(sizes[weights[i]], u))
        g = buf(sizes[acts[i]], u)
        u += 1
    outs.append(g)
    return dict(sizes=sizes, producer=prod, consumers=cons, outputs=outs, num_units=u)


def wide_dag(rng: random.Random, n: int, window: int) -> dict:
    """Units read 1-3 buffers produced by the previous `window` units."""
    sizes: list[int] = []
    prod: list[int] = []
    cons: list[list[int]] = []
    for _ in range(2):
        sizes.append(rng.randint(1, 100))
        prod.append(-1)
        cons.append([])
    for u in range(n):
        cands = [b for b in range(len(sizes)) if prod[b] == -1 or prod[b] >= u - window]
        for b in rng.sample(cands, min(len(cands), rng.randint(1, 3))):
            cons[b].append(u)
        for _ in range(rng.choice([1, 1, 2])):
            sizes.append(int(rng.lognormvariate(3, 1)) + 1)
            prod.append(u)
            cons.append([])
    return dict(sizes=sizes, producer=prod, consumers=cons, outputs=[len(sizes) - 1], num_units=n)


def bounds_of(p: schedule.Problem) -> dict:
    d = CORE.lower_bounds(p._p, True, True, True)
    keys = ("event_cut", "forward_trap", "reverse_trap", "joint_trap", "end_steps")
    return {k: int(d[k]) for k in keys}


def timed_bounds(p: schedule.Problem, forward: bool, reverse: bool, joint: bool) -> float:
    t = time.perf_counter()
    CORE.lower_bounds(p._p, forward, reverse, joint)
    return time.perf_counter() - t


def random_table(count: int, seed: int, model: str) -> tuple[list[str], dict]:
    rng = random.Random(seed)
    hits = {k: 0 for k in ("max(F,R)", "F", "R", "EC", "J", "solve certified", "solve optimal")}
    names = ("max(F,R)", "F", "R", "EC", "J", "all five")
    hits.update({"J": 0, "all five": 0})
    worst = {k: (1.0, None) for k in names}
    t_bounds, t_solve, sizes = [], [], []
    for i in range(count):
        n = rng.randint(6, 16)
        if model == "buffer":
            spec = buffer_dag(rng, n)
        else:
            spec = vertex_dag(rng, n, rng.uniform(0.15, 0.45))
        p = schedule.Problem(**spec)
        opt, _ = p.exhaustive_optimum()
        t = time.perf_counter()
        b = bounds_of(p)
        t_bounds.append(time.perf_counter() - t)
        s = p.solve(time_limit_s=1.0)
        t_solve.append(s.seconds)
        sizes.append(n)
        assert s.peak >= opt and max(b.values()) <= opt, (i, spec)
        vals = {
            "max(F,R)": max(b["forward_trap"], b["reverse_trap"]),
            "F": b["forward_trap"],
            "R": b["reverse_trap"],
            "EC": b["event_cut"],
            "J": b["joint_trap"],
            "all five": max(b.values()),
        }
        for k, v in vals.items():
            hits[k] += v == opt
            ratio = opt / v if v else float("inf")
            if ratio > worst[k][0]:
                worst[k] = (ratio, i)
        hits["solve certified"] += s.certified
        hits["solve optimal"] += s.optimal and s.peak == opt
    lines = [
        f"| bound | equals OPT (of {count}) | worst OPT/bound | source |",
        "|---|---|---|---|",
    ]
    source = {"max(F,R)": "773/800, worst 1.23", "EC": "671/800", "F": "", "R": ""}
    for k in names:
        lines.append(f"| {k} | {hits[k]} | {worst[k][0]:.3f} | {source.get(k, '(ours)')} |")
    lines += [
        "",
        f"solve(time_limit_s=1): certified by a min-cut bound {hits['solve certified']}/{count}, "
        f"proven optimal (bound or exact search) and equal to the DP optimum "
        f"{hits['solve optimal']}/{count}.",
        f"Units per graph: {min(sizes)}-{max(sizes)} (mean {statistics.mean(sizes):.1f}). "
        f"Time per graph: all four bounds mean {1e3 * statistics.mean(t_bounds):.2f} ms "
        f"(max {1e3 * max(t_bounds):.2f} ms); solve() mean {1e3 * statistics.mean(t_solve):.2f} ms "
        f"(max {1e3 * max(t_solve):.2f} ms).",
    ]
    hits["worst max(F,R)"] = worst["max(F,R)"][0]
    hits["worst all five"] = worst["all five"][0]
    return lines, hits


def ratio_of(spec: dict) -> tuple[float, float]:
    """OPT / max(F, R) and OPT / max(all five bounds)."""
    p = schedule.Problem(**spec)
    opt, _ = p.exhaustive_optimum()
    b = bounds_of(p)
    fr = max(b["forward_trap"], b["reverse_trap"])
    return opt / max(fr, 1), opt / max(max(b.values()), 1)


def mutate(rng: random.Random, spec: dict) -> dict:
    n = spec["num_units"]
    sizes = list(spec["sizes"])
    cons = [list(c) for c in spec["consumers"]]
    prod = spec["producer"]
    pos = {prod[b]: b for b in range(n)}  # unit -> its tensor
    order = schedule.Problem(**spec)._p.topological_order()
    kind = rng.random()
    if kind < 0.5:
        b = rng.randrange(n)
        sizes[b] = max(1, min(100, sizes[b] + rng.choice([-30, -10, -3, 3, 10, 30])))
    else:
        i, j = sorted(rng.sample(range(n), 2))
        u, v = order[i], order[j]
        b = pos[u]
        if v in cons[b]:
            cons[b].remove(v)
        else:
            cons[b].append(v)
    outputs = [b for b in range(n) if not cons[b]]
    return dict(sizes=sizes, producer=list(prod), consumers=cons, outputs=outputs, num_units=n)


def adversarial(seed: int, restarts: int, steps: int, objective: int) -> list[str]:
    """Hill climbing on OPT/bound; objective 0: max(F,R), 1: all five bounds."""
    rng = random.Random(seed)
    best, best_other, best_spec = 1.0, 1.0, None
    evals = 0
    t0 = time.perf_counter()
    for _ in range(restarts):
        spec = vertex_dag(rng, 13, rng.uniform(0.15, 0.45))
        ratios = ratio_of(spec)
        cur = ratios[objective]
        if cur > best:
            best, best_other, best_spec = cur, ratios[1 - objective], spec
        for _ in range(steps):
            cand = mutate(rng, spec)
            ratios = ratio_of(cand)
            evals += 1
            if ratios[objective] >= cur:
                spec, cur = cand, ratios[objective]
            if ratios[objective] > best:
                best, best_other, best_spec = ratios[objective], ratios[1 - objective], cand
    dt = time.perf_counter() - t0
    name = ["max(F,R)", "max(all five)"][objective]
    other = ["max(all five)", "max(F,R)"][objective]
    return [
        f"Objective OPT/{name}: {restarts} restarts x {steps} mutations = {evals} 13-vertex "
        f"instances ({dt:.0f} s). Worst OPT/{name} found: **{best:.3f}** "
        f"(OPT/{other} on that instance: {best_other:.3f}).",
        "",
        f"Worst instance: `{best_spec}`",
        "",
    ]


def speed(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [
        "| graph | units | F | R | F+R | F+R+J | solve(1 s) peak / bound | certified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cases = [(f"training chain #{i}", training_graph(rng, 129)) for i in range(2)]
    cases += [(f"wide DAG window {w}", wide_dag(rng, 259, w)) for w in (4, 16, 32)]
    for name, spec in cases:
        p = schedule.Problem(**spec)
        tf = timed_bounds(p, True, False, False)
        tr = timed_bounds(p, False, True, False)
        tfr = timed_bounds(p, True, True, False)
        tj = timed_bounds(p, True, True, True)
        s = p.solve(time_limit_s=1.0)
        lines.append(
            f"| {name} | {p.num_units} | {tf:.3f} s | {tr:.3f} s | {tfr:.3f} s | {tj:.3f} s | "
            f"{s.peak} / {s.lower_bound} | {s.certified} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    global CORE
    parser = make_parser(__doc__, whole_doc=True)
    parser.add_argument("--graphs", type=int, default=800, help="random DAGs per generator")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument(
        "--restarts", type=int, default=20, help="adversarial local search: restarts"
    )
    parser.add_argument("--steps", type=int, default=1000, help="adversarial search: steps each")
    add_out_quick(parser, out="write the markdown report here", quick=None, type=Path)
    args = parser.parse_args(argv)
    CORE = schedule.schedule_extension()
    command = "PYTHONPATH=. .venv/bin/python -m benchmarks.bench_bounds " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    out = [
        "# Lower bounds and certification (design.md §3.2)",
        "",
        f"Command: `{command.strip()}`",
        "",
        "Machine: 2 shared CPU cores (other builds running), one thread, -O3 build.",
        "Generators: see the module docstring of `benchmarks/bench_bounds.py`.",
        "",
        "F = forward trap, R = reverse trap, EC = event cut; J = joint trap and 'all five' ="
        " max(EC, F, R, J, end steps) are our additions (docs/lower_bounds.md).",
        "",
    ]
    results = {}
    for model in ("buffer", "vertex"):
        t = time.perf_counter()
        lines, results[model] = random_table(args.graphs, args.seed, model)
        out += [f"## {args.graphs} random DAGs, {model} model, vs the exhaustive optimum", ""]
        out += lines + [f"(section time {time.perf_counter() - t:.0f} s)", ""]
    out += [
        "## Adversarial search (source: 1.50 for OPT/max(F,R))",
        "",
        "Hill climbing over 13-vertex DAGs of the vertex model: a mutation changes one size "
        "or toggles one edge u -> v (u before v); it is kept when the ratio does not drop.",
        "",
    ]
    for objective in (0, 1):
        out += adversarial(args.seed + 1 + objective, args.restarts, args.steps, objective)
    out += [
        "## Speed target: both traps on 259-unit graphs (< 1 s)",
        "",
        "Each bound column is one fresh call (its own event-cut pass included).",
        "",
    ]
    out += speed(args.seed + 2) + [""]
    b, v = results["buffer"], results["vertex"]
    g = args.graphs
    out += [
        "## Comparison with the source",
        "",
        f"- Buffer model (the shape of compiled unit graphs): max(F,R) exact on {b['max(F,R)']}/{g} "
        f"(source 773/800), event cut {b['EC']}/{g} (source 671/800), worst OPT/max(F,R) "
        f"{b['worst max(F,R)']:.3f} (source 1.23). The source's generator is unknown, so the "
        "rates are comparable in kind, not digit for digit; the ordering EC < F, R < max(F,R) and "
        "the incomparability of F and R are reproduced.",
        f"- Vertex model: pair bounds cannot see sink outputs accumulating across independent "
        f"branches (max(F,R) exact on {v['max(F,R)']}/{g}, worst {v['worst max(F,R)']:.2f}); "
        f"the end-steps bound fixes most of it (all five exact on {v['all five']}/{g}, worst "
        f"{v['worst all five']:.3f}). For the same reason the adversarial search on OPT/max(F,R) "
        "degenerates into independent outputs; the meaningful adversarial figure is OPT/max(all "
        "five), to compare with the source's 1.50.",
        "- The exact capacity search proved the optimum on every random DAG (it matches the "
        "exhaustive DP), with or without a certifying bound.",
        "- Speed: all bounds on 259-unit graphs take about 0.1 s, inside the 1 s target. The "
        "search certifies chain-like training graphs at once; on wide random 259-unit DAGs it "
        "times out at 1 s and leaves a gap (heuristic peak vs bound).",
        "",
        "## Wrapper graphs of the Inductor pass",
        "",
        "Pending: the Inductor pass (another issue) produces these graphs; it calls "
        "`torch_replay.schedule.plan_unit_order(Problem(...))` per forward/backward graph "
        "(source: 115/122 certified in under 1 s each).",
        "",
    ]
    text = "\n".join(out)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
