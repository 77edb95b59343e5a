"""One ``checkpoint()`` call as data: what the user asked for, parsed and checked once in
``api.checkpoint`` and handed whole to the path that runs it (non-reentrant, reentrant,
or Dynamo's region under ``torch.compile``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, kw_only=True)  # not frozen: built at every call, kept cheap
class SegmentCall:
    """A checkpointed call's options (torch's and torch_replay's), not its arguments."""

    function: Callable[..., Any]
    """The segment."""
    use_reentrant: bool | None
    """Which variant; ``None`` only under ``torch.compile``, where torch's default applies
    and no warning is given (as torch)."""
    context_fn: Callable[[], Any]
    """Returns the forward's and the re-run's context managers."""
    determinism_check: str
    """torch's name of the check of recomputed saved tensors."""
    metadata_fn: Callable[[Any], Any] | None
    """What that check compares (None: the reentrant variant, or under ``torch.compile``)."""
    debug: bool
    early_stop: bool | None
    """The call's early-stop option (``None``: torch's global setting decides)."""
    preserve_rng_state: bool
    torch_options: Mapping[str, Any] = field(default_factory=dict)
    """The installed torch's other keyword options (Note [Drop-in signature] in
    ``drop_in.py``), as given."""
    state: Any = None
    """``state=``: what the re-run must see as the forward saw it."""
    engine: str = "auto"
    """``engine=``: how declared state is preserved."""

    @property
    def respect_saved_tensors_hooks(self) -> bool | None:
        return self.torch_options.get("respect_saved_tensors_hooks")

    def keywords(self) -> dict[str, Any]:
        """The keywords of ``checkpoint()`` that make this call again (the function and
        its arguments apart); torch_replay's options in their unambiguous spelling."""
        return {
            "use_reentrant": self.use_reentrant,
            "context_fn": self.context_fn,
            "determinism_check": self.determinism_check,
            "debug": self.debug,
            "early_stop": self.early_stop,
            "preserve_rng_state": self.preserve_rng_state,
            **self.torch_options,
            "replay_state": self.state,
            "replay_engine": self.engine,
        }
