#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh), then runs every test: lint, the C++
# core's GoogleTest suite (CTest), the CUDA kernels (compiled with nvcc where
# it exists, run where a GPU exists), the docs (Sphinx -W and doctests), pytest, and the
# GPU check's dry run.
set -euo pipefail
cd "$(dirname "$0")/.."
set -a; . ./build.env; set +a  # the build, described once (C++ standards, flags, Boost)
T0=$SECONDS
section() { echo "== $* [$((SECONDS - T0)) s since the start]"; }
section "setup (scripts/setup.sh)"
bash scripts/setup.sh
PY="${TORCH_REPLAY_VENV:-.venv}/bin/python"
BIN="$(dirname "$PY")"
# Inductor's and Triton's kernel caches for this checkout only (unless set): two test runs
# side by side (two clones, two CI jobs on one machine) share no cache directory, so
# neither can load a kernel the other is still writing (seen as "file too short").
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/inductor_cache}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/build/triton_cache}"
JOBS="${MAX_JOBS:-$(nproc)}"
# Python's bytecode, cached for this checkout (build/pycache, outside the source folders):
# where PYTHONDONTWRITEBYTECODE is set (as on the CI machine) every Python process of the run,
# each pytest worker, each test's subprocess, each distributed rank, compiled the ~1,600
# modules of torch it imports from source again (6 to 8 s of CPU a process).
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/build/pycache}"
unset PYTHONDONTWRITEBYTECODE

section "lint (ruff, clang-format)"
"$BIN/ruff" check .
"$BIN/ruff" format --check .
mapfile -t cxx < <(git ls-files 'csrc/*.h' 'csrc/*.cpp' 'cuda/*.h' 'cuda/*.cu' 'benchmarks/*.cpp')
"$BIN/clang-format" --dry-run -Werror "${cxx[@]}"

section "C++ core (GoogleTest via CTest)"
cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
  -DPython3_EXECUTABLE="$PWD/$PY" >/dev/null
cmake --build build/cmake -j "$JOBS"
ctest --test-dir build/cmake --output-on-failure -j "$JOBS"

section "CUDA kernels (cuda/)"
if command -v nvcc >/dev/null 2>&1; then
  mkdir -p build/cuda
  nvcc -std="c++$CXX_STANDARD" "$OPT_LEVEL" -c cuda/journal_kernels.cu -o build/cuda/journal_kernels.o
  nvcc -std="c++$CXX_STANDARD" "$OPT_LEVEL" -Icuda cuda/journal_kernels_test.cu build/cuda/journal_kernels.o \
    -o build/cuda/journal_kernels_test
  set +e
  build/cuda/journal_kernels_test
  rc=$?
  set -e
  if [ "$rc" -eq 77 ]; then
    echo "CUDA kernels compiled; their test is skipped: no CUDA device on this machine"
  elif [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
else
  echo "nvcc not found: CUDA kernels not compiled here"
fi

section "docs (Sphinx with warnings as errors; every example in the pages runs as a doctest)"
# The two builds side by side (each is one process; they share no output or doctree folder).
"$PY" -m sphinx -W -q -b html docs build/docs/html &
html=$!
"$PY" -m sphinx -W -q -b doctest docs build/docs/doctest
wait "$html"  # its exit status: a failed HTML build fails the run (set -e)

section "pytest (the 25 slowest tests listed at the end: where CI time goes)"
# Two pytest-xdist workers, one test file each at a time (--dist loadfile: a file's tests
# share one process, its module fixtures and compiles), handed out in collection order
# (--no-loadscope-reorder: tests/conftest.py puts the files that start JAX last);
# tests/conftest.py gives each worker its own Inductor and Triton cache. Arguments after
# ours win: `-n 0` runs in one process.
"$PY" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests "$@"

section "GPU check, dry run (scripts/gpu_check.sh --dry-run: everything but the GPU)"
bash scripts/gpu_check.sh --dry-run --out build/gpu_check_dry_run
section "done"
