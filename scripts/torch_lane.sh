#!/usr/bin/env bash
# Runs the test suite on another torch, beside the project's own .venv (opt-in: not part of
# scripts/run_tests.sh or .ci/run, which stay on the default torch and under 20 minutes).
#
#   bash scripts/torch_lane.sh VERSION [--gpu-check] [--no-tests] [-- PYTEST_ARGS...]
#   e.g. bash scripts/torch_lane.sh 2.14.1     (the CUDA build from this machine's disk)
#        bash scripts/torch_lane.sh 2.11.0     (from the package registry: GBs, once)
#
# Everything lives in the lane's folder, outside the checkout:
#   $TORCH_LANE_HOME/torch-VERSION/  (default ${XDG_CACHE_HOME:-~/.cache}/torch_replay/lanes)
#     venv/    torch==VERSION (+ torchvision 0.29.1 with 2.14.1, as scripts/setup.sh) and the
#              requirements-dev.txt pins, installed under the constraint torch==VERSION so
#              no pin can move torch (a pin that needs another torch fails the install);
#              TORCH_LANE_VENV=DIR uses an existing environment instead. Made once, reused.
#     src/     a copy of this working tree (tracked and untracked files git does not
#              ignore), refreshed every run; its build outputs stay between runs, so the
#              extension is rebuilt incrementally, and the checkout's own in-place build
#              (for .venv's torch) is never touched.
#     junit.xml, tests.log, build.log, compile_smoke.log, row.md: this run's records.
#
# Steps: build (in src/: `pip install --no-build-isolation --no-deps -e .` to register the
# package, `setup.py build_ext --inplace` for the extension, as scripts/setup.sh; CUDA found
# and architectures chosen by setup.py itself), import (`import torch_replay, inductor_pass` in
# a fresh process, the extension loaded), tests (pytest -n 2 as scripts/run_tests.sh, with
# -p no:cacheprovider, never stopping at the first failure), compile smoke
# (`torch.compile(m, backend="torch_replay")` in a fresh process, forward and backward
# checked against eager), and with --gpu-check `scripts/gpu_check.sh --dry-run`.
# The last line printed is one row of benchmarks/results/torch_versions.md (also in
# row.md). Exit status: 0 when every step passed, 1 otherwise.
# The whole script is one block, read before it runs: editing this file while a lane runs
# (they take a while) cannot change the running one.
{
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

ARGS="$*"
VERSION=""
GPU_CHECK=0
TESTS=1
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu-check) GPU_CHECK=1; shift ;;
    --no-tests) TESTS=0; shift ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "torch_lane.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$VERSION" ] || { echo "torch_lane.sh: one VERSION only" >&2; exit 2; }
       VERSION="$1"; shift ;;
  esac
done
[ -n "$VERSION" ] || { echo "usage: bash scripts/torch_lane.sh VERSION [--gpu-check] [--no-tests] [-- PYTEST_ARGS...]" >&2; exit 2; }

LANE_HOME="${TORCH_LANE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_replay/lanes}"
LANE="$LANE_HOME/torch-$VERSION"
VENV="${TORCH_LANE_VENV:-$LANE/venv}"
SRC="$LANE/src"
PY="$VENV/bin/python"
mkdir -p "$LANE"
case "$LANE" in "$ROOT"/*) echo "torch_lane.sh: the lane must live outside the checkout ($LANE)" >&2; exit 2 ;; esac
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
T0=$SECONDS
log() { echo "[torch_lane $VERSION] $* [$((SECONDS - T0)) s]"; }
# Runs the Python code on stdin with the lane's interpreter in a fresh process outside the
# tree, its output in LOG; prints "pass", or "fail: " and the last line of LOG that
# PATTERN (grep -E) matches.
in_fresh_python() {
  if (cd /tmp && "$PY" -) >"$1" 2>&1; then
    echo pass
  else
    echo "fail: $(grep -E "$2" "$1" | tail -1 | cut -c1-200)"
  fi
}
# Results files (this table among them) are not the code the row is about.
COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!benchmarks/results' 2>/dev/null || echo '+dirty')"
CMD="bash scripts/torch_lane.sh $ARGS"

BUILD=fail IMPORT="not run" TESTS_CELL="not run" SMOKE="not run" GPU="not run" TORCH="$VERSION"
row() {
  local gpu_cell=""
  [ "$GPU_CHECK" = 1 ] && gpu_cell=" gpu_check --dry-run: $GPU;"
  printf '| %s | %s | %s | %s | %s | `%s`;%s %s, %s |\n' "$TORCH" "$BUILD" "$IMPORT" "$TESTS_CELL" \
    "$SMOKE" "$CMD" "$gpu_cell" "$(date -u +%Y-%m-%d)" "$COMMIT" | tee "$LANE/row.md"
}
finish() {
  row
  # Each cell starts with its state ("pass: 3 passed, 0 failed" is a pass).
  local cell
  for cell in "$BUILD" "$IMPORT" "$TESTS_CELL" "$SMOKE" "${GPU:-}"; do
    case "$cell" in fail*|error*) exit 1 ;; esac
  done
  exit 0
}

# 1. The environment: torch==VERSION and the dev pins that go with it (made once).
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$VERSION' else 1)" 2>/dev/null; then
  [ -x "$PY" ] || { log "creating $VENV"; python3 -m venv "$VENV" || finish; }
  log "installing torch==$VERSION into $VENV"
  extra=()
  [ "$VERSION" = 2.14.1 ] && extra=("torchvision==0.29.1")
  "$PY" -m pip install -q --no-compile "torch==$VERSION" "${extra[@]}" || { BUILD="fail (torch==$VERSION did not install)"; finish; }
fi
TORCH="$("$PY" -c 'import torch; print(torch.__version__)')"
echo "torch==$VERSION" >"$LANE/constraints.txt"
stamp="$VENV/.torch_lane_requirements"
if [ ! -f "$stamp" ] || [ requirements-dev.txt -nt "$stamp" ]; then
  log "installing requirements-dev.txt (constraint torch==$VERSION)"
  "$PY" -m pip install -q --no-compile -r requirements-dev.txt -c "$LANE/constraints.txt" \
    || { BUILD="fail (requirements-dev.txt does not install beside torch $VERSION)"; finish; }
  touch "$stamp"
fi

# 2. The working tree, copied (tracked and untracked-not-ignored files; mtimes kept, so ninja
#    rebuilds only what changed). Files gone from the tree since the last copy are removed.
mkdir -p "$SRC"
git ls-files -co --exclude-standard | sort >"$LANE/files.new"
[ -f "$LANE/files" ] && comm -23 "$LANE/files" "$LANE/files.new" | (cd "$SRC" && xargs -r -d '\n' rm -f --)
tr '\n' '\0' <"$LANE/files.new" | xargs -0 -r ls -d 2>/dev/null | tar -cf - -T - | (cd "$SRC" && tar -xf -)
mv "$LANE/files.new" "$LANE/files"

# 3. Build without build isolation, against the lane's torch, as scripts/setup.sh does: the
#    package registered with `pip install --no-build-isolation -e .` (redone when its
#    description changes), the extension built in place by `setup.py build_ext` (ninja keeps
#    src/build/ between runs: only what changed is rebuilt; a pip build would start afresh
#    in a temporary folder each time). No CUDA_HOME or TORCH_CUDA_ARCH_LIST is set here:
#    setup.py finds what a CUDA torch needs.
t=$SECONDS
: >"$LANE/build.log"
reg="$LANE/.registered"
if [ ! -f "$reg" ] || [ "$SRC/pyproject.toml" -nt "$reg" ] || [ "$SRC/setup.py" -nt "$reg" ] \
   || ! "$PY" -m pip show -q torch_replay >/dev/null 2>&1; then
  log "registering (pip install --no-build-isolation --no-deps -e .)"
  (cd "$SRC" && TORCH_REPLAY_SKIP_EXT=1 "$PY" -m pip install --no-build-isolation --no-deps -e .) \
    >>"$LANE/build.log" 2>&1 && touch "$reg"
fi
log "building (setup.py build_ext --inplace)"
if [ -f "$reg" ] && (cd "$SRC" && "$PY" setup.py build_ext --inplace) >>"$LANE/build.log" 2>&1; then
  BUILD="pass ($((SECONDS - t)) s, $(cd "$SRC" && "$PY" -c 'import json; b = json.load(open("torch_replay/_build_info.json")); print("CUDA kernels" if b["with_cuda"] else "CPU only")' 2>/dev/null || echo '?'))"
else
  BUILD="fail (see $LANE/build.log)"
  tail -30 "$LANE/build.log"
  finish
fi
log "build: $BUILD"

# 4. Import, in a fresh process outside the tree (the editable install resolves to src/).
IMPORT="$(in_fresh_python "$LANE/import.log" . <<'EOF'
import torch_replay, inductor_pass
from torch_replay._ext import require_extension
require_extension()
EOF
)"
log "import: $IMPORT"

# 5. The test suite, as scripts/run_tests.sh runs pytest, all failures reported.
if [ "$TESTS" = 1 ]; then
  log "pytest (log: $LANE/tests.log)"
  export TORCHINDUCTOR_CACHE_DIR="$LANE/inductor_cache" TRITON_CACHE_DIR="$LANE/triton_cache"
  (cd "$SRC" && "$PY" -m pytest -q -rfE -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder \
    --junitxml="$LANE/junit.xml" tests "${PYTEST_ARGS[@]}") >"$LANE/tests.log" 2>&1
  rc=$?
  TESTS_CELL="$("$PY" - "$LANE/junit.xml" "$rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET

path, rc = sys.argv[1], int(sys.argv[2])
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError):
    print(f"error (pytest exit {rc}, no junit report)")
    sys.exit()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
failed = n["failures"] + n["errors"]
state = "pass" if rc == 0 else f"fail (pytest exit {rc})"
print(f"{state}: {passed} passed, {failed} failed, {n['skipped']} skipped")
EOF
)"
  grep -E '^(FAILED|ERROR) ' "$LANE/tests.log" | head -40
  log "tests: $TESTS_CELL"
fi

# 6. The compile backend, in a fresh process: forward and gradients equal eager's.
SMOKE="$(in_fresh_python "$LANE/compile_smoke.log" '^[A-Za-z_.]*(Error|Exception)' <<'EOF'
import torch
import torch_replay  # noqa: F401  (the entry point registers the backend too)

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
x = torch.randn(4, 16)
ref = m(x)
ref.sum().backward()
grads = [p.grad.clone() for p in m.parameters()]
m.zero_grad()
out = torch.compile(m, backend="torch_replay")(x)
out.sum().backward()
torch.testing.assert_close(out, ref)
for p, g in zip(m.parameters(), grads):
    torch.testing.assert_close(p.grad, g)
print("compile smoke: ok under torch", torch.__version__)
EOF
)"
log "compile smoke: $SMOKE"

# 7. Optionally, the GPU check's dry run (its CPU parts) on this torch.
if [ "$GPU_CHECK" = 1 ]; then
  log "scripts/gpu_check.sh --dry-run (log: $LANE/gpu_check.log)"
  if (cd "$SRC" && PYTHON="$PY" bash scripts/gpu_check.sh --dry-run --out "$LANE/gpu_check") \
    >"$LANE/gpu_check.log" 2>&1; then
    GPU=pass
  else
    GPU="fail (see $LANE/gpu_check/summary.md)"
  fi
  log "gpu_check --dry-run: $GPU"
fi
finish
}
