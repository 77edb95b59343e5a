"""Measuring each segment's costs per option, the physical peak probes, progress."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._planning.kernel_timing import time_kernels
from .._planning.runner import SegmentRunner
from .._replay.segment import state_tensors
from ..errors import ReplayError
from ..planner import OPTION_NAMES, Option, plan_peak, rerun_floor
from .config import CalibrationConfig, ConfigError
from .fingerprint import _record_inputs, model_fingerprint
from .workloads import BufferSegment, Workload, shape_workload

# --------------------------------------------------------------- measurement


def _rss_reset() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PhysicalPeak:
    """Peak RSS (CPU) or CUDA allocator peak above the level at start()."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = _rss_reset()

    def peak(self) -> int:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated() - self.base)
        return max(0, _status_kib("VmHWM") * 1024 - self.base)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _check_device(w: Workload, device: str) -> Workload:
    for t in w.state:
        if isinstance(t, torch.Tensor) and t.device.type != device:
            raise ConfigError(
                f"the workload's state lives on {t.device}, the config says {device!r}; "
                "let the factory take device= (the built-in factories do)"
            )
    return w


def _call_factory(fn: Callable[..., Workload], kwargs: dict[str, Any], device: str) -> Workload:
    import inspect

    kwargs = dict(kwargs)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "device" in params and "device" not in kwargs:
        kwargs["device"] = device
    return fn(**kwargs)


def measure_segments(
    workload: Workload,
    options: Sequence[str],
    *,
    reps: int = 3,
    warmup: int = 1,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every option on every segment of a workload (see the module docstring).

    Args:
        workload: the segments, declared state and input.
        options: option names to try; ``guard`` is tried per segment and kept
            where the engine accepts it.
        reps: timed steps (median kept).
        warmup: untimed steps first.
        device: ``"cpu"`` or ``"cuda"`` (for the physical peak).
        progress: called with a short label after each measurement
            (:func:`measurement_count` says how many there will be).

    Returns:
        ``{"persistent": int, "options": {name: {...}}, "segments": [[option
        dicts]], "fingerprint": {...}}``: per option the step time, the physical and tracked peaks
        and the per-segment costs (or ``valid: False`` with the reason), and
        per segment its list of valid options as :class:`Option` fields, each
        checkpointed option's time at least ``eager``'s plus the segment's forward
        (Note [Re-run floor] in ``torch_replay/planner.py``; the measured times stay in
        ``options``); with ``eager``, ``eager_forward`` (its forward time per segment);
        the fingerprint of the segments and of each segment's input (see
        :func:`model_fingerprint`).
    """
    n = len(workload.segments)
    tick = progress or (lambda label: None)
    inputs = _record_inputs(workload)
    per_option: dict[str, Any] = {}
    seg_opts: list[dict[str, dict[str, Any]]] = [{} for _ in range(n)]
    persistent = 0
    for name in options:
        if name == "guard":
            continue
        res = _measure_choices(workload, [name] * n, reps=reps, warmup=warmup, device=device)
        persistent = res.pop("persistent")
        per_option[name] = res
        tick(name)
        if res["valid"]:
            for i, cost in enumerate(res["segments"]):
                seg_opts[i][name] = cost
    if "guard" in options:
        # Guard keeps nothing and refuses when the state changes: try it segment by
        # segment (others eager), only where the snapshot run saw no declared write.
        written = per_option.get("snapshot", {}).get("written_bytes")
        guard: dict[str, Any] = {"valid": False, "segments": [None] * n, "reason": {}}
        for i in range(n):
            if written is not None and written[i] > 0:
                guard["reason"][i] = "writes declared state"
                tick(f"guard {i}")
                continue
            choices = ["eager"] * n
            choices[i] = "guard"
            res = _measure_choices(workload, choices, reps=reps, warmup=warmup, device=device)
            res.pop("persistent")
            if res["valid"]:
                guard["segments"][i] = res["segments"][i]
                seg_opts[i]["guard"] = res["segments"][i]
                guard["valid"] = True
            else:
                guard["reason"][i] = res["reason"]
            tick(f"guard {i}")
        per_option["guard"] = guard
    eager = per_option.get("eager", {})
    forward = eager.get("forward") if eager.get("valid") else None
    segments = [
        [dict(name=k, **v) for k, v in opts.items() if k in OPTION_NAMES] for opts in seg_opts
    ]
    if forward is not None:  # Note [Re-run floor] in torch_replay/planner.py
        segments = [
            [
                dict(o, time=f.time)
                for o, f in zip(seg, rerun_floor([Option(**o) for o in seg], fwd), strict=True)
            ]
            for seg, fwd in zip(segments, forward, strict=True)
        ]
    return {
        "persistent": persistent,
        "options": per_option,
        "segments": segments,
        **({"eager_forward": forward} if forward is not None else {}),
        "fingerprint": model_fingerprint(workload.segments, inputs),
    }


def measurement_count(options: Sequence[str], segments: int) -> int:
    """How many measurements :func:`measure_segments` makes (progress bar length).

    Args:
        options: the option names.
        segments: the number of segments.

    Returns:
        One per option other than ``guard``, plus one per segment for ``guard``.
    """
    return len([o for o in options if o != "guard"]) + (segments if "guard" in options else 0)


def _measure_choices(
    workload: Workload, choices: list[str], *, reps: int, warmup: int, device: str
) -> dict[str, Any]:
    model = SegmentRunner(workload.segments, state=workload.state, choices=choices)
    persistent = model.persistent
    kept = state_tensors(workload.state)
    snapshot = [t.detach().clone() for t in kept]
    physical = PhysicalPeak(device)
    times: list[list[float]] = [[] for _ in choices]
    forwards: list[list[float]] = [[] for _ in choices]
    steps: list[float] = []
    cpu: list[float] = []  # process CPU time: robust to a shared machine with one thread
    try:
        for _ in range(warmup):
            model.profile_step(workload.make_input(), workload.loss_fn, track_memory=False)
        physical.start()
        for _ in range(reps):
            for p in model.parameters():
                p.grad = None
            x = workload.make_input()
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            profs, _ = model.profile_step(x, workload.loss_fn, track_memory=False)
            _sync(device)
            steps.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            for i, p in enumerate(profs):
                times[i].append(p.forward_s + p.backward_s)
                forwards[i].append(p.forward_s)
        phys = physical.peak()
        kernel = None
        if (
            device == "cuda"
        ):  # device time of one step from CUPTI (torch_replay._planning.kernel_timing)
            kernel = time_kernels(
                lambda: model.profile_step(
                    workload.make_input(), workload.loss_fn, track_memory=False
                ),
                device=device,
                reps=1,
                warmup=0,
            )
        report = model.measure(workload.make_input(), workload.loss_fn)
    except ReplayError as e:
        return {"persistent": persistent, "valid": False, "reason": f"{type(e).__name__}: {e}"}
    finally:
        with torch.no_grad():  # the next measurement starts from the same state
            for t, c in zip(kept, snapshot, strict=True):
                t.copy_(c)
        for p in model.parameters():
            p.grad = None
    segments = []
    for i, p in enumerate(report.segments):
        preserved = p.preserved_bytes if choices[i] != "eager" else 0
        segments.append(
            {
                "retained": int(p.retained_tensor_bytes + preserved),
                "transient": int(max(p.forward_extra_bytes, p.backward_transient_bytes)),
                "time": float(statistics.median(times[i])),
                "preserved": int(preserved),
            }
        )
    model_peak = plan_peak(
        [Option(c, **s) for c, s in zip(choices, segments, strict=True)], persistent
    )
    return {
        "persistent": persistent,
        "valid": True,
        "step_s": float(statistics.median(steps)),
        **({"step_cpu_s": float(statistics.median(cpu))} if device == "cpu" else {}),
        **({"kernel_s": kernel.seconds, "kernel_source": kernel.source} if kernel else {}),
        "physical_peak_delta": int(phys),
        "tracked_peak": int(report.measured_peak),
        "model_peak": int(model_peak),
        "written_bytes": [int(p.written_bytes) for p in report.segments],
        "replay_transient_bytes": [int(p.replay_transient_bytes) for p in report.segments],
        "segments": segments,
        "forward": [float(statistics.median(f)) for f in forwards],
    }


def _measure_shape(cfg: CalibrationConfig, index: int) -> dict[str, Any]:
    shape = cfg.shapes()[index]
    assert cfg.grid is not None
    w = shape_workload(shape, cfg.grid, seed=cfg.seed, device=cfg.device)
    res = measure_segments(w, cfg.options, reps=cfg.reps, warmup=cfg.warmup, device=cfg.device)
    return {
        "buffer_bytes": shape.buffer_bytes,
        "write_ratio": shape.write_ratio,
        "live_versions": shape.live_versions,
        "written_bytes_per_segment": _written(w),
        **res,
    }


def _written(w: Workload) -> int:
    seg = w.segments[0]
    if isinstance(seg, BufferSegment):
        rows, width = seg.buffer.shape
        return min(seg.write_rows, rows) * width * seg.buffer.element_size()
    return 0


# ------------------------------------------------------------------ progress


class _Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool = True, width: int = 28) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled and total > 0
        self.width = width
        self.start = time.perf_counter()

    def update(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        sys.stderr.write(
            f"\r[{bar}] {self.done}/{self.total} {label:<32} {elapsed:6.1f}s eta {eta:5.0f}s"
        )
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
