"""Inductor wrapper-permutation pass (design.md §3.3) on 20+ architectures: peaks, variants, regeneration, compile time.

For each architecture, in inference (``eval()``, ``no_grad``) and training
(forward + backward of ``sum(out**2)``), CPU FP32, one thread:

- per compiled graph (forward / backward / inference): the peak of Inductor's
  default program modelled by the pass and measured by the counting CPU
  allocator (as the runtime calls it, Note [Input ownership]), the measured
  peak of the ``reorder_for_peak_memory=False`` variant, the program the pass
  deploys (default or variant, permuted or not) with its modelled / measured
  peak, the min-cut lower bound and whether it certifies the result;
- the regeneration baseline (Note [Regeneration baseline] in
  ``benchmarks/regenerate.py``): where the pass found a better order, that
  order is fed back to Inductor's scheduler and the program regenerated;
  ``predicted`` is the pass's modelled peak of its order, ``measured`` the
  regenerated program's peak;
- per step: the real-step peak from the profiler's memory events (whole step,
  above what was live at its start) under plain Inductor and under the pass,
  outputs and gradients bitwise equal to plain Inductor, and compile time
  cold (empty cache directory, in-memory caches cleared) and warm (same
  directory, in-memory caches cleared, dynamo reset) for both backends, in
  this process (first step minus a steady step; for compile memory in fresh
  processes see ``benchmarks/bench_compile.py``).

The pass runs with ``PassConfig(variant_bound=False)`` here, so that every
variant is built and measured and its peak is in the table (with the default,
a variant whose lower bound rules it out is reported with that bound only,
Note [Variant bound]); compile times here include those variant builds.

Models: compact hand-written versions of each family (they run on the CPU
torch 2.13 environment); with ``--tv`` the torchvision models instead (needs a
torchvision that imports, e.g. the torch 2.14.1 environment of
``TORCH_REPLAY_TORCH=2.14.1 bash scripts/setup.sh``).

Run:
    nice -n 10 .venv/bin/python -m benchmarks.bench_inductor [--quick | --models vit,lstm]
        [--modes inference,training] [--tv --tv-size 64] [--name inductor.md]
        [--out benchmarks/results]
prints the table; with --out, writes <out>/<name> and <out>/<name without .md>.json
(rewritten after every model). ``--quick`` runs three small models.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn

import inductor_pass  # (registers the backend)
from benchmarks import regenerate
from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.inductor_table import command_line, render
from benchmarks.lib.inductor_zoo import COMPACT, QUICK, model_list
from inductor_pass import PassConfig, make_backend

# --------------------------------------------------------------------------- runs


def output_tensors(out):
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def run_step(f, m, inputs, train):
    """One step; returns outputs (and gradients) detached."""
    torch.manual_seed(0)
    if not train:
        with torch.no_grad():
            return [t.detach() for t in output_tensors(f(*inputs))]
    for p in m.parameters():
        p.grad = None
    out = output_tensors(f(*inputs))
    sum(t.float().pow(2).sum() for t in out).backward()
    return [t.detach() for t in out] + [p.grad for p in m.parameters() if p.grad is not None]


def profiled_peak(step) -> int:
    """Peak bytes above the start while ``step()`` runs and its result is dropped,
    from the profiler's CPU memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = step()
        del res
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def step_peak(f, m, inputs, train):
    """Peak bytes of one step above the start (gradients cleared first)."""
    for p in m.parameters():
        p.grad = None
    return profiled_peak(lambda: run_step(f, m, inputs, train))


def _fresh(cache):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()


def compile_run(model, make_inputs, train, backend, cache, profile_step=False):
    """Compile and run the first step; returns (model copy, f, results, compile s, step peak)."""
    _fresh(cache)
    m = copy.deepcopy(model)
    if not train:
        m.eval()
    torch.manual_seed(1)
    inputs = make_inputs()
    f = torch.compile(m, backend=backend)
    t0 = time.perf_counter()
    res = run_step(f, m, inputs, train)
    first = time.perf_counter() - t0
    steady = []
    for _ in range(2):
        t0 = time.perf_counter()
        run_step(f, m, inputs, train)
        steady.append(time.perf_counter() - t0)
    peak = step_peak(f, m, inputs, train) if profile_step else None
    return res, first - min(steady), peak


def bitwise_equal(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def one(key, name, build, make_inputs, train, args):
    """Every measurement of one (model, mode); returns the row dict."""
    torch.manual_seed(0)
    model = build()
    row = {"key": key, "model": name, "mode": "training" if train else "inference"}
    with contextlib.ExitStack() as stack:
        d_plain = tempfile.mkdtemp(prefix="bench_ind_plain_")
        d_ours = tempfile.mkdtemp(prefix="bench_ind_ours_")
        stack.callback(shutil.rmtree, d_plain, True)
        stack.callback(shutil.rmtree, d_ours, True)
        ref, row["cold_plain_s"], row["step_peak_plain"] = compile_run(
            model, make_inputs, train, "inductor", d_plain, profile_step=True
        )
        _, row["warm_plain_s"], _ = compile_run(model, make_inputs, train, "inductor", d_plain)
        cfg = PassConfig(time_limit_s=1.0, variant_bound=False)  # every variant measured
        inductor_pass.clear_reports()
        with regenerate.Capture() as cap:
            got, cold, row["step_peak_ours"] = compile_run(
                model, make_inputs, train, make_backend(cfg), d_ours, profile_step=True
            )
        row["cold_ours_s"] = cold - cap.overhead_s
        row["capture_overhead_s"] = cap.overhead_s
        reps = inductor_pass.reports()
        row["bitwise"] = bitwise_equal(ref, got)
        del ref, got
        inductor_pass.clear_reports()
        _, row["warm_ours_s"], _ = compile_run(model, make_inputs, train, make_backend(cfg), d_ours)
        warm_reps = inductor_pass.reports()
        row["warm_from_cache"] = sum(
            "decision from the pass's cache" in " ".join(r.notes) for r in warm_reps
        )
        row["warm_graphs"] = len(warm_reps)
        # Regeneration (after the timed runs; in the cold cache directory).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = d_ours
        graphs = []
        for r in reps:
            g = next((c for c in cap.graphs if c.report is r), None)
            graphs.append(graph_row(r, g, args))
        row["graphs"] = graphs
    return row


def graph_row(r, g, args):
    off = r.variants.get("reorder_for_peak_memory=False") or {}
    ours = r.measured_permuted_peak if r.deployed else r.measured_original_peak
    gr = {
        "kind": r.kind,
        "units": r.num_units,
        "owned_inputs": r.owned_inputs,
        "num_inputs": r.num_inputs,
        "modelled_default": r.modelled_original_peak,
        "measured_default": r.measured_original_peak,
        "measured_reorder_off": off.get("measured_original_peak"),
        "modelled_reorder_off": off.get("modelled_original_peak"),
        "variant": r.variant,
        "deployed": r.deployed,
        "modelled_ours": r.modelled_permuted_peak if r.deployed else r.modelled_original_peak,
        "measured_ours": ours,
        "modelled_best_order": r.modelled_permuted_peak,
        "lower_bound": r.lower_bound,
        "certified": r.certified,
        "byte_exact": r.byte_exact,
        "pass_s": r.pass_seconds,
        "search_s": r.search_seconds,
        "reason": r.reason,
        "variants": r.variants,
        "regen": None,
    }
    target = r.permuted_source
    better = (
        target is not None
        and r.modelled_permuted_peak is not None
        and r.modelled_original_peak is not None
        and (r.modelled_permuted_peak < r.modelled_original_peak or r.deployed)
    )
    if args.regen_all and target is None:
        target = r.original_source
    if g is not None and target is not None and (better or args.regen_all):
        t0 = time.perf_counter()
        try:
            rg = regenerate.regenerate(g, target)
            gr["regen"] = {
                "predicted": r.modelled_permuted_peak if better else r.modelled_original_peak,
                "measured": rg.measured_peak,
                "bitwise": rg.bitwise,
                "matched_nodes": rg.matched,
                "nodes": rg.nodes,
                "in_order": rg.in_order,
                "better_order": better,
                "seconds": time.perf_counter() - t0,
                "notes": rg.notes,
            }
        except Exception as exc:
            gr["regen"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return gr


def _write_results(path, lines, head, done, summary, rows, failures):
    """The Markdown table at ``path`` and its data beside it (``.json``)."""
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    data = {**head, "done": done, "summary": summary, "rows": rows, "failures": failures}
    with open(os.path.splitext(path)[0] + ".json", "w") as fh:
        json.dump(data, fh, indent=1, default=str)


def merge(args):
    """Render several runs' JSON files as one table (``--merge``)."""
    parts = []
    for f in [x for x in args.merge.split(",") if x]:
        with open(f) as fh:
            parts.append(json.load(fh))
    rows = [r for p in parts for r in p["rows"]]
    failures = [x for p in parts for x in p["failures"]]
    commands = [p["command"] for p in parts] + [command_line()]
    wall = sum(p.get("wall_s") or 0 for p in parts) or None
    stopped = [
        f"part {i + 1} was stopped after {len(p['rows'])} configuration(s)"
        for i, p in enumerate(parts)
        if not p["done"]
    ]
    lines, summary = render(rows, failures, 0.0, True, parts[0]["models"], commands, wall)
    lines.insert(
        2 + len(commands),
        f"(The first {len(parts)} commands ran as parallel processes over disjoint "
        "model/mode sets and wrote their parts' JSON; the last command merged them. "
        + ("; ".join(stopped) + " (their remaining models ran in later parts)." if stopped else "")
        + " Wall time below is the sum over parts.)",
    )
    if args.out:
        _write_results(
            os.path.join(args.out, args.name),
            lines,
            {"commands": commands, "torch": parts[0]["torch"], "models": parts[0]["models"]},
            True,
            summary,
            rows,
            failures,
        )
    print("\n".join(lines))


def main():
    ap = make_parser(
        "Benchmark the torch_replay Inductor pass on 20+ architectures (inference "
        "and training): modelled vs measured peaks per graph, Inductor's program variants, the "
        "regeneration baseline, real-step peaks (profiler) and compile time cold and warm. "
        "Prints the table; writes results only with --out.",
        whole_doc=True,
        formatter=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--models",
        default="",
        help="comma-separated model keys (default: all): " + ",".join(k for k, *_ in COMPACT),
    )
    ap.add_argument("--modes", default="inference,training", help="inference,training")
    ap.add_argument(
        "--tv", action="store_true", help="torchvision models instead of the compact vision models"
    )
    ap.add_argument("--tv-size", type=int, default=64, help="torchvision input side")
    ap.add_argument(
        "--regen-all",
        action="store_true",
        help="also regenerate graphs where the pass found no better order",
    )
    ap.add_argument("--name", default="inductor_arch.md", help="results file name")
    ap.add_argument(
        "--merge",
        default="",
        help="comma-separated .json files of earlier runs (e.g. the parts of one run split "
        "over processes): render them as one table into --out/--name, run nothing",
    )
    add_out_quick(
        ap,
        out="folder to write <name> and its .json into (e.g. benchmarks/results); "
        "without it nothing is written",
        quick=f"small run: models {','.join(QUICK)}, both modes",
    )
    args = ap.parse_args()
    if args.merge:
        return merge(args)
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1
    started = time.perf_counter()
    tv_info = "compact hand-written models"
    if args.tv:
        import torchvision

        tv_info = (
            f"torchvision {torchvision.__version__} models (weights=None) at "
            f"{args.tv_size}x{args.tv_size} where listed, compact models otherwise"
        )
    todo = model_list(args)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    if args.quick:
        keys = list(QUICK)
    if keys:
        todo = [t for t in todo if t[0] in keys]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    path = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, args.name)
    rows, failures = [], []
    # Warm-up: one-time costs of the first compile in a process (imports, toolchain
    # probes) would otherwise land on the first model's plain cold compile.
    with tempfile.TemporaryDirectory(prefix="bench_ind_warmup_") as d:
        for backend in ("inductor", make_backend(PassConfig())):
            compile_run(nn.Linear(4, 4), lambda: (torch.randn(2, 4),), True, backend, d)
    inductor_pass.clear_reports()

    def write(done):
        lines, summary = render(rows, failures, started, done, tv_info)
        if path is not None:
            head = {"command": command_line(), "torch": torch.__version__, "models": tv_info}
            _write_results(path, lines, head, done, summary, rows, failures)
        return lines

    for key, name, build, make_inputs in todo:
        for mode in modes:
            t0 = time.perf_counter()
            print(f"{mode}: {name}", flush=True)
            try:
                rows.append(one(key, name, build, make_inputs, mode == "training", args))
            except Exception as exc:
                failures.append(f"{mode} / {name}: {type(exc).__name__}: {str(exc)[:300]}")
                print("  FAILED:", failures[-1], flush=True)
            print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
            write(False)
    print("\n".join(write(True)))


if __name__ == "__main__":
    main()
