"""What the program variant costs at a cold compile, and what was tried to make it cheaper.

Issue 12 asks for a cold compile within 1.25x of Inductor's while every graph is
also compiled as Inductor's ``reorder_for_peak_memory=False`` program (Note
[Program variants] in ``inductor_pass/variants/choose.py``). This script measures, in
one fresh process with an empty ``TORCHINDUCTOR_CACHE_DIR``:

- per program (``default`` / ``variant``, told apart by the option's value at
  the time), the wall seconds of Inductor's stages: lowering
  (``GraphLowering.run``), scheduler construction (``Scheduler._init``),
  scheduling and kernel code generation (``Scheduler.codegen``), wrapper code
  generation (``GraphLowering.codegen``) and loading the module
  (``PyCodeCache.load_by_key_path``, which waits for the C++ kernel compiles);
- whether Inductor's reorder changed the node order of each graph, how many
  C++ kernels each program has and how many kernel bodies the two programs
  do not share (those are compiled twice);
- an any-order lower bound over the default program's fused nodes with the
  pass's measured sizes (a buffer made by an ancestor of node k and still
  needed by a descendant of k is live while k runs, in every order, grouping
  and reuse of the same fused nodes), next to the default program's deployed
  peak: were the two equal, no variant could be lower and its compile could be
  skipped;
- the first training step's wall time, and the CPU seconds of the process and
  its reaped children (Inductor's compile workers are shut down first).

``--experiment`` changes how the variant is built (see
``benchmarks/results/compile_tv.md`` for what each gave on the two-core machine,
including the experiments that led to Notes [Deferred variant kernels] and
[Forked variant codegen], now part of the pass):

- ``no-fork``: the variant generated in this process (``PassConfig.fork_variants=False``)
  instead of in a forked child;
- ``variant-O0`` / ``variant-O1``: the variant's kernels compiled at -O0/-O1
  (cheaper to build; would need a rebuild at -O3 when deployed).

The pass's profiles come from its compile observers (Note [Compile observers] in
``inductor_pass/observe.py``); nothing of the pass is patched. Inductor's own stages
are timed by wrapping Inductor's functions (it has no observer of its own).

Run (torchvision models need the torch 2.14.1 environment):
    TORCH_REPLAY_NO_CUDA=1 OMP_NUM_THREADS=1 python -m benchmarks.profile_variant_cost \\
        --model tv:resnet18 [--backend inductor] [--experiment fork-codegen]
Prints only. The Inductor timers and the -O experiments wrap private Inductor
functions of the torch they were written against (2.13 / 2.14); they are
measurement aids, not product code.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import resource
import tempfile
import time

from benchmarks.lib.cli import make_parser
from inductor_pass.observe import CompileObserver, observing

TIMES: dict[tuple[str, str], float] = collections.defaultdict(float)
SOURCES: list[tuple[str, str]] = []
NOTES: list[str] = []
DAGS: list[dict] = []
PROFILES: list = []


def _program() -> str:
    from torch._inductor import config

    return "default" if config.reorder_for_peak_memory else "variant"


def _timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        program, t0 = _program(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[(program, label)] += time.perf_counter() - t0

    setattr(owner, name, timed)


def _capture_dag(scheduler_obj) -> dict:
    """The fused nodes of the default program as its scheduler has them (order, users, inputs)."""
    from torch._inductor.virtualized import V

    outputs = set(V.graph.get_output_names())
    nodes = []
    for n in scheduler_obj.nodes:
        bufs = [
            (
                b.get_name(),
                [u.node.get_name() if hasattr(u.node, "get_name") else "OUTPUT" for u in b.users],
                b.get_name() in outputs,
            )
            for b in n.get_outputs()
        ]
        reads = {d.name for d in n.read_writes.reads}
        nodes.append(
            {
                "name": n.get_name(),
                "anc": set(n.ancestors),
                "extern": n.is_extern(),
                "bufs": bufs,
                "reads": reads,
            }
        )
    input_users = {
        name: [nd["name"] for nd in nodes if name in nd["reads"]] for name in V.graph.graph_inputs
    }
    return {
        "nodes": nodes,
        "input_users": input_users,
        "input_is_output": {name: name in outputs for name in V.graph.graph_inputs},
    }


def _needed(users: list[str], is_output: bool, node: dict, descendants: set[str]) -> bool:
    """Whether a buffer is live while ``node`` runs (given that an ancestor made it)."""
    if is_output or any(u in descendants for u in users):
        return True
    return node["extern"] and node["name"] in users  # an extern kernel holds its inputs


def _any_order_bound(dag: dict, model) -> int:
    """Bytes live while some node runs, in every order, grouping and reuse of these fused nodes.

    Uses the pass's measured storage sizes (``ProgramModel``) of the default
    program: while node k runs, a buffer made by an ancestor of k (or an input
    the call owns) that is a graph output or still needed by a descendant of k
    is live, and so are k's own outputs (an extern kernel's transient bytes
    instead when larger, and its inputs). Names the default program does not
    materialise count nothing.
    """
    nodes = dag["nodes"]
    index = {nd["name"]: i for i, nd in enumerate(nodes)}
    desc: list[set[str]] = [set() for _ in nodes]
    for nd in nodes:
        for a in nd["anc"]:
            if a in index:
                desc[index[a]].add(nd["name"])
    unit_of = {d: st.index for st in model.wrapper.region for d in st.defines}

    def storages(name: str) -> set[int]:
        return {s for s in model.name_storages.get(name, ()) if model.counted(s)}

    best = 0
    for k, nd in enumerate(nodes):
        live: set[int] = set()

        for other in nodes:
            if other["name"] in nd["anc"]:
                for name, users, is_output in other["bufs"]:
                    if _needed(users, is_output, nd, desc[k]):
                        live |= storages(name)
        for name, users in dag["input_users"].items():
            if _needed(users, dag["input_is_output"][name], nd, desc[k]):
                live |= storages(name)
        own: set[int] = set()
        for name, _users, _out in nd["bufs"]:
            own |= storages(name)
        own -= live
        extra = sum(model.sizes[s] for s in own)
        if nd["extern"]:
            units = [unit_of[name] for name, _u, _o in nd["bufs"] if name in unit_of]
            if units:
                extra = max(extra, model.transient[units[-1]])
        best = max(best, sum(model.sizes[s] for s in live) + extra)
    return best


def _instrument() -> None:
    from torch._inductor import codecache, graph, memory, scheduler

    _timed(graph.GraphLowering, "run", "lowering")
    _timed(scheduler.Scheduler, "_init", "scheduler init")
    _timed(scheduler.Scheduler, "codegen", "scheduling + kernel codegen")
    _timed(graph.GraphLowering, "codegen", "wrapper codegen (incl. the above)")
    _timed(codecache.PyCodeCache, "load_by_key_path", "module load (C++ waits)")

    load = codecache.PyCodeCache.load_by_key_path

    def load_by_key_path(key, path, *args, **kwargs):
        with open(path) as f:
            SOURCES.append((_program(), f.read()))
        return load(key, path, *args, **kwargs)

    codecache.PyCodeCache.load_by_key_path = load_by_key_path
    reorder = memory.reorder_for_peak_memory

    def reorder_for_peak_memory(nodes, *args, **kwargs):
        out = reorder(nodes, *args, **kwargs)
        changed = [n.get_name() for n in out] != [n.get_name() for n in nodes]
        NOTES.append(f"graph of {len(nodes)} fused nodes: reorder changed the order: {changed}")
        return out

    memory.reorder_for_peak_memory = reorder_for_peak_memory
    codegen = scheduler.Scheduler.codegen

    def scheduler_codegen(self):
        if _program() == "default":
            try:
                DAGS.append(_capture_dag(self))
            except Exception as exc:  # pragma: no cover - private API moved
                DAGS.append({"error": f"{type(exc).__name__}: {exc}"})
        return codegen(self)

    scheduler.Scheduler.codegen = scheduler_codegen


class _Profiles(CompileObserver):
    """The pass's profile of every program it runs (Note [Compile observers])."""

    def profiled(self, source, profiled) -> None:
        PROFILES.append(profiled)


def _kernel_bodies(source: str) -> list[str]:
    parts = re.split(r"\n\w+ = async_compile\.cpp_pybinding\(", source)
    return [p.split("\n\n\n")[0] for p in parts[1:]]


def _experiment(name: str) -> None:
    import inductor_pass

    if name == "no-fork":
        inductor_pass.set_config(fork_variants=False)
        return
    if name in ("variant-O0", "variant-O1"):
        from torch._inductor import cpp_builder

        flags, level = cpp_builder._get_optimization_cflags, name[-2:]

        def optimization_cflags(*args, **kwargs):
            cflags, ldflags = flags(*args, **kwargs)
            if _program() == "variant":
                cflags = [level if f == "O3" else f for f in cflags]
            return cflags, ldflags

        cpp_builder._get_optimization_cflags = optimization_cflags
    elif name != "none":
        raise SystemExit(f"unknown experiment {name!r}")


def main() -> None:
    ap = make_parser(__doc__)
    ap.add_argument("--model", default="convnet", help="as in bench_compile.py")
    ap.add_argument("--backend", default="torch_replay", choices=("torch_replay", "inductor"))
    ap.add_argument("--tv-size", type=int, default=64)
    ap.add_argument(
        "--experiment",
        default="none",
        choices=("none", "no-fork", "variant-O0", "variant-O1"),
    )
    args = ap.parse_args()
    os.environ["BENCH_COMPILE_TV_SIZE"] = str(args.tv_size)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="variant_cost_"))
    t_start = time.perf_counter()
    import torch
    from torch._inductor.async_compile import shutdown_compile_workers

    import inductor_pass
    from benchmarks.lib.compile_models import build_step

    _instrument()
    _experiment(args.experiment)
    torch.set_num_threads(1)
    model, step = build_step(args.model)
    f = torch.compile(model, backend=args.backend)
    t0 = time.perf_counter()
    with observing(_Profiles()):
        step(f)
    step = time.perf_counter() - t0
    shutdown_compile_workers()
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"{args.model} {args.backend} experiment={args.experiment}: first step {step:.1f} s; "
        f"process wall {time.perf_counter() - t_start:.1f} s, CPU {own.ru_utime + own.ru_stime:.1f}"
        f" s + children {kids.ru_utime + kids.ru_stime:.1f} s"
    )
    for (program, label), seconds in sorted(TIMES.items()):
        print(f"  {program:8s} {label:36s} {seconds:6.2f} s")
    for note in NOTES:
        print(f"  {note}")
    by_program: dict[str, list[list[str]]] = collections.defaultdict(list)
    for program, source in SOURCES:
        by_program[program].append(_kernel_bodies(source))
    for i, (d, v) in enumerate(zip(by_program["default"], by_program["variant"], strict=False)):
        print(
            f"  graph {i}: C++ kernels default {len(d)}, variant {len(v)}; bodies only in the "
            f"default {len(set(d) - set(v))}, only in the variant {len(set(v) - set(d))}"
        )
    by_source = {getattr(p.wrapper, "source", None): p for p in PROFILES}
    for i, r in enumerate(inductor_pass.reports()):
        peaks = {k: v.get("measured_permuted_peak") for k, v in r.variants.items()}
        chosen = r.measured_permuted_peak if r.deployed else r.measured_original_peak
        print(
            f"  {r.kind}: measured peak of the deployed program {chosen} B; per program {peaks}; "
            f"the pass at the first call {r.pass_seconds:.2f} s"
        )
        for note in r.notes:
            if note.startswith("variant "):
                print(f"    {note}")
        bounds = {k: v.get("lower_bound") for k, v in r.variants.items()}
        print(f"    each program's own lower bound (its kernel calls, any order): {bounds}")
        default = by_source.get(r.original_source)
        dag = DAGS[i] if i < len(DAGS) else {"error": "not captured"}
        if "error" in dag or default is None or default.model is None or chosen is None:
            print(f"    any-order bound: n/a ({dag.get('error', 'no model')})")
            continue
        bound = _any_order_bound(dag, default.model)
        print(
            f"    any-order bound over {len(dag['nodes'])} fused nodes, measured sizes: {bound} B "
            f"({chosen - bound} B below the deployed default; equal would prove no variant lower)"
        )


if __name__ == "__main__":
    main()
