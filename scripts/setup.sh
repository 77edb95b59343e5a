#!/usr/bin/env bash
# Sets up everything torch_replay needs on a fresh Debian machine, then builds
# the extension into ./.venv. Safe to rerun: every step is skipped when done.
#
#   TORCH_REPLAY_TORCH=2.13.0  (default) CPU build of torch from the wheels on disk
#   TORCH_REPLAY_TORCH=2.14.1  CUDA build with torchvision 0.29.1 (about 5.5 GB)
#   TORCH_REPLAY_VENV=DIR      where the virtual environment lives (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${TORCH_REPLAY_TORCH:-2.13.0}"
VENV="${TORCH_REPLAY_VENV:-.venv}"
log() { echo "[setup] $*"; }

# 1. System packages: compilers, CMake, Boost.Graph, GoogleTest.
need=()
for pkg in g++ cmake libboost-graph-dev libgtest-dev libgmock-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. Python environment with torch from the wheels already on this machine.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# --no-compile: no .pyc for the 14,000 Python files of torch, jax, transformers and the rest
# up front; Python writes one for each module the first time it is imported.
PIP=("$PY" -m pip install -q --no-compile)
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION"
  if [ "$TORCH_VERSION" = "2.14.1" ]; then
    "${PIP[@]}" "torch==2.14.1" "torchvision==0.29.1"
  else
    "${PIP[@]}" "torch==$TORCH_VERSION"
  fi
fi
"${PIP[@]}" -r requirements-dev.txt
# torchtitan for tests/test_torchtitan.py, in a folder of its own beside the venv's packages
# (requirements-torchtitan.txt says why); redone when that file changes.
TITAN_SITE="$VENV/torchtitan-site"
if ! cmp -s requirements-torchtitan.txt "$TITAN_SITE/.requirements" 2>/dev/null; then
  log "installing torchtitan into $TITAN_SITE (--no-deps, requirements-torchtitan.txt)"
  rm -rf "$TITAN_SITE"
  "${PIP[@]}" --no-deps --target "$TITAN_SITE" -r requirements-torchtitan.txt
  cp requirements-torchtitan.txt "$TITAN_SITE/.requirements"
fi

# 3. The extension, linked against the torch in $VENV. The editable install
#    (package metadata, entry points) is redone when pyproject.toml changes;
#    the extension itself is rebuilt incrementally (ninja) every time.
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
# A CUDA build of torch needs nothing set here: setup.py finds the toolkit (CUDA_HOME, else
# torch's guess, else the one nvcc reports, else /usr/local/cuda), takes build.env's
# architectures when there is no GPU to ask (TORCH_CUDA_ARCH_LIST wins when set) and adds
# the pip CUDA wheels' headers (nvidia/*/include) that torch's own headers include.
stamp="$VENV/.torch_replay_installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ build.env -nt "$stamp" ] \
   || ! "$PY" -m pip show -q torch_replay >/dev/null 2>&1; then
  log "installing the package (pip install --no-build-isolation -e .)"
  TORCH_REPLAY_SKIP_EXT=1 "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  touch "$stamp"
fi
log "building the extension (setup.py build_ext --inplace)"
"$PY" setup.py -q build_ext --inplace >/dev/null
"$PY" -c "import torch_replay; print('[setup] torch_replay', torch_replay.__version__, 'with torch', __import__('torch').__version__)"
