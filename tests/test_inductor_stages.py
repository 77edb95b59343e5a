"""The pass's stages on hand-written programs: input ownership and measurement (Note [Input
ownership] in inductor_pass/stages/guard.py) and the effect check (inductor_pass/stages/profile.py).

References: hand-counted bytes of hand-written wrapper calls, and storages whose bytes the
test changes itself.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from inductor_pass.program.wrapper_ast import parse_wrapper
from inductor_pass.stages import effects, guard


def test_input_ownership_sees_only_list_references():
    held = torch.randn(4)
    base = torch.randn(8)
    args = [
        torch.randn(3),  # only the list: owned
        held,  # a local holds it
        base[:4],  # the storage is also held through ``base``
        7,  # not a tensor
        torch.nn.Parameter(torch.randn(2)),  # only the list, but a leaf: owned
    ]
    shared = torch.randn(6)
    args += [shared[:3], shared[3:]]  # two views, storage held by ``shared``
    assert guard.input_ownership(args) == [True, False, False, False, True, False, False]
    del shared
    # A view keeps its base alive (autograd's view info), a holder outside the
    # list that the test cannot see through: such inputs are taken as held.
    assert guard.input_ownership(args)[5:] == [False, False]
    args[5:] = [torch.randn(3)]
    assert guard.input_ownership(args)[5] is True
    alias = args[0]
    assert guard.input_ownership(args)[0] is False
    del alias


def test_runtime_args_free_owned_inputs_at_last_use():
    # A hand-written wrapper call: the owned input dies at ``del``; a held one does not.
    def call(args):
        a, b = args
        args.clear()
        c = torch.neg(a)
        del a
        d = torch.mul(c, b)
        del c, b
        return (d,)

    x, y = torch.randn(1000), torch.randn(1000)
    nbytes = 4000
    peak_held, out_h, _ = guard.measure_cpu(call, [x, y])
    peak_owned, out_o, final = guard.measure_cpu(call, [x, y], owned=[True, False])
    peak_both, _, final_both = guard.measure_cpu(call, [x, y], owned=[True, True])
    # Held: c and d live together. Owned a: counted from the start, freed
    # before d exists: the same peak. Both owned: a, b and c live together.
    assert peak_held >= 2 * nbytes
    assert peak_owned == peak_held
    assert peak_both == peak_held + nbytes
    assert len(final) == 1 and len(final_both) == 0
    assert torch.equal(out_h[0], out_o[0])


_EFFECT_WRAPPER = textwrap.dedent(
    '''
    import torch
    k_rw = async_compile.cpp_pybinding(['const float*', 'float*'], r"""
    extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
    """)

    class Runner:
        def __init__(self, partitions):
            self.partitions = partitions

        def call(self, args):
            arg0_1, = args
            args.clear()
            buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
            k_rw(arg0_1, buf0)
            del arg0_1
            return (buf0, )
    '''
)


@pytest.mark.parametrize("honest", [True, False])
def test_effect_check_by_hashes_finds_undeclared_writes(honest):
    def k_rw(a, b):  # declared: reads a (const float*), writes b
        if not honest:
            a.add_(1.0)
        b.copy_(a)

    glob = {
        "torch": torch,
        "k_rw": k_rw,
        "empty_strided_cpu": torch._C._dynamo.guards._empty_strided_cpu,
    }
    prof = effects.profile_effects(parse_wrapper(_EFFECT_WRAPPER), glob, [torch.ones(4)])
    if honest:
        assert prof.problems == []
    else:
        assert any("undeclared write by statement" in p for p in prof.problems), prof.problems
    st = torch.ones(4).untyped_storage()
    before = effects.storage_digest(st)
    assert effects.storage_digest(st) == before
    torch.empty(0, dtype=torch.uint8).set_(st)[5] ^= 1
    assert effects.storage_digest(st) != before
