"""Variant programs generated in a forked child process.

Note [Forked variant codegen]
With Note [Lazy variant kernels], what a program variant still costs at a
cold compile is Inductor's lowering and code generation of the graph a second
time, in the compiling thread: about 13 s of one core for ResNet18 training
on the two-core machine (``benchmarks/results/compile_tv.md``), while the default program's compile
leaves the other core idle for much of its time (waiting on its kernel
builds). So on Linux, for CPU graphs and while CUDA is not initialized in
this process, the backend forks a child at the start of the inner compile.
The child (one OpenMP thread, no compile workers, FX graph cache off) runs Inductor's
inner compile of its copy-on-write copy of the graph with the variant's option,
and sends back the wrapper source Inductor was about to load: it never loads
it, never builds a kernel, never touches the parent's caches or tracing
context, and leaves with ``os._exit``. Meanwhile the parent compiles the
default program. Then the parent loads the variant's source with lazy kernels;
constants Inductor attaches at load time are the default module's (same graph,
same names), and a variant that needs one the default lacks is dropped with a
note. If the child fails, dies or does not answer in time (it is then
killed), the variant is compiled in this process as before (from a copy of
the graph taken before the default compile) and the report says why.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inductor_pass.config import FailurePoint
from inductor_pass.program.wrapper_ast import parse_wrapper, unbound_names
from inductor_pass.variants.choose import Program, Variant
from inductor_pass.variants.kernels import lazy_kernels

__all__ = ["Forked", "fork_reason", "start", "collect", "abandon"]

MIN_WAIT_S = 60.0
"""The parent waits at least this long for a child once its own compile is done
(and at least twice as long as that compile took)."""


class _WrapperSource(BaseException):
    """Carries the variant's wrapper source out of Inductor's compile in the child."""


@dataclass(kw_only=True, slots=True)
class Forked:
    """A child generating one variant's wrapper source."""

    name: str
    patch: dict[str, Any]
    pid: int
    fd: int
    started: float


def fork_reason(example_inputs: Any) -> str | None:
    """Why the variants of this graph are not generated in a child, or None."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return "no fork() here"
    if torch.cuda.is_initialized():
        return "CUDA is initialized in this process"
    for x in example_inputs or ():
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return f"a {x.device.type} input"
    return None


def start(
    gm: Any,
    example_inputs: Any,
    kw: dict[str, Any],
    name: str,
    patch: dict[str, Any],
    inject: FailurePoint | None = None,
    in_child: Callable[[], None] | None = None,
) -> Forked:
    """Fork a child that generates the variant ``name`` of ``gm`` (see the Note).

    Args:
        gm: The graph, before Inductor's compile (the child has its own copy).
        example_inputs: Its example inputs.
        kw: Inductor's inner-compile keyword arguments.
        name: The variant's name (:func:`inductor_pass.variants.choose.flipped_options`).
        patch: The Inductor options that make the variant.
        inject: ``PassConfig.inject_failure`` (tests: ``"fork-hang"``, ``"fork-fail"``).
        in_child: Called first in the child (the backend detaches its hooks there).

    Returns:
        The running child.

    Raises:
        OSError: The fork or the pipe failed (nothing is left behind).
    """
    r, w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a multi-threaded process may
            # deadlock the child; the child here only generates code, and the
            # parent kills it after a deadline.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # the child: never returns
        os.close(r)
        _child(w, gm, example_inputs, kw, patch, inject, in_child)
    os.close(w)
    return Forked(name=name, patch=patch, pid=pid, fd=r, started=time.monotonic())


def _child(
    w: int,
    gm: Any,
    example_inputs: Any,
    kw: dict[str, Any],
    patch: dict[str, Any],
    inject: FailurePoint | None,
    in_child: Callable[[], None] | None,
) -> None:
    status: tuple[str, str] = ("error", "Inductor produced no Python wrapper")
    t0 = time.monotonic()
    try:
        if in_child is not None:
            in_child()
        if inject == "fork-hang":
            time.sleep(3600)
        if inject == "fork-fail":
            raise RuntimeError("injected failure in the forked child")
        # The child runs no kernel, but anything Inductor computes eagerly there
        # runs on one thread: OpenMP's thread pool does not survive fork(). Its
        # C++ code generation still sees the parent's thread count (parallel
        # loops are emitted from torch.get_num_threads()).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        torch.get_num_threads = lambda: threads  # this process only
        from torch._inductor import codecache
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx_inner

        def grab(key: str, path: str, *args: Any, **kwargs: Any) -> Any:
            with open(path) as f:
                raise _WrapperSource(f.read())

        codecache.PyCodeCache.load_by_key_path = staticmethod(grab)  # this process only
        with inductor_config.patch({**patch, "fx_graph_cache": False, "compile_threads": 1}):
            compile_fx_inner(gm, example_inputs, **kw)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        e: BaseException | None = exc
        seen = 0
        while e is not None and not isinstance(e, _WrapperSource) and seen < 32:
            e, seen = e.__cause__ or e.__context__, seen + 1
        if isinstance(e, _WrapperSource):
            status = ("ok", e.args[0])
        else:
            status = ("error", f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        try:
            data = pickle.dumps((*status, _child_stats(t0)))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(0)


def _child_stats(t0: float) -> dict[str, float]:
    """The child's seconds, peak RSS and private memory now (MiB; Linux ``/proc``)."""
    import resource

    stats = {
        "seconds": time.monotonic() - t0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    try:
        with open("/proc/self/smaps_rollup") as f:
            private = sum(
                int(line.split()[1])
                for line in f
                if line.startswith(("Private_Clean", "Private_Dirty"))
            )
        stats["private_mib"] = private / 1024
    except (OSError, ValueError):
        pass
    return stats


def _read(fd: int, deadline: float) -> bytes | None:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def abandon(f: Forked) -> None:
    """Kill and reap a child whose result is no longer wanted; never raises."""
    try:
        os.kill(f.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(f.pid, 0)
    except OSError:
        pass
    try:
        os.close(f.fd)
    except OSError:
        pass


def collect(
    f: Forked, default_globals: dict[str, Any] | None, *, lazy: bool
) -> tuple[Variant | None, str]:
    """Wait for a child and load its variant; never raises.

    Args:
        f: The child.
        default_globals: The default program's module globals (their graph
            constants are the variant's too).
        lazy: Load the variant's kernels lazily (Note [Lazy variant kernels]).

    Returns:
        ``(variant, what)`` for a loaded variant (``what``: the child's time and
        memory), or ``(None, why)``; ``why`` starts with ``"retry"`` when the
        variant should be compiled in this process instead, ``"drop"`` when it
        cannot be used.
    """
    waited = time.monotonic()
    deadline = waited + max(MIN_WAIT_S, 2.0 * (waited - f.started))
    try:
        data = _read(f.fd, deadline)
    except OSError as exc:
        data, why = None, f"reading its result failed ({exc})"
    else:
        why = f"no answer within {deadline - waited:.0f} s, killed"
    if data is None:
        abandon(f)
        return None, f"retry: the forked child generating it: {why}"
    try:
        os.waitpid(f.pid, 0)
        os.close(f.fd)
    except OSError:
        pass
    try:
        status, payload, stats = pickle.loads(data)
    except Exception as exc:
        return None, f"retry: the forked child's result is unreadable ({type(exc).__name__})"
    if status != "ok":
        return None, f"retry: the forked child failed ({payload})"
    try:
        got, why = _load(f, payload, default_globals or {}, lazy=lazy)
        if got is not None:
            why = (
                f"generated in a forked child in {stats.get('seconds', 0):.1f} s (peak RSS "
                f"{stats.get('peak_rss_mib', 0):.0f} MiB, pages shared with this process "
                f"included; private memory at its end {stats.get('private_mib', 0):.0f} MiB)"
            )
        return got, why
    except Exception as exc:
        return None, f"retry: loading its source failed ({type(exc).__name__}: {exc})"


def _load(
    f: Forked, source: str, default_globals: dict[str, Any], *, lazy: bool
) -> tuple[Variant | None, str]:
    from torch._inductor import config as inductor_config
    from torch._inductor.codecache import PyCodeCache

    wrapper = parse_wrapper(source)
    key, path = PyCodeCache.write(source)
    with inductor_config.patch(f.patch), lazy_kernels(lazy):
        mod = PyCodeCache.load_by_key_path(key, path)
    glob = vars(mod)
    for n in unbound_names(wrapper, glob):
        if n not in default_globals:
            return None, f"drop: it needs {n}, which Inductor attaches at load time"
        glob[n] = default_globals[n]  # a graph constant: the default module's
    runner = glob.get("runner")
    partitions = getattr(runner, "partitions", None)
    call = glob.get("call")
    if call is None and runner is not None:
        call = runner.call
    if call is None:
        return None, "drop: its module has no call"
    program = Program(source=source, globals=glob, call=call, partitions=partitions)
    return Variant(name=f.name, program=program), ""
