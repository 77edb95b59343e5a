"""Certified peak-memory scheduling of unit graphs.

A :class:`Problem` is a DAG of *units* (kernel calls) that produce and consume
*buffers*. Memory model: graph inputs (producer ``-1``) are live from the start;
a buffer is allocated when its producer runs; while a unit runs, its inputs and
outputs are all live; a buffer is freed right after its last consumer runs
(right after its producer if it has none), never if it is an output. The peak
of a unit order is the largest live total over its steps.

:meth:`Problem.lower_bounds` computes the event-cut, forward-trap and
reverse-trap lower bounds on the optimal peak with Boost.Graph minimum cuts
(``docs/lower_bounds.md`` proves them); :meth:`Problem.solve` finds an order by
heuristics and an exact capacity search and certifies it optimal when its peak
equals a bound.

Inductor hook: the post-codegen pass maps each kernel-call statement of a
wrapper to a unit and each storage to a buffer (allocation attached to the
first unit touching it), turns its write-after-read / write-after-write
effects on reused storage into ``extra_edges``, and calls
:func:`plan_unit_order` with the resulting :class:`Problem`. The returned
:class:`Solution` never has a higher peak than the original order ``0..n-1``
and its :meth:`Solution.report` carries the fields of the pass's per-graph
report.

Example::

    from torch_replay import schedule

    p = schedule.Problem(
        sizes=[10, 1, 10, 1],
        producer=[0, 1, 2, 3],
        consumers=[[1], [4], [3], [4]],
        outputs=[],
        num_units=5,
    )
    p.peak([0, 1, 2, 3, 4])  # 12
    p.lower_bounds()  # {'event_cut': 11, 'forward_trap': 12, 'reverse_trap': 11}
    s = p.solve(time_limit_s=1.0)  # s.peak == 12, s.certified is True
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch  # noqa: F401  (loads libc10 / libtorch for the extension)

from torch_replay._ext import require_extension

__all__ = [
    "Problem",
    "Solution",
    "plan_unit_order",
    "MAX_EXHAUSTIVE_UNITS",
]

#: Largest problem :meth:`Problem.exhaustive_optimum` accepts.
MAX_EXHAUSTIVE_UNITS = 22


def schedule_extension():
    return require_extension().schedule


def _int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None


def _int_list(values: Iterable[object], what: str) -> list[int]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of ints")
    return [_int(v, f"{what}[{i}]") for i, v in enumerate(values)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Solution:
    """The result of :meth:`Problem.solve`."""

    order: list[int]
    """Best unit order found (a topological permutation of the units)."""
    peak: int
    """Peak bytes of ``order``."""
    lower_bound: int
    """Best proven lower bound of the optimal peak (min-cut bounds, raised by
    the capacity search when it proves a capacity infeasible)."""
    certified: bool
    """``peak`` equals a bound of ``bounds`` (event cut, forward, reverse and
    joint traps, end steps). Checkable without trusting the search."""
    optimal: bool
    """``peak == lower_bound``: certified, or proven by the exact search."""
    initial_peak: int | None
    """Peak of the original order ``0..n-1``, or None if it is not
    topological."""
    bounds: dict[str, int] = field(default_factory=dict)
    """``event_cut``, ``forward_trap``, ``reverse_trap``, ``joint_trap`` and
    ``end_steps``. With early stop at ``peak``: exact whenever below it."""
    timed_out: bool = False
    """The capacity search stopped at the time limit (``optimal`` may be
    False although ``order`` is optimal)."""
    seconds: float = 0.0
    """Wall-clock time of the call."""
    min_cuts: int = 0
    """Maximum-flow computations used."""
    search_states: int = 0
    """States expanded by the capacity search."""

    @property
    def gap(self) -> int:
        """``peak - lower_bound`` in bytes (0 when optimal)."""
        return self.peak - self.lower_bound

    def report(self) -> dict[str, object]:
        """The per-graph fields of the Inductor pass report.

        Returns:
            A dict with ``original_peak``, ``permuted_peak``, the three bounds,
            ``joint_trap``, ``lower_bound``, ``certified``, ``optimal``,
            ``gap`` and ``seconds``.
        """
        return {
            "original_peak": self.initial_peak,
            "permuted_peak": self.peak,
            "event_cut": self.bounds.get("event_cut"),
            "forward_trap": self.bounds.get("forward_trap"),
            "reverse_trap": self.bounds.get("reverse_trap"),
            "joint_trap": self.bounds.get("joint_trap"),
            "end_steps": self.bounds.get("end_steps"),
            "lower_bound": self.lower_bound,
            "certified": self.certified,
            "optimal": self.optimal,
            "gap": self.gap,
            "seconds": self.seconds,
        }


class Problem:
    """A peak-memory scheduling problem over a DAG of units.

    Args:
        sizes: Bytes of each buffer (ints >= 0).
        producer: For each buffer, the unit index that writes it, or -1 for a
            graph input.
        consumers: For each buffer, the unit indices that read it (duplicates
            are merged; the producer itself is not allowed).
        outputs: Buffer indices that stay live until the end.
        num_units: Number of units (indices ``0..num_units-1``). When None it
            is one more than the largest unit index mentioned.
        extra_edges: Additional precedences ``(u, v)``: unit ``u`` runs before
            ``v`` (e.g. write-after-read on reused storage).

    Raises:
        TypeError: An entry is not an int.
        ValueError: Lengths differ, a size is negative, an index is out of
            range, a buffer lists its producer as a consumer, an extra edge is
            a self-loop, or the precedences have a cycle.
    """

    __slots__ = ("_p", "_num_units", "_num_buffers")

    def __init__(
        self,
        sizes: Sequence[int],
        producer: Sequence[int],
        consumers: Sequence[Sequence[int]],
        outputs: Sequence[int] = (),
        num_units: int | None = None,
        extra_edges: Iterable[tuple[int, int]] = (),
    ) -> None:
        sizes_l = _int_list(sizes, "sizes")
        producer_l = _int_list(producer, "producer")
        consumers_l = [_int_list(c, f"consumers[{i}]") for i, c in enumerate(consumers)]
        outputs_l = _int_list(outputs, "outputs")
        edges: list[tuple[int, int]] = []
        for i, edge in enumerate(extra_edges):
            pair = tuple(edge)
            if len(pair) != 2:
                raise ValueError(f"extra_edges[{i}] must be a pair (u, v), got {edge!r}")
            edges.append(
                (_int(pair[0], f"extra_edges[{i}][0]"), _int(pair[1], f"extra_edges[{i}][1]"))
            )
        if not (len(sizes_l) == len(producer_l) == len(consumers_l)):
            raise ValueError(
                "sizes, producer and consumers must have one entry per buffer "
                f"(got {len(sizes_l)}, {len(producer_l)}, {len(consumers_l)})"
            )
        if num_units is None:
            mentioned = [*producer_l, *(c for cs in consumers_l for c in cs)]
            mentioned += [u for e in edges for u in e]
            num_units = max(mentioned, default=-1) + 1
        num_units = _int(num_units, "num_units")
        if num_units < 0:
            raise ValueError(f"num_units must be >= 0, got {num_units}")
        self._p = schedule_extension().Problem(
            sizes_l, producer_l, consumers_l, outputs_l, num_units, edges
        )
        self._num_units = num_units
        self._num_buffers = len(sizes_l)

    @property
    def num_units(self) -> int:
        """Number of units."""
        return self._num_units

    @property
    def num_buffers(self) -> int:
        """Number of buffers."""
        return self._num_buffers

    def __repr__(self) -> str:
        return f"schedule.Problem(num_units={self._num_units}, num_buffers={self._num_buffers})"

    def peak(self, order: Sequence[int]) -> int:
        """Peak live bytes of a unit order.

        Args:
            order: A permutation of ``range(num_units)`` that respects every
                precedence.

        Returns:
            The largest live total over the steps (0 without units).

        Raises:
            ValueError: ``order`` is not a permutation of the units or not
                topological.
        """
        return self._p.peak(_int_list(order, "order"))

    def step_costs(self, order: Sequence[int]) -> list[int]:
        """Live bytes at each step of ``order`` (same rules and errors as :meth:`peak`)."""
        return self._p.step_costs(_int_list(order, "order"))

    def lower_bounds(self, *, extended: bool = False) -> dict[str, int]:
        """Min-cut lower bounds on the optimal peak (``docs/lower_bounds.md``).

        Args:
            extended: Also return ``joint_trap`` (the pair bound combining both
                traps, at least ``max(forward_trap, reverse_trap)``) and
                ``end_steps`` (the first and last steps of every order).

        Returns:
            ``{"event_cut": int, "forward_trap": int, "reverse_trap": int}``
            (plus ``"joint_trap"`` and ``"end_steps"`` when extended). Each is
            at most the optimal peak; both traps are at least the event cut.
        """
        d = schedule_extension().lower_bounds(self._p, True, True, extended)
        keys = ["event_cut", "forward_trap", "reverse_trap"]
        if extended:
            keys += ["joint_trap", "end_steps"]
        return {k: int(d[k]) for k in keys}

    def conditional_event(
        self, unit: int, done: Iterable[int] = (), not_done: Iterable[int] = ()
    ) -> int | None:
        """``E(unit | done, not_done)``: least live bytes at ``unit``'s step.

        The minimum is over the states (executed sets closed under
        predecessors) from which ``unit`` can run, that contain every unit in
        ``done`` and none in ``not_done``.

        Returns:
            The minimum, or None when no such state exists.

        Raises:
            ValueError: A unit index is out of range.
        """
        return schedule_extension().conditional_event(
            self._p,
            _int(unit, "unit"),
            _int_list(done, "done"),
            _int_list(not_done, "not_done"),
        )

    def exhaustive_optimum(self) -> tuple[int, list[int]]:
        """Exact optimum by dynamic programming over all downsets.

        Returns:
            ``(peak, order)`` of an optimal order.

        Raises:
            ValueError: More than :data:`MAX_EXHAUSTIVE_UNITS` units.
        """
        peak, order = schedule_extension().solve_exhaustive(self._p)
        return int(peak), list(order)

    def solve(self, time_limit_s: float = 1.0) -> Solution:
        """Find a low-peak order and certify it when possible.

        Runs greedy heuristics (and keeps the original order ``0..n-1`` when it
        is topological and best), computes the min-cut bounds with early stop
        at the best peak, then binary-searches the capacity with the exact
        search between the bound and the best peak.

        Args:
            time_limit_s: Wall-clock budget; bounds and heuristics always
                finish, the search stops at the limit (``timed_out``).

        Returns:
            A :class:`Solution`.

        Raises:
            ValueError: ``time_limit_s`` is negative or not finite.
        """
        limit = float(time_limit_s)
        if not (limit >= 0.0 and limit != float("inf")):
            raise ValueError(f"time_limit_s must be a finite number >= 0, got {time_limit_s!r}")
        s = schedule_extension().solve(self._p, limit)
        return Solution(
            order=list(s.order),
            peak=int(s.peak),
            lower_bound=int(s.lower_bound),
            certified=bool(s.certified),
            optimal=bool(s.optimal),
            initial_peak=None if s.initial_peak < 0 else int(s.initial_peak),
            bounds={
                "event_cut": int(s.event_cut),
                "forward_trap": int(s.forward_trap),
                "reverse_trap": int(s.reverse_trap),
                "joint_trap": int(s.joint_trap),
                "end_steps": int(s.end_steps),
            },
            timed_out=bool(s.timed_out),
            seconds=float(s.seconds),
            min_cuts=int(s.min_cuts),
            search_states=int(s.search_states),
        )


def plan_unit_order(problem: Problem, *, time_limit_s: float = 1.0) -> Solution:
    """Entry point for the Inductor pass: best certified order of a unit graph.

    Args:
        problem: The wrapper's units and storages (see the module docstring);
            unit ``i`` is the ``i``-th kernel-call statement of the original
            program, so ``0..n-1`` is the original order.
        time_limit_s: Budget for the search in seconds.

    Returns:
        The :class:`Solution`; ``solution.order`` never has a higher peak than
        the original order, and ``solution.report()`` gives the report fields.

    Raises:
        ValueError: As :meth:`Problem.solve`.
    """
    return problem.solve(time_limit_s=time_limit_s)
