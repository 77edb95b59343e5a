"""The models of ``benchmarks/bench_compile.py`` (its own three, torchvision's ``tv:`` and
the tiny transformers ``hf:`` ones), one compiled step of each, and its child process:
what bench_compile, count_compile and the compile profilers share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.lib.cli import ROOT

__all__ = ["MODELS", "SCRIPT", "build_step", "model_names", "run_child"]

MODELS = ("mlp", "convnet", "segment")
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_compile.py")
"""The script a child runs (by path, as bench_compile always ran itself)."""


def build_step(name: str):
    """The model ``name`` (in eval mode when its step is inference) and ``step(f)``: one step
    of it through ``f`` (``torch.compile(model, ...)``): a training step's loss
    ``out.float().pow(2).sum()`` backward, or an inference call under ``no_grad``."""
    import torch

    model, inputs, train = _build(name)
    if not train:
        model.eval()

    def step(f):
        if not train:
            with torch.no_grad():
                return f(*inputs)
        out = f(*inputs)
        out.float().pow(2).sum().backward()
        return out

    return model, step


def _build(name: str):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 64)
        )
        return model, (torch.randn(128, 256),), True
    if name == "convnet":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        return model, (torch.randn(8, 3, 32, 32),), True
    if name == "segment":

        class Segment(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(1000, 32)
                self.lin = nn.Linear(32, 16)

            def forward(self, ids, seg):
                e = self.emb(ids)
                pooled = torch.zeros(4096, 32).index_add(0, seg, e)
                return torch.relu(self.lin(pooled))

        ids = torch.randint(0, 1000, (512,))
        seg = torch.randint(0, 4096, (512,))
        return Segment(), (ids, seg), True
    if name.startswith("tv:"):  # a torchvision model, e.g. tv:resnet50 (weights=None)
        import torchvision

        kind, _, arch = name[3:].rpartition(":")
        side = int(os.environ.get("BENCH_COMPILE_TV_SIZE", "64"))
        kw = {"image_size": side} if arch.startswith(("vit_",)) else {}
        model = torchvision.models.get_model(arch, weights=None, **kw)
        if arch.startswith("inception"):
            model.aux_logits, model.AuxLogits = False, None
        return model, (torch.randn(2, 3, side, side),), kind != "inference"
    if name.startswith("hf:"):  # a tiny transformers model, e.g. hf:inference:llama
        from benchmarks.lib.hf_models import build_hf_model

        kind, _, family = name[3:].rpartition(":")
        model, inputs = build_hf_model(family)
        return model, inputs, kind != "inference"
    raise SystemExit(
        f"unknown model {name!r}; choose from {', '.join(MODELS)}, tv:[inference:]<arch> "
        "or hf:[inference:]<family>"
    )


def model_names(models: str) -> list[str]:
    """The comma-separated ``models``, with ``hf`` standing for every Hugging Face family
    of benchmarks/lib/hf_models.py, inference and training."""
    names = [m for m in models.split(",") if m]
    if "hf" in names:
        from benchmarks.lib.hf_models import HF_MODELS

        at = names.index("hf")
        names[at : at + 1] = [f"hf:{k}{f}" for f in HF_MODELS for k in ("inference:", "")]
    return names


def run_child(
    name: str, backend: str, cache: str, wrapper: tuple[str, ...] = (), **env_extra: str
) -> dict[str, float]:
    """One child process of bench_compile (``python benchmarks/bench_compile.py --child
    name backend``, its JSON line parsed) on Inductor cache directory ``cache``
    (``wrapper``: a command it runs under, e.g. valgrind's)."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(env_extra)
    proc = subprocess.run(
        [*wrapper, sys.executable, SCRIPT, "--child", name, backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=7200,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}/{backend} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
