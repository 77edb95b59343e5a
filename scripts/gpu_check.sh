#!/usr/bin/env bash
# One prepared run of every CUDA path of torch_replay on a bare GPU machine
# (an H200 with its own torch, nvcc, CUPTI; no apt, no network), stopping
# itself inside 8 minutes. What the machine lacks travels in gpu_bundle/
# (bash scripts/gpu_bundle.sh; device tool: carry ["gpu_bundle"]).
#
#   bash scripts/gpu_check.sh [--dry-run] [--out DIR] [--bundle DIR] [--limit-s 470]
#                             [--only STEP,...] [--budget STEP=S]...
#
# --out: results folder (default: $OUT when set, else out/gpu_check). Every
# step writes DIR/<step>.md and .json (plus its own files) and its log under
# DIR/logs/; DIR/summary.md / summary.json are rewritten after every step, so
# a cut run keeps what finished. A failed step is recorded and the next runs.
# --dry-run: no GPU; everything that can run here runs (CPU build, CPU paths,
# reduced calibration on configs/cpu_dry_run.yaml, the Inductor pass on CPU) and the
# GPU-only parts are recorded as skipped with the reason. CI runs it
# (scripts/run_tests.sh). Exit status: 0 when no step failed or timed out.
# --only: run just these steps (the others are recorded as not run).
# --budget STEP=S: another time box for one step (repeatable; S may have up to
# three decimals, as 0.1).
#
# Time boxes bind on the GPU machine only. There each step runs under
# `timeout` within the overall --limit-s, sized for that machine. A dry run
# runs on whatever machine CI has, often a loaded one: it never stops or skips
# a step for time; a step that runs past its box finishes and is recorded as
# `slow` (not a failure), and only a step still running after GPU_CHECK_HANG_S
# (default 1800 s) is stopped, as hung.
#
# Steps, each time-boxed within the overall limit; expected time on
# the GPU machine (16 cores) and what it reports:
#   probe             ~10 s  torch/CUDA/nvcc/CUPTI/GPU, CUDA_HOME, headers (env.md)
#   bundle            ~5 s   bundle size; test tools installed from its wheels
#   build             ~150 s extension vs the machine's torch, CUDA parts for sm_90
#                            (TORCH_CUDA_ARCH_LIST=9.0); CUDA op registration checked
#   cuda_syntax       dry run only: CUDA adapter syntax-checked vs this torch
#   journal_kernels   ~20 s  nvcc -arch=sm_90 cuda/journal_kernels_test, run
#   pytest_cuda       ~90 s  byte device ops, replay engines and generators on cuda
#                            (tests/test_ops.py, test_cuda_paths.py,
#                            test_kernel_timing.py) and every `cuda`-marked test;
#                            without a device, only a collection and the skips
#   inductor          ~100 s the pass with its CUDA guard on 3 small models,
#                            inference + training (Triton wrappers, CUPTI times)
#   calibrate         ~40 s  configs/h100.yaml --reduced (4 shapes + the model)
#   bench_checkpoint  ~30 s  checkpoint overhead vs torch.utils.checkpoint on cuda
#   ctest             ~90 s  the C++ core's GoogleTest suite (bundled Boost and
#                            GoogleTest); skipped when too little time is left
set -uo pipefail
cd "$(dirname "$0")/.."
set -a; . ./build.env; set +a  # the build, described once (C++ standards, flags, Boost)
ROOT="$PWD"

DRY=0
OUT_DIR="${OUT:-out/gpu_check}"
BUNDLE=""
LIMIT_S=470
ONLY=""
BUDGETS=" "
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --budget) BUDGETS+="$2 "; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --limit-s) LIMIT_S="$2"; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR/logs"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
if [ -z "$BUNDLE" ] && [ -d "$ROOT/gpu_bundle" ]; then BUNDLE="$ROOT/gpu_bundle"; fi
[ -n "$BUNDLE" ] && BUNDLE="$(cd "$BUNDLE" 2>/dev/null && pwd || echo "$BUNDLE")"
VENV="${TORCH_REPLAY_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"
elif python3 -c 'import torch' 2>/dev/null; then PY="$(command -v python3)"
else PY="$(command -v python || command -v python3)"; fi
NPROC="$(nproc)"
START=$SECONDS
export DRY OUT_DIR WORK BUNDLE PY NPROC ROOT
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
ORDER="probe,bundle,build,cuda_syntax,journal_kernels,pytest_cuda,inductor,calibrate,bench_checkpoint,ctest"

# ----------------------------------------------------------------- helpers
note() { echo "$*" >"$WORK/$STEP.note"; }        # one line for the summary
skip() { note "$*"; exit 77; }                     # a step skipped with its reason
envs() { [ -f "$WORK/env.sh" ] && . "$WORK/env.sh"; return 0; }
bundle_dir() { cat "$WORK/bundle.path" 2>/dev/null || echo "$BUNDLE"; }
export -f note skip envs bundle_dir
now_ms() { local t="${EPOCHREALTIME/[.,]/}"; echo $((10#$t / 1000)); }
# "12" -> 12000, "0.1" -> 100: a time box in whole milliseconds.
to_ms() { local i="${1%%.*}" f=""; [ "$i" != "$1" ] && f="${1#*.}"; f="${f}000"
          echo $((10#${i:-0} * 1000 + 10#${f:0:3})); }
# 1500 -> "1.500": what `timeout` and the report take.
ms_s() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# step NAME BUDGET_S MIN_S EXPECTED: runs step_NAME, records it. On the GPU
# machine the step runs under `timeout` (its budget, or what is left of the
# limit); in a dry run it is never cut for time (see the header).
step() {
  local name="$1" budget="$2" min="$3" expected="$4" left t t0 rc status msg over took
  case ",${ONLY:-,$name,}," in *",$name,"*) ;; *) return 0 ;; esac
  over="$(echo "$BUDGETS" | grep -o " $name=[^ ]*" | tail -1 | cut -d= -f2)"
  [ -n "$over" ] && budget="$over"
  if ! [[ "$budget" =~ ^[0-9]+(\.[0-9]{1,3})?$ ]]; then
    echo "gpu_check.sh: --budget $name=$budget is not a number of seconds (as 12 or 0.5)" >&2
    exit 2
  fi
  left=$((LIMIT_S - (SECONDS - START) - 8))
  rm -f "$WORK/$name.note"
  t0=$(now_ms)
  if [ "$DRY" = 0 ] && [ "$left" -lt "$min" ]; then
    status=skipped
    msg="out of time: ${left} s left of the ${LIMIT_S} s limit, the step needs ${min} s"
  else
    if [ "$DRY" = 1 ]; then
      t="${GPU_CHECK_HANG_S:-1800}"
      echo "== $name (time box ${budget} s on the GPU machine, not enforced here; $((SECONDS - START)) s elapsed)"
    else
      t=$(to_ms "$budget"); [ "$t" -gt $((left * 1000)) ] && t=$((left * 1000))
      t=$(ms_s "$t")
      echo "== $name (up to ${t} s; $((SECONDS - START)) s elapsed)"
    fi
    STEP="$name" timeout --kill-after=5 "$t" bash -c "set -uo pipefail; step_$name" \
      >"$OUT_DIR/logs/$name.log" 2>&1
    rc=$?
    took=$(($(now_ms) - t0))
    case "$rc" in
      0) status=pass ;;
      77) status=skipped ;;
      124|137) status=timeout ;;
      *) status=fail ;;
    esac
    msg="$(cat "$WORK/$name.note" 2>/dev/null || true)"
    if [ "$status" = timeout ] && [ "$DRY" = 1 ]; then
      msg="stopped after ${t} s as hung (GPU_CHECK_HANG_S). $msg"
    elif [ "$status" = timeout ]; then
      msg="stopped after ${t} s (time box). $msg"
    elif [ "$status" = pass ] && [ "$DRY" = 1 ] && [ "$took" -gt "$(to_ms "$budget")" ]; then
      status=slow
      msg="took $(ms_s "$took") s, past its ${budget} s time box for the GPU machine (not enforced in a dry run). $msg"
    fi
    [ "$status" = fail ] && [ -z "$msg" ] && msg="exit status $rc: see logs/$name.log"
    [ "$status" = fail ] && [ -n "$msg" ] && msg="exit status $rc: $msg"
  fi
  took=$(($(now_ms) - t0))
  echo "   $name: $status ($(ms_s "$took") s) $msg"
  "$PY" scripts/gpu_check_report.py record --out "$OUT_DIR" --name "$name" --status "$status" \
    --seconds "$(ms_s "$took")" --budget "$budget" --expected "$expected" --note "$msg" \
    || echo "   (could not record $name)"
  "$PY" scripts/gpu_check_report.py summary --out "$OUT_DIR" --order "$ORDER" \
    $([ "$DRY" = 1 ] && echo --dry-run) >/dev/null 2>&1 || true
}

# ------------------------------------------------------------------- steps
step_probe() {
  "$PY" scripts/gpu_check_report.py probe --out "$OUT_DIR" --work "$WORK" \
    --env-sh "$WORK/env.sh" --note-file "$WORK/$STEP.note" $([ "$DRY" = 1 ] && echo --dry-run)
}

step_bundle() {
  local b
  b="$(bundle_dir)"
  if [ -z "$b" ] || [ ! -d "$b" ]; then
    if [ "$DRY" = 1 ]; then
      echo "no bundle given: making one in the scratch folder (checks scripts/gpu_bundle.sh)"
      bash scripts/gpu_bundle.sh --out "$WORK/bundle" || { note "scripts/gpu_bundle.sh failed"; return 1; }
      b="$WORK/bundle"
    else
      note "no bundle: make it with bash scripts/gpu_bundle.sh and carry gpu_bundle (or pass --bundle DIR)"
      return 1
    fi
  fi
  echo "$b" >"$WORK/bundle.path"
  cp "$b/MANIFEST.md" "$OUT_DIR/bundle_manifest.md" 2>/dev/null
  [ -f "$b/boost/include/boost/graph/boykov_kolmogorov_max_flow.hpp" ] \
    || { note "bundle $b has no Boost.Graph headers: remake it with bash scripts/gpu_bundle.sh"; return 1; }
  local missing=()
  for mod in pytest hypothesis; do
    "$PY" -c "import $mod" 2>/dev/null || missing+=("$mod")
  done
  "$PY" -c "import setuptools" 2>/dev/null || missing+=(setuptools)
  local size
  size="$(du -sb "$b" | awk '{ printf "%.1f", $1 / 1048576 }')"
  if [ ${#missing[@]} -eq 0 ]; then
    note "bundle ${size} MiB at $b; pytest, hypothesis and setuptools already importable"
    return 0
  fi
  # Wheels are zip files: unpacking them onto PYTHONPATH needs no pip and no network.
  mkdir -p "$WORK/site"
  for whl in "$b"/wheels/*.whl; do
    # Never shadow the machine's own setuptools (torch's build needs its distutils shim).
    case "$(basename "$whl")" in
      setuptools-*|wheel-*) [[ " ${missing[*]} " == *" setuptools "* ]] || continue ;;
    esac
    "$PY" -m zipfile -e "$whl" "$WORK/site" || { note "cannot unpack $whl"; return 1; }
  done
  echo "export PYTHONPATH=\"$WORK/site:\$PYTHONPATH\"" >>"$WORK/env.sh"
  envs
  "$PY" -c "import pytest, hypothesis, setuptools; print('pytest', pytest.__version__)" \
    || { note "bundled wheels do not import with $("$PY" --version)"; return 1; }
  note "bundle ${size} MiB at $b; installed from its wheels: ${missing[*]}"
}

step_build() {
  envs
  local b
  b="$(bundle_dir)"
  [ -n "$b" ] && export CPLUS_INCLUDE_PATH="$b/boost/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  if [ "$DRY" = 1 ] && "$PY" - <<'EOF'
import glob, os, sys
import torch
import torch_replay._C as C
built = os.path.getmtime(C.__file__)
srcs = glob.glob("csrc/**/*", recursive=True) + ["setup.py", "build.env"]
if torch.version.cuda:  # a CPU build compiles neither cuda/ nor csrc/aten/cuda/
    srcs += glob.glob("cuda/*")
else:
    srcs = [s for s in srcs if not s.startswith("csrc/aten/cuda/")]
sys.exit(0 if all(os.path.getmtime(s) < built for s in srcs if os.path.isfile(s)) else 1)
EOF
  then
    note "CPU extension up to date (built by scripts/setup.sh against torch $("$PY" -c 'import torch; print(torch.__version__)')); not rebuilt"
    return 0
  fi
  export MAX_JOBS="${MAX_JOBS:-$NPROC}"
  [ "$DRY" = 1 ] || export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  local t0=$SECONDS
  "$PY" setup.py build_ext --inplace || { note "setup.py build_ext failed after $((SECONDS - t0)) s: see logs/build.log"; return 1; }
  "$PY" - "$DRY" "$((SECONDS - t0))" "$OUT_DIR/build_result.json" "$WORK/$STEP.note" <<'EOF'
import json, os, sys
import torch
import torch_replay._C as C

dry, seconds, out, note = sys.argv[1] == "1", int(sys.argv[2]), sys.argv[3], sys.argv[4]
has = {
    k: torch._C._dispatch_has_kernel_for_dispatch_key("torch_replay::gather_ranges", k)
    for k in ("CPU", "CUDA")
}
doc = {
    "seconds": seconds,
    "torch": torch.__version__,
    "so": os.path.basename(C.__file__),
    "so_mib": round(os.path.getsize(C.__file__) / 2**20, 1),
    "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
    "kernels": has,
}
json.dump(doc, open(out, "w"), indent=1)
print(doc)
with open(note, "w") as f:
    f.write(
        f"built in {seconds} s against torch {torch.__version__}, TORCH_CUDA_ARCH_LIST="
        f"{doc['arch_list']}, _C {doc['so_mib']} MiB; CPU kernels {has['CPU']}, "
        f"CUDA kernels {has['CUDA']}\n"
    )
if not dry and not has["CUDA"]:
    print("error: the extension has no CUDA kernels: was CUDA_HOME found? see env.md", file=sys.stderr)
    sys.exit(1)
EOF
}

step_cuda_syntax() {
  [ "$DRY" = 1 ] || skip "the build compiled the CUDA adapter with nvcc/g++ for real"
  envs
  local inc
  inc="$("$PY" -c 'import os, sysconfig, torch.utils.cpp_extension as ce
h = os.environ.get("CUDA_HOME") or ""
print(" ".join("-I" + p for p in ce.include_paths()), "-I" + sysconfig.get_paths()["include"],
      "-I" + os.path.join(h, "include") if h else "")')"
  [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] \
    || skip "no CUDA runtime headers here (nvcc/CUDA_HOME not found): nothing to check against"
  local f failed=()
  for f in csrc/aten/cuda/*.cpp; do
    echo "-- g++ -fsyntax-only $f"
    # C10_CUDA_NO_CMAKE_CONFIGURE_FILE: a CPU torch lacks c10/cuda's generated macros header.
    g++ -std="c++$CXX_STANDARD" -fsyntax-only -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -DTORCH_REPLAY_WITH_CUDA=1 \
      -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C $inc -Icsrc -Icuda "$f" \
      || failed+=("$f")
  done
  if [ ${#failed[@]} -gt 0 ]; then note "does not compile: ${failed[*]}"; return 1; fi
  note "csrc/aten/cuda/*.cpp compile (syntax) against torch $("$PY" -c 'import torch; print(torch.__version__)') headers and $CUDA_HOME"
}

step_journal_kernels() {
  envs
  command -v nvcc >/dev/null || skip "nvcc not found (see env.md)"
  # The first architecture of TORCH_CUDA_ARCH_LIST (default 9.0: H100/H200) as sm_XY.
  local bin="$WORK/journal_kernels_test" arch
  arch="sm_$(echo "${TORCH_CUDA_ARCH_LIST:-9.0}" | tr ' ;' '\n\n' | head -1 | tr -d '.' | sed 's/+PTX//')"
  nvcc -std="c++$CXX_STANDARD" "$OPT_LEVEL" -arch="$arch" -Icuda cuda/journal_kernels.cu cuda/journal_kernels_test.cu -o "$bin" \
    || nvcc -std="c++$CXX_STANDARD" "$OPT_LEVEL" -arch="$arch" -cudart shared -Icuda cuda/journal_kernels.cu \
      cuda/journal_kernels_test.cu -o "$bin" \
    || { note "nvcc -arch=$arch failed: see logs/journal_kernels.log"; return 1; }
  "$bin" | tee "$OUT_DIR/journal_kernels_output.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 77 ] && skip "compiled for $arch; not run: no CUDA device here"
  [ "$rc" -eq 0 ] && note "compiled for $arch and passed: $(tail -1 "$OUT_DIR/journal_kernels_output.txt")"
  return "$rc"
}

step_pytest_cuda() {
  envs
  local rc1 rc2 files=(tests/test_ops.py tests/test_cuda_paths.py tests/test_kernel_timing.py)
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    # No CUDA device: the device files hold only their CPU cases here, which the main
    # pytest already ran (scripts/run_tests.sh). One collection of every test (the
    # device files included: a collection error fails the step) runs just the
    # `cuda`-marked tests, each of which must skip with its reason; no CPU work again.
    "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests --junitxml="$WORK/marked.xml"
    rc1=$?
    local counts
    counts="$("$PY" scripts/gpu_check_report.py junit --out "$OUT_DIR" --name pytest_cuda \
      "$WORK/marked.xml")"
    note "cpu only: ${files[*]} collected, their CPU cases not re-run (the main pytest ran \
them); \`cuda\`-marked tests: $counts (pytest_cuda_tests.md)"
    # Without a device every `cuda`-marked test skips (tests/conftest.py); one that ran is a
    # marker that no longer keeps CPU work out of this step.
    [ "$rc1" -eq 0 ] && "$PY" -c 'import json, sys; c = json.loads(sys.argv[1])
sys.exit(0 if c["skipped"] and c["skipped"] == sum(c.values()) else 1)' "$counts"
    return
  fi
  "$PY" -m pytest -q -rfEs -p no:cacheprovider "${files[@]}" --junitxml="$WORK/devices.xml"
  rc1=$?
  "$PY" -m pytest -q -rfEs -p no:cacheprovider -m cuda tests --ignore=tests/test_ops.py \
    --ignore=tests/test_cuda_paths.py --ignore=tests/test_kernel_timing.py \
    --junitxml="$WORK/marked.xml"
  rc2=$?
  [ "$rc2" -eq 5 ] && rc2=0  # every `cuda` test deselected is not a failure
  local counts
  counts="$("$PY" scripts/gpu_check_report.py junit --out "$OUT_DIR" --name pytest_cuda \
    "$WORK/devices.xml" "$WORK/marked.xml")"
  note "cuda + cpu; $counts (pytest_cuda_tests.md)"
  [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]
}

step_inductor() {
  envs
  if [ "$DRY" = 1 ]; then
    "$PY" -m benchmarks.bench_inductor_device --device cpu --size tiny --models block \
      --budget-s 40 --out "$OUT_DIR"
  else
    "$PY" -m benchmarks.bench_inductor_device --device cuda --size small --budget-s 100 \
      --out "$OUT_DIR"
  fi
  local rc=$?
  local dev=cuda
  [ "$DRY" = 1 ] && dev=cpu
  note "$(grep -E '^Runs:' "$OUT_DIR/inductor_$dev.md" 2>/dev/null || echo 'no result table') (inductor_$dev.md)$([ "$DRY" = 1 ] && echo '; CUDA guard and Triton wrappers: GPU only')"
  return $rc
}

step_calibrate() {
  envs
  if [ "$DRY" = 1 ]; then
    "$PY" -m torch_replay.calibrate --config configs/h100.yaml --reduced --dry-run \
      >"$OUT_DIR/calibrate_h100_plan.txt" || { note "configs/h100.yaml --reduced does not validate"; return 1; }
    "$PY" -m torch_replay.calibrate --config configs/cpu.yaml --reduced --dry-run \
      >"$OUT_DIR/calibrate_cpu_plan.txt" || { note "configs/cpu.yaml --reduced does not validate"; return 1; }
    # The smallest sizes that still take every path (grid and model, all five options,
    # sparse and dense writes, one and several live versions): the dry run proves the
    # step runs end to end; the figures are not the point (configs/cpu.yaml's are).
    "$PY" -m torch_replay.calibrate --config configs/cpu_dry_run.yaml --reduced --no-progress \
      --out "$OUT_DIR/calibrate_cpu.json" --summary "$OUT_DIR/calibrate_cpu.md" || return 1
    note "configs/h100.yaml and configs/cpu.yaml --reduced validated (calibrate_*_plan.txt); configs/cpu_dry_run.yaml --reduced measured on CPU (calibrate_cpu.md); the H100 grid needs a GPU"
  else
    "$PY" -m torch_replay.calibrate --config configs/h100.yaml --reduced --no-progress \
      --out "$OUT_DIR/calibrate_h100.json" --summary "$OUT_DIR/calibrate_h100.md" || return 1
    note "configs/h100.yaml --reduced on $("$PY" -c 'import torch; print(torch.cuda.get_device_name())'); kernel times: $(grep -o '(cupti)\|(cuda-events)\|(wall)' "$OUT_DIR/calibrate_h100.md" | sort | uniq -c | tr -s ' \n' ' ')(calibrate_h100.md)"
  fi
}

step_bench_checkpoint() {
  envs
  local dev=cuda args=(--reps 10)
  [ "$DRY" = 1 ] && dev=cpu && args=(--reps 1 --width 256)
  "$PY" -m benchmarks.bench_checkpoint overhead --device "$dev" "${args[@]}" \
    --json "$OUT_DIR/bench_checkpoint_$dev.json" --out "$OUT_DIR/bench_checkpoint_$dev.md" || return 1
  note "$dev, torch_replay vs torch.utils.checkpoint: $(grep -E '^\| use_reentrant' \
    "$OUT_DIR/bench_checkpoint_$dev.md" | awk -F'|' '{ gsub(/ /, ""); printf "%s time ratio %s, peak ratio %s; ", $2, $5, $6 }')(bench_checkpoint_$dev.md)"
}

step_ctest() {
  envs
  local b
  b="$(bundle_dir)"
  [ -n "$b" ] && [ -d "$b/boost/include" ] || { note "no bundle (see the bundle step)"; return 1; }
  # The core is torch-free: no LibTorch lookup (a CUDA torch's CMake files want a full toolkit).
  local boost=(-DBOOST_ROOT="$b/boost" -DBoost_NO_SYSTEM_PATHS=ON -DBoost_NO_BOOST_CMAKE=ON
    -DTORCH_REPLAY_WITH_TORCH=OFF)
  if [ "$DRY" = 1 ]; then
    # CTest itself runs in scripts/run_tests.sh here; check that CMake finds the bundled Boost.
    cmake -S . -B "$WORK/cmake" -DTORCH_REPLAY_TESTS=OFF "${boost[@]}" \
      || { note "CMake does not find the bundled Boost"; return 1; }
    grep -q "Boost_INCLUDE_DIR:PATH=$b/boost/include" "$WORK/cmake/CMakeCache.txt" \
      || { note "CMake found a Boost outside the bundle"; return 1; }
    skip "configure only: CMake finds the bundled Boost; CTest runs in scripts/run_tests.sh here"
  fi
  cmake -S "$b/googletest" -B "$WORK/gtest-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
    -DCMAKE_INSTALL_PREFIX="$WORK/gtest" >/dev/null \
    && cmake --build "$WORK/gtest-build" -j "$NPROC" >/dev/null \
    && cmake --install "$WORK/gtest-build" >/dev/null \
    || { note "GoogleTest from the bundle did not build"; return 1; }
  cmake -S . -B "$WORK/cmake" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/gtest" \
    "${boost[@]}" \
    && cmake --build "$WORK/cmake" -j "$NPROC" \
    || { note "the C++ core or its tests did not build"; return 1; }
  ctest --test-dir "$WORK/cmake" --output-on-failure -j "$NPROC" --output-junit "$WORK/ctest.xml"
  local rc=$?
  note "$("$PY" scripts/gpu_check_report.py junit --out "$OUT_DIR" --name ctest "$WORK/ctest.xml") (ctest_tests.md)"
  return $rc
}
export -f step_probe step_bundle step_build step_cuda_syntax step_journal_kernels \
  step_pytest_cuda step_inductor step_calibrate step_bench_checkpoint step_ctest

# -------------------------------------------------------------------- run
echo "gpu_check: $([ "$DRY" = 1 ] && echo 'dry run' || echo 'GPU run'), results in $OUT_DIR, limit ${LIMIT_S} s, python $PY"
for s in ${ORDER//,/ } summary env; do rm -f "$OUT_DIR/$s.json" "$OUT_DIR/$s.md"; done
#    name             budget min expected on the GPU machine
step probe            30     10  "~10 s"
step bundle           60     5   "~5 s"
step build            300    60  "~150 s (16 cores)"
step cuda_syntax      90     20  "skipped (the build compiles it)"
step journal_kernels  60     15  "~20 s"
step pytest_cuda      150    30  "~90 s"
step inductor         130    40  "~100 s"
step calibrate        120    20  "~40 s"
step bench_checkpoint 60     15  "~30 s"
step ctest            150    60  "~90 s, if time is left"
"$PY" scripts/gpu_check_report.py summary --out "$OUT_DIR" --order "$ORDER" \
  $([ "$DRY" = 1 ] && echo --dry-run)
rc=$?
echo "gpu_check: $((SECONDS - START)) s; summary in $OUT_DIR/summary.md"
exit $rc
