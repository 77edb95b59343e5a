"""Workloads: what is calibrated (the shape grid's buffer segments, the queue and dense models, a factory named ``pkg.module:function``)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .config import _MIB, ConfigError, GridConfig, Shape, _buffer_bytes

# ----------------------------------------------------------------- workloads


@dataclass(kw_only=True, slots=True)
class Workload:
    """A model cut into segments, with its declared state and an input."""

    segments: list[torch.nn.Module]
    """The segments in program order."""
    state: list[Any]
    """Declared state of every checkpointed segment."""
    make_input: Callable[[], torch.Tensor]
    """Returns a fresh input batch (requires grad)."""
    description: str = ""
    """One line for reports."""
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    """Maps the last segment's output to the scalar loss (None: mean of squares).
    It runs between the forward and the backward, where a training step also
    updates its state (a MoCo queue's in-place enqueue), so the options are
    measured, and refused, as that step would run them."""


class BufferSegment(torch.nn.Module):
    """A segment that reads and rewrites rows of a shared buffer.

    It reads the ``write_rows`` rows it is about to rewrite (old keys), mixes
    their mean into a linear layer, widens the activation ``expand`` times
    (elementwise, so activations are large but cheap), and rewrites the rows as
    an exponential moving average toward its output (read-modify-write). The
    buffer is never saved for backward, so running it eagerly is valid.

    Args:
        buffer: the shared ``(rows, width)`` float32 buffer.
        index: position of the segment (selects its rows, ring-buffer style).
        write_rows: rows rewritten per call (``rows`` for a dense write).
        width: features.
        expand: activation size in multiples of the input.
    """

    def __init__(
        self, buffer: torch.Tensor, index: int, write_rows: int, width: int, expand: int
    ) -> None:
        super().__init__()
        self.buffer = buffer  # not a registered buffer: it is declared state
        self.index = index
        self.write_rows = write_rows
        self.lin = torch.nn.Linear(width, width)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, expand).unsqueeze(1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Read the old rows, compute, rewrite the rows."""
        rows = self.buffer.shape[0]
        k = min(self.write_rows, rows)
        start = (self.index * k) % rows
        end = min(rows, start + k)
        ctx = self.buffer[start:end].mean(0)
        z = self.lin(h) + ctx
        wide = torch.tanh(z.unsqueeze(1) * self.scale)
        out = torch.tanh(wide.mean(1))
        with torch.no_grad():  # one destructive write: halfway toward the new key
            self.buffer[start:end].lerp_(out.mean(0).expand(end - start, -1), 0.5)
        return out


def buffer_workload(
    *,
    segments: int,
    buffer_mib: float,
    write_ratio: float,
    batch: int,
    width: int,
    expand: int | Sequence[int],
    seed: int = 0,
    device: str = "cpu",
) -> Workload:
    """Segments that share one declared buffer (see :class:`BufferSegment`).

    Args:
        segments: number of segments (live versions of the buffer).
        buffer_mib: buffer size in MiB.
        write_ratio: share of the buffer each segment rewrites, in (0, 1].
        batch: rows of the activation.
        width: features (and floats per buffer row).
        expand: activation size per segment in multiples of the input: one
            integer, or one per segment (cycled).
        seed: parameter and input seed.
        device: where the buffer, parameters and input live.

    Returns:
        The :class:`Workload`.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = _buffer_bytes(buffer_mib, width) // (width * 4)
    buffer = torch.randn(rows, width, generator=gen).to(device)
    k = max(1, round(write_ratio * rows))
    expands = [expand] if isinstance(expand, int) else list(expand)
    torch.manual_seed(seed)
    segs = [
        BufferSegment(buffer, i, k, width, expands[i % len(expands)]).to(device)
        for i in range(segments)
    ]
    x = torch.randn(batch, width, generator=gen).to(device)

    def make_input() -> torch.Tensor:
        return x.clone().requires_grad_(True)

    return Workload(
        segments=segs,
        state=[buffer],
        make_input=make_input,
        description=(
            f"{segments} segments, buffer {rows * width * 4 / _MIB:g} MiB, "
            f"{k} of {rows} rows rewritten per segment, batch {batch} x {width}, expand {expand}"
        ),
    )


def shape_workload(
    shape: Shape, grid: GridConfig, *, seed: int = 0, device: str = "cpu"
) -> Workload:
    """The workload of one grid shape.

    Args:
        shape: the shape.
        grid: the grid's activation settings.
        seed: seed.
        device: where it lives.

    Returns:
        The :class:`Workload`.
    """
    return buffer_workload(
        segments=shape.live_versions,
        buffer_mib=shape.buffer_bytes / _MIB,
        write_ratio=shape.write_ratio,
        batch=grid.batch,
        width=grid.width,
        expand=grid.expand,
        seed=seed,
        device=device,
    )


def queue_workload(
    *,
    segments: int = 8,
    queue_mib: float = 8,
    write_ratio: float = 0.001,
    batch: int = 128,
    width: int = 512,
    wide: int = 48,
    narrow: int = 4,
    seed: int = 0,
    device: str = "cpu",
) -> Workload:
    """Sparse writes into a large ring buffer with many live versions.

    Segments alternate wide (activations ``wide`` x input, larger than the
    queue) and narrow (``narrow`` x input); each rewrites ``write_ratio`` of
    the queue.

    Args:
        segments: number of segments.
        queue_mib: queue size in MiB.
        write_ratio: share of the queue each segment rewrites.
        batch: rows of the activation.
        width: features.
        wide: expansion of the even segments.
        narrow: expansion of the odd segments.
        seed: seed.
        device: where it lives.

    Returns:
        The :class:`Workload`.
    """
    return buffer_workload(
        segments=segments,
        buffer_mib=queue_mib,
        write_ratio=write_ratio,
        batch=batch,
        width=width,
        expand=[wide, narrow],
        seed=seed,
        device=device,
    )


def dense_workload(**kwargs: Any) -> Workload:
    """:func:`queue_workload` with ``write_ratio=1``: every segment rewrites the
    whole buffer (regions keep as much as a snapshot).

    Args:
        **kwargs: as :func:`queue_workload` (``write_ratio`` is forced to 1).

    Returns:
        The :class:`Workload`.
    """
    kwargs["write_ratio"] = 1.0
    return queue_workload(**kwargs)


def resolve_factory(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # pkg.module names are found from the current directory
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"model.factory {spec!r}: cannot import {module!r}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"model.factory {spec!r}: {module} has no callable {name!r}")
    return fn
