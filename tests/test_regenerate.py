"""The regeneration baseline (Note [Regeneration baseline] in benchmarks/regenerate.py).

References: a brute-force check that the scheduler-order hook returns a
topological order that follows the target wherever the target is legal, and
Inductor's own default program (regenerating its own order must give its
program's measured peak and bitwise outputs).
"""

from __future__ import annotations

import itertools

import torch

import inductor_pass
from benchmarks import regenerate
from inductor_pass import PassConfig, make_backend


class _Node:
    """The parts of a fused scheduler node that ``order_pass`` reads."""

    def __init__(self, name, bufs, ancestors=()):
        self.name, self.bufs, self.ancestors = name, list(bufs), set(ancestors)

    def get_operation_names(self):
        return {self.name}

    def get_buffer_names(self):
        return set(self.bufs)


def _legal(order, nodes):
    seen = set()
    for n in order:
        if not n.ancestors <= seen:
            return False
        seen.add(n.name)
    return True


def test_order_pass_follows_every_legal_target_and_repairs_illegal_ones():
    # a -> c, b -> c, d independent; e a projection of c (matches no call).
    nodes = [
        _Node("a", ["buf0"]),
        _Node("b", ["buf1"]),
        _Node("c", ["buf2"], {"a", "b"}),
        _Node("d", ["buf3"]),
        _Node("e", ["buf4"], {"a", "b", "c"}),
    ]
    calls = {"a": {"buf0"}, "b": {"buf1"}, "c": {"buf2", "buf0"}, "d": {"buf3"}}
    for perm in itertools.permutations("abcd"):
        target = [calls[k] for k in perm]
        hook = regenerate.order_pass(target)
        out = hook(list(nodes))
        assert _legal(out, nodes) and len(out) == len(nodes)
        got = [n.name for n in out if n.name != "e"]
        # Brute force: the legal orders of a..d; a legal target is followed exactly.
        legal = perm.index("c") > max(perm.index("a"), perm.index("b"))
        if legal:
            assert got == list(perm)
        # The unmatched projection comes right after what it depends on.
        names = [n.name for n in out]
        assert names.index("e") == names.index("c") + 1
        assert hook.matched == 4 and hook.nodes == 5


class _Segments(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lin = torch.nn.Embedding(1000, 32), torch.nn.Linear(32, 16)

    def forward(self, ids, seg):
        pooled = torch.zeros(4096, 32).index_add(0, seg, self.emb(ids))
        return torch.relu(self.lin(pooled))


def test_regenerating_inductors_own_order_reproduces_its_program(one_thread):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _Segments()
    ids, seg = torch.randint(0, 1000, (512,)), torch.randint(0, 4096, (512,))
    inductor_pass.clear_reports()
    with regenerate.Capture() as cap:
        f = torch.compile(m, backend=make_backend(PassConfig(decision_cache=False)))
        f(ids, seg).pow(2).sum().backward()
    torch._dynamo.reset()
    kinds = sorted(g.report.kind for g in cap.graphs)
    assert kinds == ["backward", "forward"]
    for g in cap.graphs:
        r = g.report
        assert r.measured_original_peak is not None
        rg = regenerate.regenerate(g, r.original_source)
        assert rg.in_order and rg.bitwise
        assert rg.matched == rg.nodes or rg.matched > 0
        assert rg.measured_peak == r.measured_original_peak
        if r.permuted_source is not None:  # the pass's better order, fed back
            rg = regenerate.regenerate(g, r.permuted_source)
            assert rg.in_order and rg.bitwise
