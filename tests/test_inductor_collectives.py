"""The pass never runs a program with collectives (Note [Observable calls] in
inductor_pass/stages/observable.py): 2 spawned ranks (gloo, CPU), an all-reduce inside the
compiled function, every call's output against eager PyTorch's, with both decision caches
cold and then with rank 0's warm and rank 1's cold.

Before: rank 1's cold first call ran the program once more inside the pass, all-reduce
included, so from the second call on each all-reduce paired with the other rank's previous
call (outputs differ from eager), then gloo timed out. The workers and their rendezvous are
``tests/test_distributed.py``'s.
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from tests.test_distributed import _spawn

CALLS = 3
# A rank waits at most this long in a collective: the warm rank waits for the cold one's
# compile at its first call (seconds, more on a loaded machine); a rank that ran an extra
# all-reduce waits for a partner that never comes, and its job then fails with an error.
COLLECTIVE_TIMEOUT_S = 300


def _step(x, w, group):
    h = torch.relu(x @ w)
    a = fc.all_reduce(h * 2 + 1, "sum", group)
    return a - h, a @ w


def _mixed_caches_job(rank: int) -> dict:
    """Per phase: each call's outputs equal eager's, and the graph's report."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    import inductor_pass

    group = dist.new_group(
        [0, 1], backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    gen = torch.Generator().manual_seed(7)
    # Small integers: every sum is exact, so compiled and eager outputs are equal bitwise.
    w = torch.randint(-2, 3, (16, 16), generator=gen).float()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        # cold: both caches empty; mixed: rank 0 reuses its cache (warm), rank 1 a new one.
        for phase, dirname in (("cold", "a"), ("mixed", "a" if rank == 0 else "b")):
            torch._dynamo.reset()
            inductor_pass.clear_reports()
            equal = []
            with temporary_cache_dir(os.path.join(tmp, dirname)), torch.no_grad():
                compiled = torch.compile(_step, backend="torch_replay")
                for call in range(CALLS):
                    x = torch.randint(-4, 5, (8, 16), generator=gen).float() + 16 * rank + call
                    got = compiled(x, w, group)
                    want = _step(x, w, group)
                    equal.append([torch.equal(a, b) for a, b in zip(got, want, strict=True)])
            out[phase] = {
                "equal": equal,
                "reports": [(r.deployed, r.reason, list(r.notes)) for r in inductor_pass.reports()],
            }
    dist.destroy_process_group(group)
    return out


def test_two_ranks_mixed_decision_caches_match_eager():
    ranks = _spawn(_mixed_caches_job)
    for rank, res in enumerate(ranks):
        for phase in ("cold", "mixed"):
            assert res[phase]["equal"] == [[True, True]] * CALLS, (rank, phase, res[phase])
            (deployed, reason, _), *more = res[phase]["reports"]
            assert not more and not deployed, (rank, phase, res[phase]["reports"])
            assert reason.startswith("left unchanged: calls torch.ops._c10d_functional."), reason
            assert "a collective" in reason, reason
    # Both ranks decided the same, one from its cache and one by the pass.
    (_, reason0, notes0), (_, reason1, notes1) = (r["mixed"]["reports"][0] for r in ranks)
    assert reason0 == reason1
    assert any("decision from the pass's cache" in n for n in notes0), notes0
    assert not any("decision from the pass's cache" in n for n in notes1), notes1
