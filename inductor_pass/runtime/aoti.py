"""The pass on AOTInductor packages: :func:`aoti_compile_and_package`.

Note [AOTInductor packages]
``torch._inductor.aoti_compile_and_package`` compiles an exported program into a
package (a C++ library and its constants) without calling any ``torch.compile``
backend, so the pass cannot meet it on the way. This function stands in for it,
with the same arguments, and carries the pass's order into the package the way
Note [C++ wrapper] (``inductor_pass/runtime/cpp_wrapper.py``) does for
``cpp_wrapper`` programs:

1. Inductor's package is compiled as always (that is the program to beat, and
   what is returned whenever anything below does not hold). During that compile,
   Inductor's post-fusion scheduler hook (``config._post_fusion_custom_pass``,
   which returns the nodes as they are) keeps the graph Inductor lowers and its
   example inputs.
2. That graph is compiled once more with the Python wrapper, outside AOT mode:
   the twin. Same graph, so the same buffers (``bufN``) and kernels.
3. The pass runs on the twin on copies of the exported program's own example
   inputs (``ExportedProgram.example_inputs``: the real tensors the user exported
   with, never made-up data), under ``torch.no_grad()`` as a package runs.
4. If it finds a lower order, a second package is compiled with the hook putting
   the scheduler nodes in that order (``reorder_for_peak_memory`` off), both
   packages are loaded (``aoti_load_package``) and run on copies of those inputs,
   and the permuted package is kept only when its measured peak is lower and its
   outputs (values, metadata, aliasing) and the inputs it writes are bitwise the
   original's. Otherwise Inductor's package is written to ``package_path``.

The decision is a :class:`~inductor_pass.report.GraphReport` (``reports()``), as
for a ``torch.compile`` graph. Exported programs with symbolic sizes
(``dynamic_shapes``), example inputs that are not real tensors, or a
``_post_fusion_custom_pass`` of the caller's own are packaged by Inductor alone,
with the reason in the report.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import torch

from inductor_pass.config import PassConfig, get_config
from inductor_pass.observe import span
from inductor_pass.report import GraphReport, failed, record
from inductor_pass.runtime import cpp_wrapper
from inductor_pass.runtime.graph_copy import copy_graph
from inductor_pass.stages import guard
from inductor_pass.stages.rewrite import optimize_wrapper
from inductor_pass.variants.choose import program_of

__all__ = ["aoti_compile_and_package"]

NOTE = (
    "AOTInductor package: the pass ran on the package graph's Python twin, on the exported "
    "program's example inputs (Note [AOTInductor packages])"
)


def aoti_compile_and_package(
    exported_program: torch.export.ExportedProgram,
    *,
    package_path: str | os.PathLike[str] | None = None,
    inductor_configs: dict[str, Any] | None = None,
    config: PassConfig | None = None,
) -> str:
    """``torch._inductor.aoti_compile_and_package`` with the pass's order (Note [AOTInductor
    packages]); the same keyword arguments, and ``config``.

    Args:
        exported_program: From ``torch.export.export``, with real example inputs.
        package_path: Where the package goes (``.pt2``); None: where Inductor puts it.
        inductor_configs: Inductor options for the compile, as for Inductor's function.
        config: The pass's options; None uses :func:`inductor_pass.get_config`.

    Returns:
        The package's path. Load it with ``torch._inductor.aoti_load_package``.
    """
    from torch._inductor import aoti_compile_and_package as inductor_package

    cfg = config or get_config()
    configs = dict(inductor_configs or {})
    rep = GraphReport(kind="inference", reason="")
    rep.notes.append(NOTE)
    why = _refusal(exported_program, configs, cfg)
    if why is not None:
        path = inductor_package(
            exported_program, package_path=package_path, inductor_configs=configs
        )
        rep.reason = f"left unchanged: {why}"
        record(rep, print_it=cfg.report, dump_dir=cfg.dump_dir)
        return path
    captured: dict[str, Any] = {}

    def capture(nodes: list[Any]) -> list[Any]:
        from torch._inductor.virtualized import V

        captured.update(
            gm=copy_graph(V.graph.module),
            inputs=list(V.graph.example_inputs),
            fake_mode=V.fake_mode,
        )
        return nodes

    with span("AOTInductor package (Inductor's order)"):
        path = inductor_package(
            exported_program,
            package_path=package_path,
            inductor_configs={**configs, "_post_fusion_custom_pass": capture},
        )
    t0 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="torch_replay_aoti_")
    try:
        try:
            chosen = _permuted_package(exported_program, path, configs, captured, rep, cfg, scratch)
        except Exception as exc:  # Inductor's package stays where it is
            rep = failed("inference", None, exc)
            rep.notes.append(NOTE)
            chosen = None
        if chosen is not None:
            if _same_fs(chosen, path):
                os.replace(chosen, path)
            else:
                shutil.copyfile(chosen, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rep.pass_seconds = time.perf_counter() - t0
    record(rep, print_it=cfg.report, dump_dir=cfg.dump_dir)
    return path


def _same_fs(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(os.path.dirname(os.path.abspath(b))).st_dev
    except OSError:
        return False


def _refusal(ep: Any, configs: dict[str, Any], cfg: PassConfig) -> str | None:
    if not cfg.enabled:
        return "pass disabled (PassConfig.enabled=False)"
    if configs.get("_post_fusion_custom_pass") is not None:
        return "inductor_configs has a _post_fusion_custom_pass of its own"
    try:
        guard.extension()
    except Exception as exc:
        return f"the torch_replay extension is not loaded ({exc})"
    inputs = _flat_inputs(ep)
    if inputs is None:
        return "the exported program has no example inputs to profile on"
    for x in inputs:
        if isinstance(x, torch.Tensor) and (
            isinstance(x, torch._subclasses.FakeTensor) or x.device.type == "meta"
        ):
            return "the exported program's example inputs are not real tensors"
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            return "symbolic sizes (dynamic_shapes): an order is carried at static sizes only"
    return None


def _flat_inputs(ep: Any) -> list[Any] | None:
    example = getattr(ep, "example_inputs", None)
    if example is None:
        return None
    args, kwargs = example
    return list(torch.utils._pytree.tree_leaves((args, kwargs)))


def _runner(path: str, ep: Any):
    """The loaded package as a ``call(list of flat inputs)``."""
    loaded = torch._inductor.aoti_load_package(path)
    _, spec = torch.utils._pytree.tree_flatten(ep.example_inputs)

    def call(flat: list[Any]) -> Any:
        args, kwargs = torch.utils._pytree.tree_unflatten(list(flat), spec)
        flat.clear()
        return loaded(*args, **kwargs)

    return call


def _permuted_package(
    ep, path, configs, captured, rep: GraphReport, cfg, scratch: str
) -> str | None:
    """The permuted package's (temporary) path when it is to replace Inductor's, else None;
    fills ``rep``."""
    from torch._guards import TracingContext, tracing
    from torch._inductor import aoti_compile_and_package as inductor_package
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.virtualized import V

    from inductor_pass.runtime.state import collecting

    if "gm" not in captured:
        rep.reason = "left unchanged: Inductor's scheduler hook was not called (no graph to twin)"
        return None
    fake_mode = captured["fake_mode"]
    with (
        span("AOTInductor twin"),
        V.set_fake_mode(fake_mode),
        tracing(TracingContext(fake_mode)),
        collecting(),
        inductor_config.patch({**configs, **cpp_wrapper.TWIN_PATCH}),
    ):
        twin = program_of(compile_fx_inner(copy_graph(captured["gm"]), captured["inputs"]))
    inputs = _flat_inputs(ep)
    assert inputs is not None
    graph_inputs = [x for x in inputs if isinstance(x, torch.Tensor)]
    with torch.no_grad():
        got, new_call, _ = optimize_wrapper(
            twin.source,
            twin.globals or {},
            graph_inputs,
            original_call=twin.call,
            partitions=twin.partitions,
            config=cfg,
            kind="inference",
        )
    for name in GraphReport.__dataclass_fields__:
        if name != "notes":
            setattr(rep, name, getattr(got, name))
    rep.notes += got.notes
    rep.deployed = False
    if new_call is None or got.permuted_order is None or got.permuted_source is None:
        rep.reason = f"{got.reason} (Inductor's package kept)"
        return None
    rep.notes.append(
        f"twin (Python wrapper): modelled {got.modelled_original_peak} -> "
        f"{got.modelled_permuted_peak} B, measured {got.measured_original_peak} -> "
        f"{got.measured_permuted_peak} B"
    )
    hook, moved = cpp_wrapper.order_hook(got.permuted_source)

    reorder_on = configs.get("reorder_for_peak_memory", inductor_config.reorder_for_peak_memory)
    patch = {**configs, **cpp_wrapper.hook_patch(hook, reorder_on)}
    candidate = os.path.join(scratch, "permuted.pt2")
    try:
        with span("AOTInductor package (the pass's order)"):
            candidate = inductor_package(ep, package_path=candidate, inductor_configs=patch)
    except Exception as exc:
        refused = cpp_wrapper.refusal(exc)
        if refused is None:
            raise
        rep.reason = f"left unchanged: {refused} (Inductor's package kept)"
        return None
    rep.notes.append(f"package compiled with the twin's order ({cpp_wrapper.moved_note(moved)})")
    with span("AOTInductor guard"):
        p0, p1, same = cpp_wrapper.compare(
            _runner(path, ep), _runner(candidate, ep), inputs, None, rep
        )
    if not same:
        rep.reason = "left unchanged: the permuted package's outputs are not bitwise Inductor's"
    elif p1 >= p0:
        rep.reason = f"left unchanged: the permuted package measured {p1} B, not below {p0} B"
    elif not cfg.deploy:
        rep.reason = f"not deployed (PassConfig.deploy=False): package {p0} -> {p1} B"
    else:
        rep.deployed = True
        rep.reason = f"deployed: the package with the twin's order measured {p0} -> {p1} B"
        return candidate
    return None
