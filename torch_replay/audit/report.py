"""What the audit reports: per-segment verdicts and their readable form."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_ROOT = "<root>"
_OUTSIDE = "<outside segments>"
_BACKWARD = "<backward>"


@dataclass(kw_only=True, slots=True)
class SegmentAudit:
    """What one candidate segment does to state, and the verdict."""

    name: str
    """Module path of the segment (``"fn"`` for a function)."""
    kind: str
    """Type name of the module, or ``"function"``."""
    mutated_in_forward: list[str] = field(default_factory=list)
    """Pre-existing tensors (buffers, parameters, inputs, captured tensors) it writes."""
    non_input_reads: list[str] = field(default_factory=list)
    """Tensors it reads that are not its inputs (parameters, buffers, captured tensors)."""
    mutated_after_read: list[str] = field(default_factory=list)
    """Of those reads, the ones something else writes after this segment read them, at
    bytes it read (exact strided footprints): torch.utils.checkpoint's re-run reads the new
    values."""
    written_elsewhere_after_read: list[str] = field(default_factory=list)
    """Of those reads, the ones something else writes afterwards only at bytes it did not
    read: torch.utils.checkpoint stays exact, but torch_replay.checkpoint's version check
    (``tr.config.detect = "reads"``) refuses them unless they are declared."""
    generators: list[str] = field(default_factory=list)
    """Generators it draws from (``default cpu`` or an explicit generator's name)."""
    typed_aliases: list[str] = field(default_factory=list)
    """Storages it touches through views of different dtypes."""
    view_aliases: list[str] = field(default_factory=list)
    """Storages it writes through one view and reads through another, overlapping one."""
    overlapping_writes: list[str] = field(default_factory=list)
    """Operators whose written tensor overlaps one they read through another view."""
    integer_writes_on_grad_path: list[str] = field(default_factory=list)
    """Operators writing an integer tensor from values that require grad."""
    torch_checkpoint_exact: bool = True
    """Would ``torch.utils.checkpoint`` (default options) give the eager gradients and state."""
    reasons: list[str] = field(default_factory=list)
    """Why not, one line each."""
    state: list[str] = field(default_factory=list)
    """What to pass as ``state=`` to ``torch_replay.checkpoint``: needed under
    ``tr.config.detect = "reads"``; under ``"preserve"`` (the default) the reads listed
    in ``mutated_after_read`` and ``written_elsewhere_after_read`` are preserved without
    it (declaring them still lets an engine be chosen with ``engine=``)."""
    auto_engine: str | None = None
    """The engine ``engine="auto"`` chose for this segment."""
    retained_bytes: int | None = None
    """Bytes that engine kept from forward to backward."""
    torch_replay_error: str | None = None
    """If ``torch_replay.checkpoint`` refuses the segment, why."""
    needs_grad: bool = True
    """False if no output of the segment required grad in the observed run (it ran under
    ``no_grad``, like a momentum encoder): checkpointing does not apply to it."""
    torch_checkpoint_grad_error: float | None = None
    """``max |grad - eager|`` of ``torch.utils.checkpoint`` on the segment alone, run by the
    probe from the model's state before the audit (Note [Audit probe] in probe.py)."""
    torch_replay_grad_error: float | None = None
    """The same for ``torch_replay.checkpoint`` with the recommended state."""
    state_keyword: str = "state"
    """How ``torch_replay.checkpoint`` takes the state for this segment: ``"replay_state"``
    when the segment would be handed ``state=`` itself (it takes ``**kwargs`` or a
    parameter of that name; Note [Option spelling] in _replay/api.py)."""
    inputs: int = 1
    """How many positional arguments the segment was called with."""
    keywords: list[str] = field(default_factory=list)
    """The keyword arguments it was called with."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: getattr(self, k) for k in self.__slots__}

    def code_state(self, root_var: str = "model") -> list[str]:
        """The ``state=`` entries as Python expressions on the audited model.

        Args:
            root_var: the variable that holds the audited model.

        Returns:
            One expression per declared tensor or generator (``model.head.queue``);
            names that are not attribute paths (captured tensors) are kept as text.
            The default generator is left out (torch_replay preserves it unless
            ``preserve_rng_state=False``).
        """
        out = []
        for n in self.state:
            if n.startswith("torch.default_generator"):
                continue
            out.append(_python_name(n, root_var) or f"<{n}>")
        return out

    def code(self, root_var: str = "model", input_var: str = "x") -> str:
        """The ``torch_replay.checkpoint`` call to write for this segment.

        Args:
            root_var: the variable that holds the audited model.
            input_var: the segment's input; ``*args`` stands for its inputs when it takes
                several, ``**kwargs`` for the keyword arguments it was called with.

        Returns:
            One line of Python, e.g. ``tr.checkpoint(model.head, x,
            use_reentrant=False, state=[model.head.queue])``.
        """
        fn = _python_name(f"{self.name} (buffer)", root_var) if self.kind != "function" else None
        fn = fn or (root_var if self.name == "<root>" else self.name)
        args = {0: "", 1: f", {input_var}"}.get(self.inputs, ", *args")
        state = self.code_state(root_var)
        arg = f", {self.state_keyword}=[{', '.join(state)}]" if state else ""
        kwargs = ", **kwargs" if self.keywords else ""
        return f"tr.checkpoint({fn}{args}, use_reentrant=False{arg}{kwargs})"


@dataclass(kw_only=True, slots=True)
class AuditReport:
    """Per-segment audits of one forward and backward."""

    target: str
    """What was audited."""
    segments: list[SegmentAudit]
    """One entry per candidate segment, in execution order."""
    outside: list[str] = field(default_factory=list)
    """State written outside every candidate segment (for reference)."""
    error: str | None = None
    """If the model's own forward or backward raised (e.g. a raw overlapping copy), the
    error; the segments then show what was observed up to it."""

    def __getitem__(self, name: str) -> SegmentAudit:
        for s in self.segments:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "target": self.target,
            "segments": [s.to_dict() for s in self.segments],
            "outside": self.outside,
            "error": self.error,
        }

    def to_json(self, indent: int = 1) -> str:
        """The report as JSON."""
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        lines = [f"torch_replay.audit: {self.target}"]
        if self.error:
            lines.append(f"the model itself failed: {self.error}")
        lines.append("")
        head = ("segment", "kind", "torch.utils.checkpoint", "state to declare", "auto engine")
        table = [head]
        for s in self.segments:
            verdict = "exact" if s.torch_checkpoint_exact else "NOT exact"
            if not s.needs_grad:
                verdict += " (no grad)"
            n = len(s.code_state())
            engine = "refused" if s.torch_replay_error else (s.auto_engine or "-")
            if s.auto_engine and s.retained_bytes is not None and not s.torch_replay_error:
                engine += f", keeps {_fmt_bytes(s.retained_bytes)}"
            table.append((s.name, s.kind, verdict, str(n) if n else "-", engine))
        widths = [max(len(r[c]) for r in table) for c in range(len(head))]
        for r in table:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        for s in self.segments:
            mark = "exact" if s.torch_checkpoint_exact else "NOT exact"
            if not s.needs_grad:
                mark += " (but it runs without grad)"
            lines.append(f"\n[{s.name}] {s.kind}: torch.utils.checkpoint {mark}")
            rows = [
                ("mutated in forward", s.mutated_in_forward),
                ("reads (not inputs)", s.non_input_reads),
                ("written after read", s.mutated_after_read),
                ("written elsewhere later", s.written_elsewhere_after_read),
                ("generators", s.generators),
                ("typed aliases", s.typed_aliases),
                ("view aliases", s.view_aliases),
                ("overlapping writes", s.overlapping_writes),
                ("grad values into ints", s.integer_writes_on_grad_path),
            ]
            for label, items in rows:
                if items:
                    lines.append(f"  {label:<24}{_cut(items, 6)}")
            for r in s.reasons:
                lines.append(f"  ! {r}")
            if s.torch_replay_error:
                lines.append(f"  torch_replay refuses: {s.torch_replay_error}")
            else:
                lines.append(f"  write: {s.code()}")
                if s.auto_engine is not None:
                    lines.append(
                        f"  engine auto -> {s.auto_engine}, keeps {s.retained_bytes:,} bytes"
                    )
            if s.torch_checkpoint_grad_error is not None:
                lines.append(
                    "  measured alone: max |grad - eager| = "
                    f"{s.torch_checkpoint_grad_error:.2e} (torch.utils.checkpoint)"
                    + (
                        f", {s.torch_replay_grad_error:.2e} (torch_replay.checkpoint)"
                        if s.torch_replay_grad_error is not None
                        else ""
                    )
                )
        if self.outside:
            lines.append("\nwritten outside the segments: " + _cut(self.outside, 8))
        return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _cut(items: Sequence[str], limit: int) -> str:
    """``a, b, c, … (N more)``: at most ``limit`` items, and how many were left out."""
    items = list(items)
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items) - limit} more, {len(items)} in all)"


def _python_name(name: str, root_var: str = "model") -> str | None:
    """``head.bn.running_mean (buffer)`` -> ``model.head.bn.running_mean``, ``net.0.w
    (captured)`` -> ``net[0].w``; None if not a path."""
    if name.endswith(" (captured)"):
        path = name[: -len(" (captured)")]
        head, _, rest = path.partition(".")
        expr = head + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rest.split(".") if p)
        try:
            compile(expr, "<audit>", "eval")
        except SyntaxError:
            return None
        return expr
    for suffix in (" (buffer)", " (parameter)", " (generator)"):
        if name.endswith(suffix):
            path = name[: -len(suffix)]
            if path and all(part.isidentifier() or part.isdigit() for part in path.split(".")):
                return root_var + "".join(
                    f"[{p}]" if p.isdigit() else f".{p}" for p in path.split(".")
                )
            return None
    return None
