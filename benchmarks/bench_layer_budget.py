"""Budget plans for layer-wise models side by side with transformers' ``every_n_layers`` and
torch.compile's ``activation_memory_budget`` (CPU, fresh processes).

    python -m benchmarks.bench_layer_budget [--rounds 2] [--steps 3] [--quick]
                                            [--models llama,conformer] [--out FILE.md]
                                            [--keep-grads DIR]

Models (transformers, built from configs, no downloads; dropout on):

* ``llama``: Llama-style causal LM, 8 layers, hidden 256, sequence 256, batch 2;
* ``conformer``: Wav2Vec2-Conformer encoder, whose layers hold BatchNorm (its running
  statistics are updated twice by torch's checkpoint: preservation matters); LayerDrop
  off (it would skip random layers, differently under torch.compile).

Rows, each run in its own fresh process per round (rounds interleaved, the order
rotated): no checkpointing; transformers' own checkpointing (torch.utils.checkpoint)
every layer and ``every_n_layers`` 2, 3, 4; our plan (``tr_hf.enable(model,
budget=...)``) at the plan's smallest feasible budget, at the predicted peaks of
``every_n_layers`` 2, 3, 4's layouts (each checkpointed layer with its leanest engine: a
budget at which the plan can do what that row does) and at the all-kept peak (nothing
checkpointed), planned from one costs
file calibrated first in its own process; ``torch.compile`` of the model with
``torch._functorch.config.activation_memory_budget`` 1.0, 0.7, 0.5, 0.3; our plan at the
middle budget inside ``torch.compile``.

Each process: one gradient step (seed 5) whose gradients and buffers are compared with
the no-checkpointing row's (bitwise, and the largest difference; compiled rows also with
compile at budget 1.0), then AdamW training steps: one warm-up, ``--steps`` timed (median
kept). Peak: peak RSS over a timed step above the RSS before it (VmHWM after a reset;
glibc's mmap threshold fixed at 64 KiB so freed tensors leave RSS), gradients set to None
first, so it counts activations, gradients and temporaries. For our rows also the plan's
prediction of the same quantity (``plan.peak`` minus parameters, buffers and optimizer
state) and ``measure_step``'s tracked peak of one real step (engine bytes included).
Times and peaks: medians over rounds. Nothing is written without ``--out``; ``--out
X.md`` also writes ``X.json`` and ``X.png``; ``--keep-grads DIR`` keeps each row's
first-step gradients and buffers in DIR (``torch.save``; the row's ``grads`` in the JSON).

``--quick`` is the smoke run (about a minute): the Llama only (4 layers, hidden 64,
sequence 32), one round of one timed step, the rows no checkpointing, transformers every
layer and our plan at 3 budgets (smallest feasible, halfway, all kept), no compiled rows
unless ``--compile-rounds`` asks for them (``--models`` adds the conformer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks.lib.cli import add_out_quick, child_env, emit, make_parser, run_module

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
HF_STRIDES = (2, 3, 4)
QUICK_FRACTIONS = (0.0, 0.5, 1.0)
COMPILE_BUDGETS = (1.0, 0.7, 0.5, 0.3)


# ------------------------------------------------------------------ the models


def build(name: str, quick: bool):
    """(model in train mode, example batch, loss function), seeded."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    if name == "llama":
        layers, hidden, seq = (4, 64, 32) if quick else (8, 256, 256)
        cfg = T.LlamaConfig(
            vocab_size=1024, hidden_size=hidden, intermediate_size=int(2.75 * hidden),
            num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=layers,
            attention_dropout=0.1, max_position_embeddings=seq,
        )  # fmt: skip
        model = T.LlamaForCausalLM(cfg)
        ids = torch.randint(0, 1024, (2, seq), generator=torch.Generator().manual_seed(3))
        return model.train(), {"input_ids": ids, "labels": ids, "use_cache": False}, None
    if name == "conformer":
        layers, hidden, samples = (2, 32, 2000) if quick else (6, 128, 8000)
        cfg = T.Wav2Vec2ConformerConfig(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
            intermediate_size=2 * hidden, conv_dim=(32, 32), conv_stride=(5, 4),
            conv_kernel=(10, 4), num_feat_extract_layers=2, conv_depthwise_kernel_size=15,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
            hidden_dropout=0.1, attention_dropout=0.1, vocab_size=16, layerdrop=0.0,
        )  # fmt: skip
        model = T.Wav2Vec2ConformerModel(cfg)
        x = torch.randn(2, samples, generator=torch.Generator().manual_seed(3))
        return model.train(), {"input_values": x}, _conformer_loss
    raise ValueError(name)


def _conformer_loss(out):
    return out.last_hidden_state.float().pow(2).mean()


def _loss(out, loss_fn):
    return loss_fn(out) if loss_fn is not None else out.loss


# ------------------------------------------------------------------- a child


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _rss_reset() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def _turn_on(model, batch, loss_fn, row: str, costs: str):
    import torch

    from torch_replay.integrations import transformers as tr_hf

    kind, _, arg = row.partition(":")
    plan = None
    if kind == "hf":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=int(arg)
        )
    if kind in ("ours", "ours+compile"):
        plan = tr_hf.enable(
            model, budget=int(arg), example_batch=batch, costs=costs, loss_fn=loss_fn
        )
    step_model = model
    if kind == "compile":
        torch._functorch.config.activation_memory_budget = float(arg)
    if kind in ("compile", "ours+compile"):
        step_model = torch.compile(model)
    return step_model, plan


def _stride_budget(free, k: int) -> int:
    """The predicted peak of transformers' ``every_n_layers=k`` layout (layer ``i``
    checkpointed when ``i % k == 0``) with each checkpointed layer's leanest engine:
    a budget at which our plan can do at least what that row does."""
    from torch_replay._planning.layer_order import ordered_peak

    chosen = []
    for i, opts in enumerate(free.layer_options):
        engines = [o for o in opts if o.name != "eager"]
        if i % k == 0 and engines:
            chosen.append(min(engines, key=lambda o: (o.retained + o.transient, o.time)))
        else:
            chosen.append(next(o for o in opts if o.name == "eager"))
    return ordered_peak(
        chosen, free.grads, persistent=free.persistent, floor=free.floor, head=free.head_bytes
    )


def child(args) -> None:
    import torch

    from torch_replay.step_peak import measure_step

    torch.set_num_threads(1)
    model, batch, loss_fn = build(args.model, args.quick)
    if args.row == "calibrate":
        from torch_replay.integrations import transformers as tr_hf

        t0 = time.perf_counter()
        calibration = {"quick": args.quick, "out": args.costs}
        free = tr_hf.enable(
            model, budget=1 << 50, example_batch=batch, loss_fn=loss_fn, calibration=calibration
        )
        seconds = time.perf_counter() - t0
        strides = {k: _stride_budget(free, k) for k in HF_STRIDES}
        print(
            json.dumps(
                {"min": free.min_budget, "max": free.peak, "seconds": seconds}
                | {"strides": strides}
            )
        )
        return
    step_model, plan = _turn_on(model, batch, loss_fn, args.row, args.costs)
    torch.manual_seed(5)
    _loss(step_model(**batch), loss_fn).backward()
    torch.save(
        {
            "grads": [p.grad for p in model.parameters()],
            "buffers": [b.clone() for b in model.buffers()],
        },
        args.grads,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        _loss(step_model(**batch), loss_fn).backward()
        opt.step()

    step()  # warm-up; the optimizer's state exists from here
    times, cpu, peaks = [], [], []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        base = _rss_reset()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        peaks.append(_status_kib("VmHWM") * 1024 - base)
    out = {
        "time": statistics.median(times),
        "cpu": statistics.median(cpu),
        "peak": statistics.median(peaks),
    }
    if plan is not None:
        from torch_replay.layer_budget import StepMemory

        held = StepMemory(grads=False).bytes(model)
        out.update(predicted=plan.peak - held, choices="".join(c[0].upper() for c in plan.choices))
        if "compile" not in args.row:
            opt.zero_grad(set_to_none=True)
            report = measure_step(step, model, optimizer=opt, plan=plan)
            out.update(tracked=report.measured_peak - report.static_bytes)
    print(json.dumps(out))


# ------------------------------------------------------------------ the parent


def _rows(cal: dict, compiled: bool, quick: bool) -> list[tuple[str, str]]:
    lo, hi = cal["min"], cal["max"]
    rows = [("no checkpointing", "none")]
    rows += [(f"HF every_n_layers={k}", f"hf:{k}") for k in ((1,) if quick else (1, *HF_STRIDES))]
    if quick:
        budgets = [int(lo + f * (hi - lo)) for f in QUICK_FRACTIONS]
    else:  # the extremes and the predicted peaks of every_n_layers=2, 3, 4's layouts
        budgets = sorted({lo, hi, *(min(hi, max(lo, b)) for b in cal["strides"].values())})
    rows += [(f"ours, budget {b / 2**20:.1f} MiB", f"ours:{b}") for b in budgets]
    if not compiled:
        return rows
    rows += [(f"compile, memory budget {f}", f"compile:{f}") for f in COMPILE_BUDGETS]
    mid = budgets[len(budgets) // 2]
    rows.append((f"ours in compile, budget {mid / 2**20:.1f} MiB", f"ours+compile:{mid}"))
    return rows


def _run_child(model: str, row: str, costs: str, grads: str, args) -> dict:
    flags = ["--child", "--model", model, "--row", row, "--costs", costs, "--grads", grads]
    flags += ["--steps", str(args.steps)] + (["--quick"] if args.quick else [])
    env = child_env(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    res = run_module("benchmarks.bench_layer_budget", flags, env=env)
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _compare(ref: dict, got: dict) -> tuple[bool, float, bool]:
    import torch

    pairs = list(zip(ref["grads"], got["grads"], strict=True))
    # A gradient None in one run only (a parameter the other left unused) makes the run
    # not bitwise equal; the largest difference is over the gradients both runs have.
    diffs = [(a - b).abs().max().item() for a, b in pairs if a is not None and b is not None]
    bitwise = all(d == 0 for d in diffs) and all((a is None) == (b is None) for a, b in pairs)
    buffers = all(torch.equal(a, b) for a, b in zip(ref["buffers"], got["buffers"], strict=True))
    return bitwise, max(diffs, default=0.0), buffers


def bench_model(model: str, args, tmp: str) -> dict:
    import torch

    load0 = os.getloadavg()[0]
    costs = os.path.join(tmp, f"{model}_costs.json")
    cal = _run_child(model, "calibrate", costs, "", args)
    if "error" in cal:
        raise RuntimeError(f"calibration of {model} failed: {cal['error']}")
    rows = _rows(cal, args.compile_rounds > 0, args.quick)
    runs: dict[str, list[dict]] = {row: [] for _, row in rows}
    for r in range(args.rounds):
        order = rows[r % len(rows) :] + rows[: r % len(rows)]
        for _, row in order:
            if "compile" in row and r >= args.compile_rounds:
                continue
            grads = os.path.join(args.keep_grads or tmp, f"{model}_{row.replace(':', '_')}_{r}.pt")
            runs[row].append(_run_child(model, row, costs, grads, args) | {"grads": grads})
            print(f"  {model} round {r} {row}: {runs[row][-1]}", file=sys.stderr)
    load = lambda row: torch.load(runs[row][0]["grads"])  # noqa: E731
    ref, ref_compile = load("none"), None
    if runs.get("compile:1.0") and "error" not in runs["compile:1.0"][0]:
        ref_compile = load("compile:1.0")
    table = []
    for label, row in rows:
        ok = [x for x in runs[row] if "error" not in x]
        entry = {"row": label, "key": row}
        if args.keep_grads:
            entry["grads"] = runs[row][0]["grads"]
        if not ok:
            entry["error"] = runs[row][0]["error"]
            table.append(entry)
            continue
        entry["time"] = statistics.median(x["time"] for x in ok)
        entry["cpu"] = statistics.median(x["cpu"] for x in ok)
        entry["peak"] = statistics.median(x["peak"] for x in ok)
        for k in ("predicted", "tracked", "choices"):
            if k in ok[0]:
                entry[k] = ok[0][k]
        got = load(row)
        entry["bitwise"], entry["max_diff"], entry["buffers"] = _compare(ref, got)
        if "compile" in row and ref_compile is not None:
            entry["vs_compile_1"] = _compare(ref_compile, got)[1]
        table.append(entry)
    return {
        "model": model,
        "calibration_s": cal["seconds"],
        "load": [os.getloadavg()[0], load0],
        "rows": table,
    }


def markdown(results: list[dict], command: str, args) -> str:
    import torch

    lines = [
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread per process; "
        f"{args.rounds} rounds of fresh processes ({args.compile_rounds} for the compiled "
        f"rows), {args.steps} timed AdamW steps each "
        "(medians). Peak = peak RSS of a step above the RSS before it (gradients None at "
        "the start: activations, gradients, temporaries). Predicted = the plan's peak "
        "minus parameters, buffers and optimizer state; tracked = `measure_step` (tensor "
        "storages + engine bytes) of one step. Gradients vs no checkpointing, first step, "
        "seed 5, dropout on.",
    ]
    for res in results:
        lines += [
            "",
            f"### {res['model']} (calibration {res['calibration_s']:.1f} s; load average "
            f"{res['load'][1]:.1f} at the start, {res['load'][0]:.1f} at the end)",
            "",
            "| row | step s | cpu s | peak MiB | predicted MiB | tracked MiB | plan | "
            "grads = eager | max grad diff | buffers = eager | diff vs compile 1.0 |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in res["rows"]:
            if "error" in e:
                lines.append(f"| {e['row']} | failed: {e['error']} |" + " |" * 9)
                continue
            mib = lambda k, e=e: f"{e[k] / 2**20:.1f}" if k in e else ""  # noqa: E731
            vs = f"{e['vs_compile_1']:.2g}" if "vs_compile_1" in e else ""
            lines.append(
                f"| {e['row']} | {e['time']:.3f} | {e['cpu']:.3f} | {mib('peak')} | "
                f"{mib('predicted')} | "
                f"{mib('tracked')} | {e.get('choices', '')} | {e['bitwise']} | "
                f"{e['max_diff']:.2g} | {e['buffers']} | {vs} |"
            )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    styles = {"none": "ks", "hf": "bo", "ours": "r^", "compile": "gD", "ours+compile": "mv"}
    for ax, res in zip(axes[0], results, strict=True):
        for kind, style in styles.items():
            pts = [e for e in res["rows"] if "time" in e and e["key"].split(":")[0] == kind]
            if pts:
                ax.plot(
                    [e["peak"] / 2**20 for e in pts], [e["time"] for e in pts], style, label=kind
                )
        ax.set(title=res["model"], xlabel="step peak above held state (MiB, RSS)", ylabel="step s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = make_parser(__doc__)
    add_out_quick(p, quick="the smoke run (about a minute: a small Llama, 3 budgets, 1 step)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--models", default=None, help="default llama,conformer (--quick: llama)")
    p.add_argument(
        "--compile-rounds",
        type=int,
        default=None,
        help="rounds of the compiled rows (0: none; default 1, --quick: 0)",
    )
    p.add_argument("--keep-grads", default=None, help="keep the rows' gradient files here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--model", "--row", "--costs", "--grads"):
        p.add_argument(name, default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.quick:
        args.rounds, args.steps = 1, 1
    if args.models is None:
        args.models = "llama" if args.quick else "llama,conformer"
    if args.compile_rounds is None:
        args.compile_rounds = 0 if args.quick else 1
    command = "python -m benchmarks.bench_layer_budget " + " ".join(argv or sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench_model(m, args, tmp) for m in args.models.split(",")]
    text = markdown(results, command.strip(), args)
    if args.out:
        stem = os.path.splitext(args.out)[0]
        with open(stem + ".json", "w") as f:
            json.dump(results, f, indent=1)
        plot(results, stem + ".png")
    return emit(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
