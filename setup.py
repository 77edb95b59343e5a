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
  CUDA_HOME                 the CUDA toolkit (torch's knob); unset, torch's guess when it
                            holds the CUDA headers, else the toolkit nvcc reports.
  TORCH_CUDA_ARCH_LIST      CUDA architectures (torch's knob); without a GPU to ask,
                            build.env's CUDA_ARCH_LIST.

The C++ standards, flags and Boost version are in build.env, shared with CMake and scripts/.

The extension links against the torch that builds it, so it is built in the environment
that will import it: ``pip install --no-build-isolation .`` (or ``-e .``). Before anything
is compiled, :func:`check_build_environment` stops the build with one message when that
cannot work (pip's build isolation, no torch, no C++ compiler, no Boost headers). The
build records the torch it compiled against (``torch_replay/_build_info.json``, compared
at load: Note [Extension loading] in ``torch_replay/_ext.py``) and the package requires
that torch release (``torch==X.Y.Z``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))

# Commands that compile the extension (the others, such as egg_info, dist_info and sdist,
# only describe or pack the source).
_BUILD_COMMANDS = frozenset(
    {"build", "build_ext", "bdist_wheel", "bdist_egg", "install", "develop", "editable_wheel"}
)

# The system packages that provide what the build needs, by distribution.
_BOOST_PACKAGES = (
    "Debian/Ubuntu: apt-get install libboost-graph-dev; Fedora/RHEL: dnf install boost-devel; "
    "conda: conda install -c conda-forge libboost-headers; or set BOOST_ROOT=DIR for a Boost "
    "in DIR/include"
)
_COMPILER_PACKAGES = "Debian/Ubuntu: apt-get install g++; Fedora/RHEL: dnf install gcc-c++"


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


# ------------------------------------------------------------ the environment, checked


def _isolated(environ: dict[str, str]) -> bool:
    """Whether this runs in a build front end's isolated environment (pip's build
    isolation puts its ``pip-build-env-*`` folders on ``PYTHONPATH``; ``python -m build``
    runs in a ``build-env-*`` virtual environment), which holds its own torch or none."""
    places = [*environ.get("PYTHONPATH", "").split(os.pathsep), sys.prefix]
    return any(re.search(r"(^|[\\/])(pip-)?build-env-", p) for p in places if p)


def _boost_problem(environ: dict[str, str]) -> str | None:
    """Preprocesses the Boost headers the core includes with the compiler that will build
    it; returns what is missing, or ``None``."""
    cxx = environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        return f"a C++ compiler (`{cxx}` not found; {_COMPILER_PACKAGES})"
    flags = []
    if environ.get("BOOST_ROOT"):
        flags.append("-I" + os.path.join(environ["BOOST_ROOT"], "include"))
    probe = (
        "#include <boost/version.hpp>\n"
        "#include <boost/graph/adjacency_list.hpp>\n"
        "#include <boost/graph/boykov_kolmogorov_max_flow.hpp>\n"
        "torch_replay_boost_version=BOOST_VERSION\n"
    )
    try:
        run = subprocess.run(
            [cxx, "-E", "-P", "-x", "c++", *flags, "-"],
            input=probe,
            capture_output=True,
            text=True,
            env=environ,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"a working C++ compiler (`{cxx} -E` failed: {e}; {_COMPILER_PACKAGES})"
    minimum = BUILD["BOOST_MIN_VERSION"]
    if run.returncode != 0:
        missing = re.search(r"(boost/[\w/.]+): No such file", run.stderr)
        detail = f"{missing.group(1)} not found" if missing else run.stderr.strip()[-300:]
        return f"the Boost.Graph headers, Boost >= {minimum} ({detail}; {_BOOST_PACKAGES})"
    found = re.search(r"torch_replay_boost_version=(\d+)", run.stdout)
    if found:
        version = int(found.group(1))
        major, minor = (int(v) for v in minimum.split("."))
        if version < major * 100000 + minor * 100:
            have = f"{version // 100000}.{version // 100 % 1000}"
            return f"Boost >= {minimum} (found {have}; {_BOOST_PACKAGES})"
    return None


def _wheel_problem() -> str | None:
    """setuptools >= 70.1 builds wheels itself; older ones need the ``wheel`` package."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401
    except ImportError:
        try:
            import wheel  # noqa: F401
        except ImportError:
            return "the Python package `wheel` (pip install wheel), or setuptools >= 70.1"
    return None


def build_environment_problems(
    argv: list[str], environ: dict[str, str]
) -> tuple[str | None, list[str]]:
    """What stands in the way of building here, before anything is compiled.

    Args:
        argv: the setup commands (``sys.argv[1:]``).
        environ: the environment variables.

    Returns:
        ``(torch_problem, missing)``: why the torch here cannot be built against (or
        ``None``), and the missing things the extension's build needs, each named with
        the packages that provide it.
    """
    torch_problem = None
    if _isolated(environ):
        torch_problem = (
            "this is an isolated build environment (pip's default build isolation, or "
            "`python -m build` without --no-isolation): it holds another torch or none, "
            "and the extension must be built against the torch you will run"
        )
    else:
        try:
            import torch  # noqa: F401
        except ImportError as e:
            torch_problem = f"torch cannot be imported here ({e}): install your torch first"
    building = environ.get("TORCH_REPLAY_SKIP_EXT", "0") != "1" and any(
        a in _BUILD_COMMANDS for a in argv
    )
    missing = []
    if building:
        for problem in (_boost_problem(environ), _wheel_problem()):
            if problem is not None:
                missing.append(problem)
    return torch_problem, missing


def check_build_environment(argv: list[str], environ: dict[str, str]) -> None:
    """Stops the build at once, with one message that says what to run, where it could
    not succeed (:func:`build_environment_problems`).

    Raises:
        SystemExit: with the message.
    """
    torch_problem, missing = build_environment_problems(argv, environ)
    if torch_problem is None and not missing:
        return
    lines = ["torch_replay cannot be built here."]
    if torch_problem is not None:
        lines += [
            f"- {torch_problem}.",
            "  torch_replay links against the torch installed in the environment that will "
            "import it. Install torch there first, then, from the source folder:",
            "      pip install --no-build-isolation .",
            "  (`pip install --no-build-isolation -e .` for an editable install; in a "
            "checkout, `bash scripts/setup.sh` sets up the project's own .venv instead).",
        ]
    if missing:
        lines.append("- missing: " + "; ".join(missing) + ".")
    raise SystemExit("\n".join(lines))


# ------------------------------------------------------------------- the extension


def _cxx_standard(torch) -> str:
    # torch 2.14's headers require C++20; older ones build with the core's standard.
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    key = "CXX_STANDARD_TORCH_2_14" if (major, minor) >= (2, 14) else "CXX_STANDARD"
    return f"-std=c++{BUILD[key]}"


def _is_toolkit(folder: str | None) -> bool:
    return bool(folder) and os.path.isfile(os.path.join(folder, "include", "cuda_runtime_api.h"))


def _nvcc_top(environ: dict[str, str]) -> str | None:
    """The toolkit folder nvcc itself uses (its ``TOP``), which a wrapper script or a
    symbolic link on ``PATH`` hides from a guess by path."""
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc is None:
        return None
    try:
        run = subprocess.run(
            [nvcc, "-v", "--dryrun", "-c", "torch_replay_probe.cu"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^#\$ TOP=(.+)$", run.stdout + run.stderr, re.MULTILINE)
    return os.path.realpath(found.group(1).strip()) if found else None


def _cuda_home(guess: str | None, environ: dict[str, str]) -> str | None:
    """The CUDA toolkit to build with: ``CUDA_HOME`` / ``CUDA_PATH`` when set (the user's
    choice), else torch's guess when it is a toolkit (has ``include/cuda_runtime_api.h``),
    else the folder nvcc reports, else ``/usr/local/cuda``; ``guess`` when none is."""
    if environ.get("CUDA_HOME") or environ.get("CUDA_PATH") or _is_toolkit(guess):
        return guess
    for folder in (_nvcc_top(environ), "/usr/local/cuda"):
        if _is_toolkit(folder):
            return folder
    return guess


def _cuda_setup(torch) -> str | None:
    """The CUDA toolkit to build the kernels with, or ``None`` for a CPU build. A CUDA
    torch on a machine without a GPU gets build.env's architectures (torch cannot ask the
    device) and the headers of the pip CUDA wheels that torch's own headers include."""
    if torch.version.cuda is None or os.environ.get("TORCH_REPLAY_NO_CUDA", "0") == "1":
        return None
    from torch.utils import cpp_extension

    CUDA_HOME = _cuda_home(cpp_extension.CUDA_HOME, os.environ)
    if CUDA_HOME is not None and CUDA_HOME != cpp_extension.CUDA_HOME:
        # torch's guess (nvcc's folder's parent) is not a toolkit: a wrapper script such
        # as /usr/local/bin/nvcc gives /usr/local, without the CUDA headers or libraries.
        print(
            f"torch_replay: CUDA toolkit {CUDA_HOME} (torch guessed {cpp_extension.CUDA_HOME}, "
            "which has no include/cuda_runtime_api.h; set CUDA_HOME to choose)",
            file=sys.stderr,
        )
        cpp_extension.CUDA_HOME = CUDA_HOME  # read at each use by CUDAExtension and nvcc
        os.environ["CUDA_HOME"] = CUDA_HOME
    if CUDA_HOME is None:
        print(
            f"torch_replay: torch {torch.__version__} is a CUDA build but no CUDA toolkit "
            "was found (set CUDA_HOME): building without the CUDA kernels",
            file=sys.stderr,
        )
        return None
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = BUILD["CUDA_ARCH_LIST"]
    return CUDA_HOME


def _nvidia_includes() -> list[str]:
    try:
        import nvidia
    except ImportError:
        return []
    return sorted(
        d for base in nvidia.__path__ for d in glob.glob(os.path.join(base, "*", "include"))
    )


def _extension(torch):
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    debug = os.environ.get("TORCH_REPLAY_DEBUG", "0") == "1"
    # NDEBUG as torch itself is built: RecordFunction::inputs() asserts in debug
    # builds of its header on a flag release builds never set (Note [C++ observer]).
    opt = "-O0" if debug else BUILD["OPT_LEVEL"]
    cxx = [_cxx_standard(torch), opt, "-fvisibility=hidden", "-DNDEBUG"]
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
    if _cuda_setup(torch) is not None:
        sources += _sources("cuda/*.cu") + _sources("csrc/aten/cuda/*.cpp")
        return CUDAExtension(
            "torch_replay._C",
            sources,
            include_dirs=include_dirs + _nvidia_includes(),
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


def build_info(torch, with_cuda: bool) -> dict[str, object]:
    """What the extension was built against (``torch_replay/_build_info.json``)."""
    return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "with_cuda": with_cuda}


def _build_ext_class(torch):
    from torch.utils.cpp_extension import BuildExtension

    base = BuildExtension.with_options(use_ninja=True)

    class BuildExt(base):
        """torch's BuildExtension, which also writes the build's record beside the
        extension (in place or in the build folder, whichever it builds into)."""

        def run(self):
            super().run()
            if not self.extensions:
                return
            ext = self.extensions[0]
            folder = os.path.dirname(self.get_ext_fullpath(ext.name))
            with_cuda = any(s.endswith(".cu") for s in ext.sources)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "_build_info.json"), "w") as f:
                json.dump(build_info(torch, with_cuda), f, indent=1)
                f.write("\n")

    return BuildExt


def main() -> None:
    check_build_environment(sys.argv[1:], dict(os.environ))
    import torch
    from setuptools import setup

    # The release the extension is built against, without its local part (+cpu, +cu128):
    # pip then keeps this package and that torch together (Note [Extension loading]).
    release = str(torch.__version__).split("+")[0]
    skip = os.environ.get("TORCH_REPLAY_SKIP_EXT", "0") == "1"
    setup(
        ext_modules=[] if skip else [_extension(torch)],
        cmdclass={"build_ext": _build_ext_class(torch)},
        install_requires=[f"torch=={release}"],
    )


if __name__ == "__main__":
    main()
