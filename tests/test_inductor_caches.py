"""The caches (Note [Decision cache] in inductor_pass/runtime/decision_cache.py): a warm process
reuses Inductor's caches and the pass's decisions, and deploys what the cold one did.

References: the cold process's own outputs, gradients and measured peaks (bitwise), and
AOTAutograd's cache counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.inductor_support import subprocess_env

_WARM = textwrap.dedent(
    """
    import cProfile, json, pstats
    import torch
    import inductor_pass
    from torch._dynamo.utils import counters
    from tests.inductor_support import Branchy, call_peak, mixer_and_input

    torch.manual_seed(0)
    torch.set_num_threads(1)

    m = Branchy()
    x = torch.randn(256, 64)
    f = torch.compile(m, backend="torch_replay")
    profiler = cProfile.Profile()  # counts the wrapper parses of the first step
    profiler.enable()
    f(x).pow(2).sum().backward()
    profiler.disable()
    parses = sum(
        calls for (_, _, fn), (calls, *_) in pstats.Stats(profiler).stats.items()
        if fn == "parse_wrapper"
    )
    f(x).pow(2).sum().backward()  # the deployed program (if any) runs here
    mixer, xm = mixer_and_input()
    peak, out = call_peak(mixer, xm, "torch_replay")
    print(json.dumps({
        "parses": parses,
        "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
        "reports": [
            {"kind": r.kind, "deployed": r.deployed, "notes": r.notes, "variant": r.variant,
             "program": r.permuted_source if r.deployed else None}
            for r in inductor_pass.reports()
        ],
        "grads": [p.grad.view(torch.int32).tolist() for p in m.parameters()],
        "mixer": [peak, out.view(torch.int32).tolist()],
    }))
    """
)


def _run(env: dict[str, str]) -> dict:
    """One fresh process running ``_WARM``; its JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", _WARM], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_process_reuses_caches_and_decisions(tmp_path):
    # One cold and one warm process serve every check (each process compiles the models
    # afresh, most of this file's time).
    env = subprocess_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    cold = _run(env)
    warm = _run(env)
    assert cold["aot_hits"] == 0 and warm["aot_hits"] >= 1  # AOTAutograd's cache stays on
    assert [r["kind"] for r in cold["reports"]] == ["forward", "backward", "inference"]
    assert [(r["kind"], r["deployed"], r["variant"]) for r in warm["reports"]] == [
        (r["kind"], r["deployed"], r["variant"]) for r in cold["reports"]
    ]
    # A cached permutation of the default program is the very program the cold process
    # deployed (source for source). Not compared for a deployed variant: there the cold
    # report's permuted_source can be the variant's rejected permutation.
    perm = [
        i
        for i, r in enumerate(cold["reports"])
        if r["deployed"] and r["variant"] in (None, "default")
    ]
    assert perm, cold["reports"]
    assert [warm["reports"][i]["program"] for i in perm] == [
        cold["reports"][i]["program"] for i in perm
    ]
    # A variant chosen in the cold process is loaded from the cache and runs.
    assert cold["mixer"] == warm["mixer"]
    # Decisions gone, graphs still in AOTAutograd's cache: the variant programs
    # (not recompiled on such a hit) are loaded from the pass's cache.
    for dirpath, _, files in os.walk(tmp_path / "inductor" / "torch_replay_decisions"):
        for name in files:
            with open(os.path.join(dirpath, name)) as f:
                if "decision" in json.load(f):
                    os.remove(os.path.join(dirpath, name))
    third = _run(env)
    assert third["aot_hits"] >= 1
    assert [r["variant"] for r in third["reports"]] == [r["variant"] for r in cold["reports"]]
    for r in third["reports"]:
        assert not any("decision from the pass's cache" in n for n in r["notes"])
    assert third["mixer"] == cold["mixer"]
    for r in cold["reports"]:
        assert not any("decision from the pass's cache" in n for n in r["notes"])
    for r in warm["reports"]:
        assert any("decision from the pass's cache" in n for n in r["notes"])
    assert cold["grads"] == warm["grads"]
    assert os.listdir(tmp_path / "inductor" / "torch_replay_decisions")
    _check_warm_first_call_parses_no_wrapper(cold, warm)


def _check_warm_first_call_parses_no_wrapper(cold: dict, warm: dict) -> None:
    # A warm process deploys a cached permutation from the cached program's source: it
    # parses no wrapper (the parse of a large wrapper was most of a warm first call).
    # Branchy's reports (forward, backward) only: the mixer's variant source is parsed
    # when it is loaded.
    cold_branchy, warm_branchy = cold["reports"][:2], warm["reports"][:2]
    assert cold["parses"] >= 1  # the pass ran: the count sees parse_wrapper
    deployed = [r for r in cold_branchy if r["deployed"]]
    # permutations of the default program (a variant's own source is parsed when loaded)
    assert deployed and all(r["variant"] in (None, "default") for r in deployed), cold_branchy
    assert all(any("decision from the pass's cache" in n for n in r["notes"]) for r in warm_branchy)
    assert [(r["kind"], r["deployed"], r["variant"]) for r in warm_branchy] == [
        (r["kind"], r["deployed"], r["variant"]) for r in cold_branchy
    ]
    assert warm["parses"] == 0
