#!/usr/bin/env bash
# Runs the timm tests (tests/test_timm.py, with tests/test_replace_torch_checkpoint.py) in a
# virtual environment of their own, outside the checkout. timm imports torchvision, and
# torchvision must match torch: on this machine it exists only for torch 2.14.1 (CUDA build,
# from the wheels on disk), while the project's .venv has torch 2.13, which torchvision 0.29.1
# would replace. So these tests skip in .venv and run here (opt-in: not part of
# scripts/run_tests.sh or .ci/run).
#
#   bash scripts/timm_tests.sh [PYTEST_ARGS...]
#
#   TORCH_REPLAY_TIMM_HOME  where venv/ and src/ live (default ${XDG_CACHE_HOME:-~/.cache}/torch_replay/timm)
#   TORCH_REPLAY_TIMM_VENV  an existing environment to use instead of $TORCH_REPLAY_TIMM_HOME/venv
#   TORCH_REPLAY_NO_CUDA    default 1 here: the tests run on the CPU, so the CUDA kernels are not built
#
# Steps: the venv (once: torch 2.14.1, torchvision 0.29.1, timm 1.0.31 and requirements-dev.txt's
# pytest/build pins, about 5.5 GB), a copy of this working tree (tracked and untracked files git
# does not ignore) into src/, the extension built there against torch 2.14.1 (incrementally
# after the first time; the checkout's own build for .venv is never touched), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
HOME_DIR="${TORCH_REPLAY_TIMM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_replay/timm}"
VENV="${TORCH_REPLAY_TIMM_VENV:-$HOME_DIR/venv}"
SRC="$HOME_DIR/src"
case "$SRC/" in "$ROOT"/*) echo "timm_tests.sh: $SRC must be outside the checkout" >&2; exit 2 ;; esac
log() { echo "[timm_tests] $*"; }
mkdir -p "$SRC"

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch, torchvision, timm, pytest, sys; sys.exit(0 if torch.__version__.split('+')[0] == '2.14.1' and timm.__version__ == '1.0.31' else 1)" 2>/dev/null; then
  log "installing torch 2.14.1, torchvision 0.29.1, timm 1.0.31"
  mapfile -t pins < <(grep -E '^(pytest|ninja|setuptools|wheel|numpy|hypothesis|expecttest)([=>]|$)' requirements-dev.txt)
  "$PY" -m pip install -q --no-compile torch==2.14.1 torchvision==0.29.1 timm==1.0.31 "${pins[@]}"
fi

log "copying the working tree to $SRC"
git ls-files -co --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$SRC"
log "building the extension against torch 2.14.1"
(cd "$SRC" && TORCH_REPLAY_NO_CUDA="${TORCH_REPLAY_NO_CUDA:-1}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$PY" setup.py -q build_ext --inplace >"$HOME_DIR/build.log" 2>&1) \
  || { tail -30 "$HOME_DIR/build.log"; exit 1; }
cd "$SRC"
PYTHONPATH="$SRC" "$PY" -m pytest -q -p no:cacheprovider tests/test_timm.py \
  tests/test_replace_torch_checkpoint.py "$@"
