"""A segment run and back-propagated inside one ``torch.autocast`` block (docs/limits.md,
"Autocast's cached casts"): the re-run reads autocast's cached low-precision copy of a
parameter, not the parameter, so a parameter changed in place between forward and backward
does not reach torch's re-run, and torch's gradient is eager's. torch_replay gives it
bitwise at the default level, with or without the layer declared, reentrant or not, with
every engine that can restore; where it cannot tell (``detect="reads"`` undeclared, the
guard engine declared) it refuses by name, never a third answer."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as torch_cp

import torch_replay as tr
from tests.reference import assert_bitwise


def _step(how: str, reentrant: bool = False, cache: bool = True, **options):
    """Forward, the weight moved in place, backward: all in one autocast (bfloat16) block.
    Returns the input's and the parameters' gradients."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    if options.pop("declare", False):
        options["state"] = [lin]
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        if how == "eager":
            y = lin(x)
        elif how == "torch":
            y = torch_cp.checkpoint(lin, x, use_reentrant=reentrant)
        else:
            y = tr.checkpoint(lin, x, use_reentrant=reentrant, **options)
        with torch.no_grad():
            lin.weight.add_(1.0)  # the cached bfloat16 copy keeps the forward's values
        y.float().pow(2).sum().backward()
    return [x.grad, lin.weight.grad, lin.bias.grad]


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_cache_is_what_makes_torch_right(reentrant):
    """The premise: torch's re-run uses the cached cast, so torch is eager's; with the
    cache off it casts the moved weight and is wrong, where torch_replay (default level)
    restores the weight and is eager's."""
    assert_bitwise(_step("torch", reentrant), _step("eager"))
    eager = _step("eager", cache=False)
    wrong = _step("torch", reentrant, cache=False)
    assert not all(torch.equal(a, b) for a, b in zip(wrong, eager, strict=True))
    assert_bitwise(_step("tr", reentrant, cache=False), eager)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("engine", ["auto", "snapshot", "journal", "readset", "guard"])
@pytest.mark.parametrize("declare", [False, True])
def test_default_level_gives_torchs_gradient(reentrant, engine, declare):
    """At the default level ("preserve") every engine that can restore gives torch's
    (= eager's) gradient bitwise; the guard with the layer declared keeps nothing to
    restore and says so by name."""
    assert tr.config.detect == "preserve"
    reference = _step("torch", reentrant)
    if engine == "guard" and declare:
        with pytest.raises(tr.StateMutationError, match=r"Linear\.weight.*engine='guard'"):
            _step("tr", reentrant, engine=engine, declare=True)
        return
    assert_bitwise(_step("tr", reentrant, engine=engine, declare=declare), reference)


@pytest.mark.parametrize("reentrant", [False, True])
def test_reads_level_refuses_by_name_and_says_how(reentrant):
    """detect="reads" sees the parameter's version move and cannot tell that the re-run
    reads only the cached copy: a named refusal whose message gives both fixes; each fix
    then gives torch's gradient."""
    reference = _step("torch", reentrant)
    with tr.config.patch(detect="reads"):
        with pytest.raises(tr.StateMutationError, match=r"state=.*detect = \"preserve\""):
            _step("tr", reentrant)
        assert_bitwise(_step("tr", reentrant, declare=True), reference)
    assert_bitwise(_step("tr", reentrant), reference)
