"""The process-wide settings of checkpointing (``torch_replay.config``, a
:class:`ReplayConfig`), the values each takes, and the engine names."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Literal, get_args

from .._ext import engine_names

# The engine names, defined once in C++ (csrc/core/preservation_engine.cpp).
ENGINES: tuple[str, ...] = engine_names()


Detect = Literal["saved", "reads", "preserve"]
Verify = Literal["dispatcher", "bytes"]
ObserverKind = Literal["c++", "python"]
Heap = Literal["steady", "system"]
# The values each setting takes, read from its type (one source).
DETECT_LEVELS: tuple[str, ...] = get_args(Detect)
VERIFY_LEVELS: tuple[str, ...] = get_args(Verify)
OBSERVERS: tuple[str, ...] = get_args(ObserverKind)
HEAP_SETTINGS: tuple[str, ...] = get_args(Heap)


@dataclass(kw_only=True, slots=True)
class ReplayConfig:
    """Process-wide settings of ``torch_replay.checkpoint``."""

    detect: Detect = os.environ.get("TORCH_REPLAY_DETECT", "preserve")  # type: ignore[assignment]
    """What happens to undeclared state: a tensor that existed before the segment and
    that it read (parameter, buffer, input, captured tensor), changed in place before
    backward. ``"preserve"`` (default): preserved, so the re-run sees the forward's
    values without ``state=`` (eager's gradient): the segment's reads are journaled
    copy-on-write, a later in-place write to them (outside segments too) first keeps the
    old bytes of what it overwrites (as ``engine="journal"`` for declared state), and
    nothing is copied if nothing is written. While such a segment waits for its
    backward, every operator of the process pays the write watch. A graph kept alive
    (past its backward with ``retain_graph=True``, or never backwarded) keeps at most
    one copy of what its segments read and later steps overwrite, until it is dropped
    (Note [Region journal] in csrc/core/region_journal.h). Writes that bypass the
    dispatcher (the memory of ``.numpy()``, raw pointers) are detected, by hashes, with
    ``verify="bytes"``. ``"reads"``: the re-run is refused instead (``StateMutationError``
    naming the tensor, never a wrong gradient), checked by version counters: one weak
    reference and one integer per tensor read, no write watch. ``"saved"``: check only
    the tensors the forward saved for backward (what eager autograd checks); with
    ``use_reentrant=True``, whose forward saves nothing, it means ``"reads"``. Inside
    ``torch.compile`` every level leaves undeclared tensors to autograd's version check,
    as torch does (Note [Checkpoint under torch.compile] in compiled.py). Why
    ``"preserve"`` is the default, with the figures: docs/checkpoint_details.md, "Which
    level is the default" (benchmarks/results/default_level.md)."""

    verify: Verify = os.environ.get("TORCH_REPLAY_VERIFY", "dispatcher")  # type: ignore[assignment]
    """What proves that a re-run starts from the forward's bytes and reproduces its
    end state (Note [Verification levels] in csrc/aten/transaction.h).
    ``"dispatcher"`` (default): every write made through PyTorch's dispatcher (any
    operator, in a segment or not, through any alias: ``.data``, views of other
    dtypes, ``set_``) is seen, so declared state is journaled, marked or restored
    from a copy without hashing it; only bytes the forward or the re-run write are
    hashed. ``"bytes"``: also hash every declared (and, under ``detect="preserve"``,
    preserved) byte the segment reads, in the forward and before the re-run, which
    also catches writes that bypass the dispatcher (the memory of ``.numpy()``, a
    raw pointer, a compiled kernel writing an input outside any segment) and
    raises ``StateMutationError`` for them. Like torch's ``determinism_check``, it
    is a check the user turns on; benchmarks/results/observer.md gives its cost."""

    observer: ObserverKind = os.environ.get("TORCH_REPLAY_OBSERVER", "c++")  # type: ignore[assignment]
    """How the operators of a segment are observed (Note [C++ observer]): ``"c++"``
    (a thread-local RecordFunction callback of the dispatcher, about 1 µs per
    operator) or ``"python"`` (a TorchDispatchMode, about 10 µs per operator; the
    reference implementation). As every setting here but ``heap``, it is read when a
    segment is called: its re-run in backward runs under the same observer."""

    heap: Heap = os.environ.get("TORCH_REPLAY_HEAP", "steady")  # type: ignore[assignment]
    """glibc's heap under checkpointing (Note [Steady heap] in csrc/core/heap_policy.h).
    ``"steady"`` (default): at the first checkpoint call, set glibc's mmap threshold
    to 32 MiB and its trim threshold to 64 MiB (the values glibc adopts by itself once
    the process frees a 32 MiB block), so that a step does not give the top of the
    heap back to the system and fault it in again in the next one; skipped when the
    user set glibc's malloc thresholds (``MALLOC_*_`` or ``GLIBC_TUNABLES``) or malloc
    is not glibc's. ``heap_setting()`` says what was done. ``"system"``: leave glibc
    as it is (a small model then pays minor page faults every step that torch's
    checkpoint does not; benchmarks/results/replay_speed.md)."""

    observe: bool = True
    """Run the forward and the re-run under the observer (needed for declared
    state, explicit generators, undeclared writes, overlap and integer-write
    checks). Turning it off makes a segment with ``state=None`` behave like
    ``torch.utils.checkpoint`` plus the saved-tensor check."""

    def patch(self, **changes: Any) -> contextlib.AbstractContextManager[ReplayConfig]:
        """These settings for a block, or for each call of a decorated function, put back
        as they were when it ends, however it ends (as ``torch._dynamo.config.patch``)::

            with tr.config.patch(detect="preserve"):
                loss = model(x).sum()  # its segments preserve what they read
            loss.backward()

        A segment keeps the settings its forward ran with until its backward, so the
        backward may run outside the block. The settings are process-wide, as
        ``tr.config`` is: another thread checkpointing meanwhile runs with them too.
        (``heap`` acts once, at the process's first checkpoint call.)

        Args:
            **changes: setting names (the attributes above) and their values. Every one
                is checked before any is set.

        Returns:
            A context manager, also usable as a decorator.

        Raises:
            AttributeError: a name that is not a setting.
            ValueError: a value the setting does not take (the valid ones are named).
        """
        for name, value in changes.items():
            _check_setting(name, value)
        return _patched(self, changes)


ReplayConfig.__module__ = "torch_replay"  # shown where users find it
config = ReplayConfig()
# The values each setting takes (``observe``: a bool).
_CHOICES: dict[str, tuple[Any, ...]] = {
    "detect": DETECT_LEVELS,
    "verify": VERIFY_LEVELS,
    "observer": OBSERVERS,
    "heap": HEAP_SETTINGS,
    "observe": (True, False),
}


def bad_setting(name: str, value: Any) -> ValueError:
    """The error for a value ``config.<name>`` does not take."""
    return ValueError(f"torch_replay.config.{name} must be one of {_CHOICES[name]}, got {value!r}")


def _check_setting(name: str, value: Any) -> None:
    if name not in _CHOICES:
        raise AttributeError(
            f"torch_replay.config has no setting {name!r}; its settings are {tuple(_CHOICES)}"
        )
    # (Types compared too, not ``in``: 1 == True, but observe is a bool.)
    if not any(type(value) is type(c) and value == c for c in _CHOICES[name]):
        raise bad_setting(name, value)


@contextlib.contextmanager
def _patched(cfg: ReplayConfig, changes: dict[str, Any]):
    old = {name: getattr(cfg, name) for name in changes}
    try:
        for name, value in changes.items():
            setattr(cfg, name, value)
        yield cfg
    finally:
        for name, value in old.items():
            setattr(cfg, name, value)
