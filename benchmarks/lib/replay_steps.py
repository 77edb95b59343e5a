"""The rows of ``benchmarks/bench_replay_speed.py``: each a training step (a function of
no arguments) of torch's checkpoint or torch_replay's on one model, by name; the
do-nothing floor callbacks (Note [Observation floor] in csrc/aten/observation_floor.h, Note
[Other observation floors] in benchmarks/observer_floors.cpp); and the bytes the engines
keep from forward to backward. The profiler ``perf_symbols`` records the same steps.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn as nn
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.cli import ROOT
from benchmarks.lib.models import PreNormBlock

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

    build = os.path.join(ROOT, "build", "bench_floors")
    os.makedirs(build, exist_ok=True)
    return load(
        name="torch_replay_bench_floors",
        sources=[os.path.join(ROOT, "benchmarks", "observer_floors.cpp")],
        build_directory=build,
        extra_cflags=["-O2"],
        verbose=False,
    )


def switched(switch, fn):
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


def floor_fn(fn, switch: str = "_floor_observer"):
    """``fn`` run with the do-nothing observer callback on its thread (the forward and
    the re-run of a segment that checkpoints it). The switch is a closure and two
    extension calls per run of ``fn``; ``switch="_floor_none"`` makes the same calls
    and registers nothing (the FLOOR_SWITCH row: what the switch itself costs)."""
    return switched(switch, fn)


def watch_floor(step):
    """``step`` with the do-nothing process-wide callback registered throughout (the
    write watch is registered while a declared or preserved segment waits: from the
    first forward to the last re-run)."""
    return switched("_floor_watch", step)


def torch_rows(torch_step, floor_step) -> dict:
    """A group's torch rows: torch's step (the base), itself again (A/A), and
    ``floor_step(switch)`` (torch's step whose segments run under the floor callback
    ``switch``) with the switch alone, the observer floor, and the observer and watch
    floors."""
    return {
        "torch": torch_step,
        AGAIN: torch_step,
        FLOOR_SWITCH: floor_step("_floor_none"),
        FLOOR: floor_step("_floor_observer"),
        FLOOR_WATCH: watch_floor(floor_step("_floor_observer")),
    }


def under_settings(**settings):
    """A step wrapper that runs under ``tr.config`` settings."""

    def wrap(step):
        def run():
            with tr.config.patch(**settings):
                step()

        return run

    return wrap


# ------------------------------------------------------------------ the models


def gpt_step_maker(width: int = 256, seq: int = 128, batch: int = 4, layers: int = 6):
    """The GPT-style model of the GPT rows (``layers`` pre-norm blocks, dropout 0.1, on a
    fixed input) as ``step(ckpt)``: one training step with each block run as
    ``ckpt(block, h)``."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(PreNormBlock(width, 4, dropout=0.1) for _ in range(layers))
    x = torch.randn(batch, seq, width)

    def step(ckpt):
        def run():
            blocks.zero_grad(set_to_none=True)
            h = x
            for blk in blocks:
                h = ckpt(blk, h)
            h.pow(2).mean().backward()

        return run

    return step


def gpt_steps(width: int = 256, seq: int = 128, batch: int = 4) -> dict:
    step = gpt_step_maker(width, seq, batch)

    def torch_ckpt(blk, h):
        return tcp.checkpoint(blk, h, use_reentrant=False)

    def floor_ckpt(blk, h, switch):
        return tcp.checkpoint(floor_fn(blk, switch), h, use_reentrant=False)

    def ours(engine=None):
        def ckpt(blk, h):
            if engine is None:
                return tr.checkpoint(blk, h, use_reentrant=False)
            return tr.checkpoint(blk, h, use_reentrant=False, state=[blk], engine=engine)

        return ckpt

    return {
        **torch_rows(step(torch_ckpt), lambda s: step(functools.partial(floor_ckpt, switch=s))),
        "no state": step(ours()),
        **{f"state=[block], {e}": step(ours(e)) for e in ENGINES},
        'detect="preserve"': under_settings(detect="preserve")(step(ours())),
        'state=[block], auto, verify="bytes"': under_settings(verify="bytes")(step(ours("auto"))),
        'detect="preserve", verify="bytes"': under_settings(detect="preserve", verify="bytes")(
            step(ours())
        ),
    }


def llama_model(seq: int, hidden: int = 256):
    """The Llama model of the Llama rows (training mode), its layers, and one step's
    body on a fixed batch."""
    from benchmarks.lib.hf_stacks import VOCAB, build_hf
    from torch_replay.integrations.transformers import layers

    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    model = build_hf("llama", layers=4, hidden=hidden)
    model.train()

    def run():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return model, layers(model), run


def llama_step(seq: int, mode: str, **options):
    """One training step of the Llama model with checkpointing turned on by ``mode``
    ("torch": transformers' own; "tr": ``tr_hf.enable(model, **options)``; "floor":
    transformers' own under the do-nothing callbacks of the observer and the watch)."""
    from benchmarks.lib.hf_stacks import hf_turn_on

    model, found, run = llama_model(seq)
    hf_turn_on(model, "torch" if mode == "floor" else mode, **options)
    if mode != "floor":
        return run
    for layer in found:
        layer._gradient_checkpointing_func = floor_checkpoint(layer._gradient_checkpointing_func)
    return watch_floor(run)


def floor_checkpoint(checkpoint_function, switch: str = "_floor_observer"):
    """A layer's checkpoint function that checkpoints its function under the
    do-nothing observer callback (``floor_fn``)."""
    return functools.partial(lambda f, fn, *a: f(floor_fn(fn, switch), *a), checkpoint_function)


def llama_variant_maker(seq: int, hidden: int = 256):
    """The Llama model of the Llama rows as ``variant(mode, floor=None, **options)``: each
    variant turns checkpointing on its way once (``hf_turn_on``), keeps the functions that
    put on the layers, and puts them back before each of its steps, so that variants on
    one model differ only in the function each layer checkpoints with."""
    from benchmarks.lib.hf_stacks import hf_turn_on

    model, found, step = llama_model(seq, hidden)

    def variant(mode: str, floor: str | None = None, **options):
        hf_turn_on(model, mode, **options)
        functions = [layer._gradient_checkpointing_func for layer in found]
        if floor is not None:
            functions = [floor_checkpoint(f, floor) for f in functions]

        def run():
            for layer, f in zip(found, functions, strict=True):
                layer._gradient_checkpointing_func = f
            step()

        return run

    return variant


def llama_steps(seq: int) -> dict:
    """The Llama rows, every variant on one model (as the GPT rows)."""
    variant = llama_variant_maker(seq)
    return {
        **torch_rows(variant("torch"), lambda s: variant("torch", floor=s)),
        **{f"enable(model), {e}": variant("tr", replay_engine=e) for e in ENGINES},
        'enable(model, replay_state=None), detect="preserve"': under_settings(detect="preserve")(
            variant("tr", replay_state=None)
        ),
    }


def chain_step(ckpt, block, x, segments: int, reentrant: bool):
    """One training step through ``segments`` checkpointed copies of ``block`` (the
    chains of bench_observer and perf_symbols)."""

    def run():
        h = x
        for _ in range(segments):
            h = ckpt(block, h, use_reentrant=reentrant)
        h.sum().backward()

    return run


def chain_steps(block, x0: torch.Tensor, reentrant: bool, floors: dict | None = None) -> dict:
    """torch's and torch_replay's step through 64 checkpointed copies of ``block``;
    ``floors``: more rows, by name, of torch's step under a floor switch (as
    ``switched`` takes it)."""

    def step(ckpt):
        def run():
            h = x0
            for _ in range(64):
                h = ckpt(block, h, use_reentrant=reentrant)
            h.sum().backward()

        return run

    def floor_ckpt(fn, *args, switch, **kwargs):
        return tcp.checkpoint(floor_fn(fn, switch), *args, **kwargs)

    def floored(switch):
        return step(functools.partial(floor_ckpt, switch=switch))

    return {
        **torch_rows(step(tcp.checkpoint), floored),
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
            out[f"{variant}, k={k}"] = (
                under_settings(**settings)(rows[row]) if settings else rows[row]
            )
    return out


def other_floors() -> dict:
    """The "floors" group's extra rows: name -> switch (Note [Other observation
    floors])."""
    ext = floors_extension()
    return {BARE: ext.bare, INPUTS: ext.inputs_only, FALLBACK: ext.fallback}


# ------------------------------------------------------------------ memory


def kept_bytes(seq: int) -> dict[str, int]:
    """Engine bytes held between forward and backward (``tr.engine_bytes()``)."""
    from benchmarks.lib.hf_stacks import VOCAB, build_hf, hf_turn_on
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
