"""The Inductor pass on three small models, inference and training, on one device.

On CUDA this is the pass's CUDA path: Triton kernels in the wrapper, the
measured guard (``torch.cuda.max_memory_allocated`` of both programs, deployed
only when lower and bitwise identical) and kernel times from CUPTI
(``torch_replay/_planning/kernel_timing.py``). On CPU the same runs use the counting
allocator's byte-exact guard, so ``scripts/gpu_check.sh --dry-run`` keeps this
script working where no GPU exists.

    python -m benchmarks.bench_inductor_device --device cuda --out DIR [--size small]
        [--models block,resnet,unet] [--modes inference,training] [--budget-s 150]

Writes ``DIR/inductor_<device>.md`` and ``.json`` after every run (a cut run
keeps what finished). Exit status 1 when a run failed or was not bitwise
identical to plain ``torch.compile``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import torch

import inductor_pass  # (registers the backend)
from benchmarks.lib.cli import add_out_quick, make_parser
from benchmarks.lib.zoo_convnets import SmallResNet, UNet
from benchmarks.lib.zoo_sequence import Block
from inductor_pass import PassConfig, make_backend

MODELS = {
    # name: (builder, input shape at --size tiny, at --size small)
    "block": (lambda: Block(64, 4), (2, 16, 64), (8, 128, 64)),
    "resnet": (lambda: SmallResNet(8, (1, 1)), (1, 3, 16, 16), (8, 3, 64, 64)),
    "unet": (lambda: UNet(8), (1, 3, 16, 16), (4, 3, 64, 64)),
}


def _leaves(out):
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def run(model, x, backend, train):
    """One compiled step; returns outputs (and gradients) detached."""
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    m.train(train)
    f = torch.compile(m, backend=backend)
    if train:
        out = _leaves(f(x))
        sum(t.float().pow(2).sum() for t in out).backward()
        return [t.detach() for t in out] + [p.grad for p in m.parameters() if p.grad is not None]
    with torch.no_grad():
        return [t.detach() for t in _leaves(f(x))]


def one(name, mode, device, size):
    build, tiny, small = MODELS[name]
    torch.manual_seed(0)
    model = build().to(device)
    x = torch.randn(*(tiny if size == "tiny" else small), device=device)
    train = mode == "training"
    t0 = time.perf_counter()
    ref = run(model, x, "inductor", train)
    t_plain = time.perf_counter() - t0
    inductor_pass.clear_reports()
    t0 = time.perf_counter()
    got = run(model, x, make_backend(PassConfig(time_limit_s=1.0)), train)
    t_ours = time.perf_counter() - t0
    bitwise = len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    graphs = []
    for r in inductor_pass.reports():
        d = r.as_dict()
        d["triton"] = bool(r.original_source and "triton" in r.original_source)
        graphs.append(d)
    return {
        "model": name,
        "mode": mode,
        "input": list(x.shape),
        "bitwise": bitwise,
        "compile_s": {"inductor": t_plain, "torch_replay": t_ours},
        "graphs": graphs,
    }


def _mib(x):
    return "-" if x is None else f"{x / 2**20:.3f}"


def markdown(doc) -> str:
    lines = [
        f"# Inductor pass on {doc['device']} ({doc['gpu'] or 'no GPU'})",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"torch {doc['torch']}, triton {doc['triton']}; peaks in MiB of the graph's own "
        "allocations (CUDA: `max_memory_allocated` above the start; CPU: counting allocator); "
        "kernel ms = device time per run of the original / permuted program "
        "(source in brackets; CUDA only).",
        "",
        "| model | mode | graph | triton | units | modelled orig / perm | measured orig / perm "
        "| lower bound | cert | deployed | bitwise | kernel ms | pass s | reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run_ in doc["runs"]:
        if "error" in run_:
            lines.append(f"| {run_['model']} | {run_['mode']} | FAILED: {run_['error'][:200]} |")
            continue
        for g in run_["graphs"]:
            k = g.get("kernel_seconds") or {}
            kms = (
                f"{k['original'] * 1e3:.3f} / {k['permuted'] * 1e3:.3f} ({k['source']})"
                if k
                else "-"
            )
            lines.append(
                f"| {run_['model']} | {run_['mode']} | {g['kind']} | {g['triton']} "
                f"| {g['num_units']} "
                f"| {_mib(g['modelled_original_peak'])} / {_mib(g['modelled_permuted_peak'])} "
                f"| {_mib(g['measured_original_peak'])} / {_mib(g['measured_permuted_peak'])} "
                f"| {_mib(g['lower_bound'])} | {g['certified']} | {g['deployed']} "
                f"| {run_['bitwise']} | {kms} | {g['pass_seconds']:.1f} | {g['reason'][:160]} |"
            )
    s = doc["totals"]
    lines += [
        "",
        f"Runs: {s['runs']} ({s['failed']} failed, {s['skipped']} not started: time budget); "
        f"graphs: {s['graphs']}; bitwise identical runs: {s['bitwise']}/{s['runs']}; "
        f"deployed: {s['deployed']}; certified: {s['certified']}; wall {s['wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def _totals(doc, skipped, started):
    graphs = [g for r in doc["runs"] for g in r.get("graphs", [])]
    return {
        "runs": len(doc["runs"]),
        "failed": sum("error" in r for r in doc["runs"]),
        "skipped": skipped,
        "graphs": len(graphs),
        "bitwise": sum(bool(r.get("bitwise")) for r in doc["runs"]),
        "deployed": sum(bool(g["deployed"]) for g in graphs),
        "certified": sum(bool(g["certified"]) for g in graphs),
        "wall_s": time.perf_counter() - started,
    }


def main(argv=None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default="small", choices=["tiny", "small"])
    ap.add_argument("--models", default="block,resnet,unet")
    ap.add_argument("--modes", default="inference,training")
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no run after this")
    add_out_quick(ap, out="folder for inductor_<device>.md/.json", quick=None, required=True)
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    unknown = set(a.models.split(",")) - set(MODELS)
    if unknown:
        print(
            f"error: unknown model(s) {sorted(unknown)}; known: {sorted(MODELS)}", file=sys.stderr
        )
        return 2
    if a.device == "cpu":
        torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = "not importable"
    doc = {
        "device": a.device,
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "command": " ".join(["python", *sys.argv]),
        "runs": [],
    }
    todo = [(m, mode) for m in a.models.split(",") for mode in a.modes.split(",")]
    started = time.perf_counter()
    skipped = 0
    for name, mode in todo:
        if time.perf_counter() - started > a.budget_s:
            skipped += 1
            continue
        print(f"{name} / {mode} ...", flush=True)
        try:
            doc["runs"].append(one(name, mode, a.device, a.size))
        except Exception as exc:
            doc["runs"].append(
                {"model": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}"}
            )
        doc["totals"] = _totals(doc, skipped, started)
        stem = os.path.join(a.out, f"inductor_{a.device}")
        with open(stem + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(markdown(doc))
    doc["totals"] = _totals(doc, skipped, started)
    with open(os.path.join(a.out, f"inductor_{a.device}.md"), "w") as f:
        f.write(markdown(doc))
    with open(os.path.join(a.out, f"inductor_{a.device}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(markdown(doc))
    t = doc["totals"]
    return 0 if t["failed"] == 0 and t["bitwise"] == t["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
