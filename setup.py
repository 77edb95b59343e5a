"""Build the torch_replay C++ extension.

Build knobs (environment variables, documented in README.md "Build knobs"):
  TORCH_REPLAY_DEBUG=1      compile with -O0 -g and assertions.
  TORCH_REPLAY_NO_CUDA=1    never build the CUDA kernels, even with a CUDA torch.
  TORCH_REPLAY_ASAN=1       compile with AddressSanitizer (-O1 -g -fsanitize=address;
                            run with LD_PRELOAD of libasan, see scripts/asan_sweep.sh).
  TORCH_REPLAY_SKIP_EXT=1   register the package without building the extension
                            (scripts/setup.sh then builds it in place, incrementally).
  MAX_JOBS=N                parallel compile jobs (torch's own knob).

Always build with ``pip install --no-build-isolation -e .`` so the extension
links against the torch that will import it.
"""

from __future__ import annotations

import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(ROOT, pattern)))
    # Tests (GoogleTest *_test.cpp, the standalone CUDA *_test.cu) have their own main().
    return [
        os.path.relpath(f, ROOT)
        for f in files
        if not os.path.splitext(os.path.basename(f))[0].endswith("_test")
    ]


def _cxx_standard() -> str:
    # torch 2.14's headers require C++20; older ones build with C++17.
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


def _extension():
    debug = os.environ.get("TORCH_REPLAY_DEBUG", "0") == "1"
    # NDEBUG as torch itself is built: RecordFunction::inputs() asserts in debug
    # builds of its header on a flag release builds never set (Note [C++ observer]).
    cxx = [_cxx_standard(), "-O0" if debug else "-O3", "-fvisibility=hidden", "-DNDEBUG"]
    if debug:
        cxx += ["-g", "-DTORCH_REPLAY_DEBUG"]
    asan = os.environ.get("TORCH_REPLAY_ASAN", "0") == "1"
    link = []
    if asan:
        cxx = [c for c in cxx if not c.startswith("-O")]
        cxx += ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]
        link = ["-fsanitize=address"]
    sources = (
        _sources("csrc/core/*.cpp") + _sources("csrc/aten/*.cpp") + _sources("csrc/python/*.cpp")
    )
    include_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, "cuda")]
    with_cuda = (
        torch.version.cuda is not None
        and CUDA_HOME is not None
        and os.environ.get("TORCH_REPLAY_NO_CUDA", "0") != "1"
    )
    if with_cuda:
        sources += _sources("cuda/*.cu") + _sources("csrc/aten/cuda/*.cpp")
        return CUDAExtension(
            "torch_replay._C",
            sources,
            include_dirs=include_dirs,
            define_macros=[("TORCH_REPLAY_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++17"]},
            extra_link_args=link,
        )
    return CppExtension(
        "torch_replay._C",
        sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx},
        extra_link_args=link,
    )


setup(
    ext_modules=[] if os.environ.get("TORCH_REPLAY_SKIP_EXT", "0") == "1" else [_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
