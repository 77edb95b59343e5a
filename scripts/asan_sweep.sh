#!/usr/bin/env bash
# Runs the operator sweep (tests/op_sweep, benchmarks/bench_op_sweep.py) with an
# AddressSanitizer build of the extension, to find out-of-bounds and use-after-free
# accesses of the observer's bookkeeping.
#
#   bash scripts/asan_sweep.sh [--build-only] [bench_op_sweep.py options, default --quick]
#
# The ASan build lives in build-asan/ (TORCH_REPLAY_ASAN=1, -O1 -g, see setup.py) and
# never replaces torch_replay/_C*.so: the sweep runs from a copy of the package in
# build-asan/pkg. Only the extension is instrumented; libasan is preloaded into
# python (torch itself is not instrumented, but its heap is ASan's), leaks are not
# reported (python and torch keep memory on purpose). The ASan log goes to
# build-asan/asan.<pid>; the script prints it and fails if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${TORCH_REPLAY_VENV:-.venv}/bin/python"
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
OUT="$PWD/build-asan"
mkdir -p "$OUT"
TORCH_REPLAY_ASAN=1 MAX_JOBS="${MAX_JOBS:-1}" "$PY" setup.py -q build_ext \
  --build-temp "$OUT/temp" --build-lib "$OUT/lib"
if [ "${1:-}" = "--build-only" ]; then
  exit 0
fi
rm -rf "$OUT/pkg"
mkdir -p "$OUT/pkg/tests" "$OUT/pkg/benchmarks"
cp -r torch_replay "$OUT/pkg/"
find "$OUT/pkg/torch_replay" -name '_C*.so' -delete
cp "$OUT"/lib/torch_replay/_C*.so "$OUT/pkg/torch_replay/"
cp tests/__init__.py "$OUT/pkg/tests/"
cp -r tests/op_sweep "$OUT/pkg/tests/"
cp benchmarks/bench_op_sweep.py "$OUT/pkg/benchmarks/"
rm -f "$OUT"/asan.*
[ $# -gt 0 ] || set -- --quick
set +e
(cd "$OUT/pkg" &&
  LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
    ASAN_OPTIONS="detect_leaks=0:log_path=$OUT/asan" \
    "$PY" benchmarks/bench_op_sweep.py "$@")
rc=$?
set -e
if compgen -G "$OUT/asan.*" >/dev/null; then
  cat "$OUT"/asan.*
  echo "AddressSanitizer reported the errors above (logs in $OUT/asan.*)"
  exit 1
fi
echo "AddressSanitizer: no error reported (sweep exit status $rc)"
exit "$rc"
