"""Build the torch_replay C++ extension.

Build knobs (environment variables, documented in README.md "Build knobs"):
  TORCH_REPLAY_DEBUG=1      compile with -O0 -g and assertions.
  TORCH_REPLAY_NO_CUDA=1    never build the CUDA kernels, even with a CUDA torch.
  TORCH_REPLAY_ASAN=1       compile with AddressSanitizer (build.env's ASAN_FLAGS; run
                            with LD_PRELOAD of libasan, see scripts/asan_sweep.sh).
  TORCH_REPLAY_SKIP_EXT=1   register the package without building the extension
                            (scripts/setup.sh then builds it in place, incrementally).
  BOOST_ROOT=DIR            a Boost outside the compiler's search path (DIR/include).
  MAX_JOBS=N                parallel compile jobs (torch's own knob).

The C++ standards, flags and Boost version are in build.env, shared with CMake and scripts/.

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


def build_env() -> dict[str, str]:
    """The shared description of the build (``build.env``: ``KEY=value`` lines)."""
    out = {}
    with open(os.path.join(ROOT, "build.env")) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and key.isidentifier() and not line.startswith("#"):
                out[key] = value.strip('"')
    return out


BUILD = build_env()


def _cxx_standard() -> str:
    # torch 2.14's headers require C++20; older ones build with the core's standard.
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    key = "CXX_STANDARD_TORCH_2_14" if (major, minor) >= (2, 14) else "CXX_STANDARD"
    return f"-std=c++{BUILD[key]}"


def _extension():
    debug = os.environ.get("TORCH_REPLAY_DEBUG", "0") == "1"
    # NDEBUG as torch itself is built: RecordFunction::inputs() asserts in debug
    # builds of its header on a flag release builds never set (Note [C++ observer]).
    opt = "-O0" if debug else BUILD["OPT_LEVEL"]
    cxx = [_cxx_standard(), opt, "-fvisibility=hidden", "-DNDEBUG"]
    if debug:
        cxx += ["-g", "-DTORCH_REPLAY_DEBUG"]
    else:
        # Python's own CFLAGS (sysconfig) carry -g, which torch.utils.cpp_extension passes
        # on; a release build is OPT_LEVEL without debug info, and the debug info of
        # torch's headers costs more compile time than the code itself (module.cpp:
        # 51 s of CPU with it, 29 s without).
        cxx += ["-g0"]
    asan = os.environ.get("TORCH_REPLAY_ASAN", "0") == "1"
    link = ["-ldl"]  # dlopen/dlsym (Note [Steady heap]); in libc itself from glibc 2.34
    if asan:
        cxx = [c for c in cxx if not c.startswith(("-O", "-g"))]
        cxx += BUILD["ASAN_FLAGS"].split()
        link += ["-fsanitize=address"]
    sources = (
        _sources("csrc/core/*.cpp") + _sources("csrc/aten/*.cpp") + _sources("csrc/python/*.cpp")
    )
    include_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, "cuda")]
    if os.environ.get("BOOST_ROOT"):
        include_dirs.append(os.path.join(os.environ["BOOST_ROOT"], "include"))
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
            extra_compile_args={"cxx": cxx, "nvcc": [opt, f"-std=c++{BUILD['CXX_STANDARD']}"]},
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
