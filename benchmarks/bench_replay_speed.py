"""torch_replay's step time against torch.utils.checkpoint's, repeated in separate
processes: the rows that say whether being right costs anything (CPU, one thread).

    python -m benchmarks.bench_replay_speed                 # 5 processes, 2-3 minutes each
    python -m benchmarks.bench_replay_speed --quick         # 1 process, few rounds (smoke)
    python -m benchmarks.bench_replay_speed --out benchmarks/results/replay_speed.md
    python -m benchmarks.bench_replay_speed --heap system   # glibc left as it is
    python -m benchmarks.bench_replay_speed --groups llama --processes 10   # one group

Rows (each a ratio to torch's checkpoint of the same model, measured in the same rounds):

gpt:        the 6-block GPT-style model of benchmarks/bench_observer.py (d=256, dropout),
            every block checkpointed: no state, ``state=[block]`` under each engine,
            ``detect="preserve"`` with nothing declared, and ``verify="bytes"`` (the
            hashing level, Note [Verification levels]).
llama:      a Llama-style Hugging Face model (4 layers, hidden 256, sequence 256, batch 2,
            dropout 0.1), one model for every variant: transformers' own checkpointing against
            ``torch_replay.integrations.transformers.enable(model)`` (each layer declared)
            under each engine, and ``enable(model, replay_state=None)`` under
            ``detect="preserve"``.
small-op:   64 segments of a 6-operator block on 32x32, ``use_reentrant`` False and True.
segment:    64 one-operator segments (the fixed cost of a segment).
fit:        64 segments of k = 1, 4 and 16 operators (``torch.sin`` on 4 floats, which
            saves its input, so that the backward re-runs every segment),
            ``use_reentrant`` False and True, for torch's checkpoint, torch_replay at the
            default level and under ``detect="reads"``, and torch's under the observer's
            and the watch's do-nothing callbacks (the floors): a line through each step
            time against k splits it into a fixed cost per segment (the intercept) and a
            cost per operator of the segment (the slope: its forward, re-run and
            backward). Not in the default groups.
floors:     the small-op and segment chains (``use_reentrant=False``) under the other ways
            to see operators, beside the observer's floor: a RecordFunction callback given
            no arguments, one given inputs only, and a boxed dispatcher fallback on a mode
            key (Note [Other observation floors] in benchmarks/observer_floors.cpp, built
            on first use into build/bench_floors). Not in the default groups.

Every group also runs torch's own variant twice per round: the second one's ratio (the
A/A row) is what a ratio reads when nothing differs, the group's noise floor.

Each process runs interleaved rounds (every variant once per round, odd rounds in reverse
order) and reports, per row, the median over rounds of the variant's time over torch's time
in the same round. Two clocks: the process's CPU time (``time.process_time``; what a
quiet machine's wall time would be, since one thread computes) and wall time. The table
gives each process's median and their median. Memory beside the times: the bytes the
engines keep from forward to backward (``tr.engine_bytes()``) for ``state=[block]``, for
MoCo's queue enqueued between forward and backward, and under ``preserve`` on MoCo and on
the Llama model. Beside the ratios, per variant and step: kernel time, minor page faults
and garbage-collection time, which an instruction count does not see.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.cli import add_out_quick, child_env, emit, run_module
from benchmarks.counters import GCClock, process_counters
from benchmarks.models import PreNormBlock

ENGINES = ("auto", "journal", "readset", "guard", "snapshot")
# A second run of torch's own variant in every round: its ratio to the first is the
# noise floor of the group (what a ratio means when nothing differs).
AGAIN = "torch's checkpoint again (A/A: the noise floor)"
# torch's own variant under callbacks that do nothing, registered as the observer's
# and the write watch's are (Note [Observation floor] in csrc/aten/observation_floor.h).
FLOOR_SWITCH = "torch's checkpoint + the floor's switch, nothing registered"
FLOOR = "torch's checkpoint + do-nothing observer callback (floor)"
FLOOR_WATCH = "torch's checkpoint + do-nothing observer and watch callbacks (floor)"


# The other floors (Note [Other observation floors]), the "floors" group's rows.
BARE = "torch's checkpoint + do-nothing callback, no arguments boxed"
INPUTS = "torch's checkpoint + do-nothing callback, inputs boxed, no results"
FALLBACK = "torch's checkpoint + do-nothing boxed fallback on a mode dispatch key"


@functools.cache
def floors_extension():
    """The benchmark-only extension of benchmarks/observer_floors.cpp, built on first
    use (ninja, as torch.utils.cpp_extension builds) into build/bench_floors."""
    from torch.utils.cpp_extension import load

    from benchmarks.cli import ROOT

    build = os.path.join(ROOT, "build", "bench_floors")
    os.makedirs(build, exist_ok=True)
    return load(
        name="torch_replay_bench_floors",
        sources=[os.path.join(ROOT, "benchmarks", "observer_floors.cpp")],
        build_directory=build,
        extra_cflags=["-O2"],
        verbose=False,
    )


def _switched(switch, fn):
    """``fn`` run with the floor callback ``switch`` registered for its duration: the
    name of one of the extension's (``_floor_observer`` or ``_floor_watch``) or a
    counted switch of :func:`floors_extension`."""
    from torch_replay._ext import require_extension

    on_off = switch if callable(switch) else getattr(require_extension(), switch)

    def run(*args, **kwargs):
        on_off(True)
        try:
            return fn(*args, **kwargs)
        finally:
            on_off(False)

    return run


def _floor_fn(fn, switch: str = "_floor_observer"):
    """``fn`` run with the do-nothing observer callback on its thread (the forward and
    the re-run of a segment that checkpoints it). The switch is a closure and two
    extension calls per run of ``fn``; ``switch="_floor_none"`` makes the same calls
    and registers nothing (the FLOOR_SWITCH row: what the switch itself costs)."""
    return _switched(switch, fn)


def _watch_floor(step):
    """``step`` with the do-nothing process-wide callback registered throughout (the
    write watch is registered while a declared or preserved segment waits: from the
    first forward to the last re-run)."""
    return _switched("_floor_watch", step)


def _torch_rows(torch_step, floor_step) -> dict:
    """A group's torch rows: torch's step (the base), itself again (A/A), and
    ``floor_step(switch)`` (torch's step whose segments run under the floor callback
    ``switch``) with the switch alone, the observer floor, and the observer and watch
    floors."""
    return {
        "torch": torch_step,
        AGAIN: torch_step,
        FLOOR_SWITCH: floor_step("_floor_none"),
        FLOOR: floor_step("_floor_observer"),
        FLOOR_WATCH: _watch_floor(floor_step("_floor_observer")),
    }


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def _settings(**settings):
    """A step wrapper that runs under ``tr.config`` settings."""

    def wrap(step):
        def run():
            with tr.config.patch(**settings):
                step()

        return run

    return wrap


def _rounds(steps: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Per clock and variant: the median over rounds of its time over the first
    variant's time in the same round (the first round warms up); under ``"per_step"``,
    each variant's median per step of the counters of :func:`benchmarks.counters.process_counters` (what instruction
    counts do not see: kernel time, page faults, garbage collection)."""
    times = {c: {k: [] for k in steps} for c in CLOCKS}
    gc_clock = GCClock()
    counted: dict[str, dict[str, list[float]]] = {k: {} for k in steps}
    try:
        for r in range(rounds + 1):
            order = list(steps.items())
            for name, step in order if r % 2 == 0 else order[::-1]:
                n0 = process_counters(gc_clock)
                t0 = {c: f() for c, f in CLOCKS.items()}
                step()
                t1 = {c: f() for c, f in CLOCKS.items()}
                n1 = process_counters(gc_clock)
                if r:
                    for c in CLOCKS:
                        times[c][name].append(t1[c] - t0[c])
                    for key in n0:
                        counted[name].setdefault(key, []).append(n1[key] - n0[key])
    finally:
        gc_clock.close()
    base = next(iter(steps))
    out = {}
    for c in CLOCKS:
        b = times[c][base]
        out[c] = {
            k: statistics.median(x / y for x, y in zip(v, b, strict=True))
            for k, v in times[c].items()
        }
        out[c]["base_s"] = statistics.median(b)
    out["per_step"] = {
        k: {key: statistics.median(v) for key, v in c.items()} for k, c in counted.items()
    }
    return out


# ------------------------------------------------------------------ the models


def gpt_steps(width: int = 256, seq: int = 128, batch: int = 4) -> dict:
    torch.manual_seed(0)
    blocks = nn.ModuleList(PreNormBlock(width, 4, dropout=0.1) for _ in range(6))
    x = torch.randn(batch, seq, width)

    def step(ckpt):
        def run():
            blocks.zero_grad(set_to_none=True)
            h = x
            for blk in blocks:
                h = ckpt(blk, h)
            h.pow(2).mean().backward()

        return run

    def torch_ckpt(blk, h):
        return tcp.checkpoint(blk, h, use_reentrant=False)

    def floor_ckpt(blk, h, switch):
        return tcp.checkpoint(_floor_fn(blk, switch), h, use_reentrant=False)

    def ours(engine=None):
        def ckpt(blk, h):
            if engine is None:
                return tr.checkpoint(blk, h, use_reentrant=False)
            return tr.checkpoint(blk, h, use_reentrant=False, state=[blk], engine=engine)

        return ckpt

    return {
        **_torch_rows(step(torch_ckpt), lambda s: step(functools.partial(floor_ckpt, switch=s))),
        "no state": step(ours()),
        **{f"state=[block], {e}": step(ours(e)) for e in ENGINES},
        'detect="preserve"': _settings(detect="preserve")(step(ours())),
        'state=[block], auto, verify="bytes"': _settings(verify="bytes")(step(ours("auto"))),
        'detect="preserve", verify="bytes"': _settings(detect="preserve", verify="bytes")(
            step(ours())
        ),
    }


def _llama(seq: int):
    """The Llama model of the Llama rows (training mode), its layers, and one step's
    body on a fixed batch."""
    from benchmarks.integrations_stacks import VOCAB, build_hf
    from torch_replay.integrations.transformers import layers

    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    model = build_hf("llama", layers=4, hidden=256)
    model.train()

    def run():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return model, layers(model), run


def llama_step(seq: int, mode: str, **options):
    """One training step of the Llama model with checkpointing turned on by ``mode``
    ("torch": transformers' own; "tr": ``tr_hf.enable(model, **options)``; "floor":
    transformers' own under the do-nothing callbacks of the observer and the watch)."""
    from benchmarks.integrations_stacks import hf_turn_on

    model, found, run = _llama(seq)
    hf_turn_on(model, "torch" if mode == "floor" else mode, **options)
    if mode != "floor":
        return run
    for layer in found:
        layer._gradient_checkpointing_func = _floor_checkpoint(layer._gradient_checkpointing_func)
    return _watch_floor(run)


def _floor_checkpoint(checkpoint_function, switch: str = "_floor_observer"):
    """A layer's checkpoint function that checkpoints its function under the
    do-nothing observer callback (``_floor_fn``)."""
    return functools.partial(lambda f, fn, *a: f(_floor_fn(fn, switch), *a), checkpoint_function)


def llama_steps(seq: int) -> dict:
    """The Llama rows, every variant on one model (as the GPT rows), so that they
    differ only in the function each layer checkpoints with: each variant turns
    checkpointing on its way once (``hf_turn_on``), keeps the functions that put on
    the layers, and puts them back before each of its steps."""
    from benchmarks.integrations_stacks import hf_turn_on

    model, found, step = _llama(seq)

    def variant(mode: str, floor: str | None = None, **options):
        hf_turn_on(model, mode, **options)
        functions = [layer._gradient_checkpointing_func for layer in found]
        if floor is not None:
            functions = [_floor_checkpoint(f, floor) for f in functions]

        def run():
            for layer, f in zip(found, functions, strict=True):
                layer._gradient_checkpointing_func = f
            step()

        return run

    return {
        **_torch_rows(variant("torch"), lambda s: variant("torch", floor=s)),
        **{f"enable(model), {e}": variant("tr", replay_engine=e) for e in ENGINES},
        'enable(model, replay_state=None), detect="preserve"': _settings(detect="preserve")(
            variant("tr", replay_state=None)
        ),
    }


def chain_steps(block, x0: torch.Tensor, reentrant: bool, floors: dict | None = None) -> dict:
    """torch's and torch_replay's step through 64 checkpointed copies of ``block``;
    ``floors``: more rows, by name, of torch's step under a floor switch (as
    ``_switched`` takes it)."""

    def step(ckpt):
        def run():
            h = x0
            for _ in range(64):
                h = ckpt(block, h, use_reentrant=reentrant)
            h.sum().backward()

        return run

    def floor_ckpt(fn, *args, switch, **kwargs):
        return tcp.checkpoint(_floor_fn(fn, switch), *args, **kwargs)

    def floored(switch):
        return step(functools.partial(floor_ckpt, switch=switch))

    return {
        **_torch_rows(step(tcp.checkpoint), floored),
        **{name: floored(switch) for name, switch in (floors or {}).items()},
        "torch_replay": step(tr.checkpoint),
    }


def small_op_steps(reentrant: bool, floors: dict | None = None) -> dict:
    def block(a):
        return torch.tanh(a * 0.9 + 0.1).sigmoid() * a - 0.01

    return chain_steps(block, torch.randn(32, 32, requires_grad=True), reentrant, floors)


def segment_steps(reentrant: bool, floors: dict | None = None) -> dict:
    return chain_steps(lambda h: h * 2, torch.randn(4, requires_grad=True), reentrant, floors)


FIT_OPS = (1, 4, 16)
# The fit group's variants: name -> (the chain_steps row it runs, the tr.config
# settings it runs under).
FIT_ROWS = {
    "torch": ("torch", {}),
    "torch + the floor's switch, nothing registered": (FLOOR_SWITCH, {}),
    "torch + observer floor": (FLOOR, {}),
    "torch + observer and watch floor": (FLOOR_WATCH, {}),
    "torch_replay": ("torch_replay", {}),
    'torch_replay, detect="reads"': ("torch_replay", {"detect": "reads"}),
}


def fit_steps(reentrant: bool, x: torch.Tensor | None = None) -> dict:
    """The fit group's chains (the FIT_ROWS variants, for each k of FIT_OPS) through 64
    segments of k operators, all in the same rounds, on ``x`` (4 random floats)."""
    x = torch.randn(4, requires_grad=True) if x is None else x

    def block(k):
        def run(h):
            for _ in range(k):
                h = torch.sin(h)
            return h

        return run

    out = {}
    for k in FIT_OPS:
        rows = chain_steps(block(k), x, reentrant)
        for variant, (row, settings) in FIT_ROWS.items():
            out[f"{variant}, k={k}"] = _settings(**settings)(rows[row]) if settings else rows[row]
    return out


def fit_lines(res: dict, segments: int = 64) -> dict:
    """Per variant of a fit group's ``_rounds`` result: the least-squares line of its
    CPU step time (its median ratio times torch's k=1 median) over k, as microseconds
    per segment (intercept) and per operator of a segment (slope)."""
    cpu = res["cpu"]
    out = {}
    for variant in FIT_ROWS:
        ys = [1e6 * cpu[f"{variant}, k={k}"] * cpu["base_s"] / segments for k in FIT_OPS]
        slope, intercept = statistics.linear_regression(FIT_OPS, ys)
        out[variant] = {"per_segment_us": intercept, "per_op_us": slope}
    return out


def other_floors() -> dict:
    """The "floors" group's extra rows: name -> switch (Note [Other observation
    floors])."""
    ext = floors_extension()
    return {BARE: ext.bare, INPUTS: ext.inputs_only, FALLBACK: ext.fallback}


# ------------------------------------------------------------------ memory


def kept_bytes(seq: int) -> dict[str, int]:
    """Engine bytes held between forward and backward (``tr.engine_bytes()``)."""
    from benchmarks.integrations_stacks import VOCAB, build_hf, hf_turn_on
    from tests.reference import MoCoHead

    out = {}
    torch.manual_seed(0)
    blocks = nn.ModuleList(PreNormBlock(256, 4) for _ in range(6))
    h = torch.randn(4, 128, 256)
    for blk in blocks:
        h = tr.checkpoint(blk, h, use_reentrant=False, state=[blk])
    out["gpt, state=[block] (auto)"] = tr.engine_bytes()
    h.sum().backward()
    for how in ("declared", "preserve"):
        head = MoCoHead()
        x = torch.randn(8, 16, requires_grad=True)
        with tr.config.patch(detect="preserve" if how == "preserve" else tr.config.detect):
            state = [head.queue] if how == "declared" else None
            y = tr.checkpoint(head, x, use_reentrant=False, state=state)
            head.enqueue(torch.randn(8, 16))
            out[f"MoCo queue enqueued before backward, {how}"] = tr.engine_bytes()
            y.sum().backward()
    model = build_hf("llama", layers=4, hidden=256)
    model.train()
    hf_turn_on(model, "tr", replay_state=None)
    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    with tr.config.patch(detect="preserve"):
        loss = model(input_ids=ids, labels=ids).loss
        out['llama, detect="preserve"'] = tr.engine_bytes()
        loss.backward()
    return out


# ------------------------------------------------------------------ driver


GROUPS = ("gpt", "llama", "small-op", "segment")
ALL_GROUPS = (*GROUPS, "floors", "fit")  # ("floors" and "fit" only when named)


def child(rounds: int, seq: int, groups: tuple[str, ...] = GROUPS) -> dict:
    torch.set_num_threads(1)
    res = {}
    if "gpt" in groups:
        res["gpt"] = _rounds(gpt_steps(), rounds)
    if "llama" in groups:
        res["llama"] = _rounds(llama_steps(seq), rounds)
    for reentrant in (False, True):
        if "small-op" in groups:
            res[f"small-op, use_reentrant={reentrant}"] = _rounds(small_op_steps(reentrant), rounds)
        if "segment" in groups:
            res[f"segment, use_reentrant={reentrant}"] = _rounds(segment_steps(reentrant), rounds)
    if "floors" in groups:
        extra = other_floors()
        res["floors: small-op, use_reentrant=False"] = _rounds(small_op_steps(False, extra), rounds)
        res["floors: segment, use_reentrant=False"] = _rounds(segment_steps(False, extra), rounds)
    if "fit" in groups:
        for reentrant in (False, True):
            fit = _rounds(fit_steps(reentrant), rounds)
            fit["fit"] = fit_lines(fit)
            res[f"fit, use_reentrant={reentrant}"] = fit
    res["kept"] = kept_bytes(seq)
    res["heap"] = tr.heap_setting()
    return res


def markdown(runs: list[dict], command: str, rounds: int) -> str:
    n = len(runs)
    lines = [
        f"Command: `{command}`",
        "",
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, one thread; "
        f"{n} separate processes, {rounds} interleaved rounds each. Ratio: the median over "
        "rounds of the variant's step time over torch's checkpoint's in the same round; "
        "per process, then the median of the processes. CPU: the process's CPU time; "
        "wall: wall time (load from other jobs shows in wall time first).",
        "",
        f"glibc's heap (`tr.config.heap`, Note [Steady heap]): {runs[0]['heap'] or 'left as it is'}.",
        "",
    ]
    for group in (k for k in runs[0] if k not in ("kept", "heap")):
        base = runs[0][group]["cpu"]
        lines += [
            f"## {group}",
            "",
            "torch's step, CPU s (per process): "
            + " / ".join(f"{r[group]['cpu']['base_s']:.4f}" for r in runs),
            "",
            "| variant | ratio, CPU | per process, CPU | ratio, wall | per process, wall |",
            "| --- | --- | --- | --- | --- |",
        ]
        for v in (k for k in base if k not in ("torch", "base_s")):
            cells = []
            for c in ("cpu", "wall"):
                per = [r[group][c][v] for r in runs]
                cells += [f"{statistics.median(per):.3f}", " / ".join(f"{p:.3f}" for p in per)]
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Per step, medians (process 1): seconds in the kernel, minor page faults, seconds",
            "of garbage collection, full collections.",
            "",
            "| variant | kernel s | minor faults | GC s | full GCs |",
            "| --- | --- | --- | --- | --- |",
        ]
        for v, c in runs[0][group].get("per_step", {}).items():
            lines.append(
                f"| {v} | {c['sys_s']:.4f} | {c['minor_faults']:.0f} | {c['gc_s']:.4f} "
                f"| {c['gc_full']:.0f} |"
            )
        lines.append("")
        if "fit" in runs[0][group]:
            lines += _fit_table([r[group]["fit"] for r in runs])
    lines += ["## Bytes the engines keep from forward to backward", "", "| case | bytes |"]
    lines.append("| --- | --- |")
    for case, b in runs[0]["kept"].items():
        lines.append(f"| {case} | {b:,} |")
    return "\n".join(lines) + "\n"


def _fit_table(fits: list[dict]) -> list[str]:
    """The fit group's lines: per variant, the median over processes of its fixed cost
    per segment and cost per operator, and their ratios to torch's in each process."""
    lines = [
        "Lines through the step time against k (ratios above are to torch's k=1 step): "
        "the fixed cost of a segment and the cost of each of its operators, in CPU "
        "microseconds, the median over processes; beside each, the median over "
        "processes of its ratio to torch's in the same process.",
        "",
        "| variant | per segment, us | ratio to torch | per operator, us | ratio to torch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in fits[0]:
        cells = []
        for key in ("per_segment_us", "per_op_us"):
            cells.append(f"{statistics.median(f[v][key] for f in fits):.2f}")
            cells.append(f"{statistics.median(f[v][key] / f['torch'][key] for f in fits):.3f}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=None, help="separate processes (5)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per process (15)")
    p.add_argument(
        "--heap",
        choices=("steady", "system"),
        default="steady",
        help="tr.config.heap in the measuring processes (default: steady, the default)",
    )
    p.add_argument(
        "--groups",
        nargs="+",
        choices=ALL_GROUPS,
        default=list(GROUPS),
        help="the groups of rows to run (default: all but floors; e.g. --groups llama for "
        "more processes of one group in the same time)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_out_quick(p, quick="1 process, 3 rounds, sequence 64")
    args = p.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)
    seq = 64 if args.quick else 256
    if args.child:
        print(json.dumps(child(rounds, seq, tuple(args.groups))))
        return 0
    runs = []
    for _ in range(args.processes or (1 if args.quick else 5)):
        child_args = ["--child", "--rounds", str(rounds), "--groups", *args.groups] + (
            ["--quick"] if args.quick else []
        )
        proc = run_module(
            "benchmarks.bench_replay_speed",
            child_args,
            env=child_env(TORCH_REPLAY_HEAP=args.heap),
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    command = "python -m benchmarks.bench_replay_speed " + " ".join(argv or sys.argv[1:])
    return emit(markdown(runs, command.strip(), rounds), args.out)


if __name__ == "__main__":
    sys.exit(main())
