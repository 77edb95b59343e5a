"""config.heap (Note [Steady heap] in csrc/core/heap_policy.h): what glibc itself reports
about where blocks come from and what it keeps, in fresh processes, before and after
the first checkpoint call."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import torch

import torch_replay as tr
from tests.inductor_support import subprocess_env

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the steady heap sets glibc's malloc thresholds; this platform's malloc is not glibc's",
)

MiB = 1 << 20

# Runs in a fresh process: reports, from glibc's mallinfo2, whether a block of 16 MiB
# (20 MiB after: glibc's own adjustment raised its threshold to 16 MiB when the first
# one was freed) is mapped on its own (hblks) before and after one checkpoint call, and
# how much of the heap (arena) stays after 40 MiB of blocks at its top are freed.
CHILD = r"""
import ctypes, json, sys
import torch, torch_replay as tr

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2
MiB = 1 << 20

def mapped_alone(nbytes):
    before = libc.mallinfo2().hblks
    p = libc.malloc(nbytes)
    during = libc.mallinfo2().hblks
    libc.free(p)
    return during - before == 1

out = {"before_call": mapped_alone(16 * MiB), "setting_before": tr.heap_setting()}
x = torch.randn(8, requires_grad=True)
y = tr.checkpoint(torch.sin, x, use_reentrant=False)
y.sum().backward()
out["grad_ok"] = bool(torch.allclose(x.grad, torch.cos(x.detach())))
out["after_call"] = mapped_alone(20 * MiB)  # above what glibc adjusted to for the first
out["top_before"] = libc.mallinfo2().keepcost
out["setting"] = tr.heap_setting()
blocks = [libc.malloc(10 * MiB) for _ in range(4)]
out["arena_full"] = libc.mallinfo2().arena
for p in reversed(blocks):
    libc.free(p)
out["arena_after_free"] = libc.mallinfo2().arena
print(json.dumps(out))
"""


def run_child(**env: str) -> dict:
    base = {
        k: v
        for k, v in subprocess_env().items()
        if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "TORCH_REPLAY_HEAP")
    }
    base.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=base, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_first_checkpoint_call_sets_the_thresholds_and_importing_does_not():
    r = run_child()
    assert r["setting_before"] == ""
    assert r["before_call"] is True  # glibc's default: 16 MiB is mapped on its own
    assert r["setting"] == "set: glibc's mmap threshold 32 MiB, trim threshold 64 MiB"
    assert r["after_call"] is False  # from the heap now
    assert r["grad_ok"]
    # 40 MiB freed at the heap's top stay (under the 64 MiB trim threshold).
    assert r["top_before"] < 24 * MiB, r
    assert r["arena_full"] >= 40 * MiB
    assert r["arena_after_free"] >= r["arena_full"]


@pytest.mark.parametrize(
    "env, word",
    [
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "MALLOC_MMAP_THRESHOLD_"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
            "GLIBC_TUNABLES=glibc.malloc.trim_threshold",
        ),
    ],
)
def test_the_users_own_malloc_setting_stands(env, word):
    r = run_child(**env)
    assert r["setting"] == f"left: {word} is set (the user's choice of glibc's thresholds stands)"
    assert r["after_call"] is True  # glibc still maps 20 MiB alone, as the user's 128 KiB says
    assert r["grad_ok"]


def test_system_leaves_glibc_alone():
    r = run_child(TORCH_REPLAY_HEAP="system")
    assert r["setting"] == ""
    assert r["after_call"] is True
    # glibc's own trimming: the freed top goes back (its trim threshold, twice the
    # 20 MiB block it last unmapped, is 40 MiB).
    assert r["arena_after_free"] <= r["arena_full"] - 32 * MiB
    assert r["grad_ok"]


def test_a_misspelt_setting_is_refused_with_the_spellings_that_work():
    old = tr.config.heap
    tr.config.heap = "off"
    try:
        x = torch.randn(3, requires_grad=True)
        with pytest.raises(
            ValueError, match=r"config.heap must be one of \('steady', 'system'\), got 'off'"
        ):
            tr.checkpoint(torch.sin, x, use_reentrant=False)
        assert x.grad is None
    finally:
        tr.config.heap = old
