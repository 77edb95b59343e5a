#!/usr/bin/env bash
# Runs the operator sweep (tests/op_sweep, python -m benchmarks.bench_op_sweep) with an
# AddressSanitizer build of the extension, to find out-of-bounds and use-after-free
# accesses of the observer's bookkeeping.
#
#   bash scripts/asan_sweep.sh [--build-only] [bench_op_sweep.py options, default --quick]
#   ASAN_PARTIAL=1 bash scripts/asan_sweep.sh ...   (instrument the replay machinery only)
#
# The ASan build lives in build-asan/ (TORCH_REPLAY_ASAN=1, -O1 -g, see setup.py) and
# never replaces torch_replay/_C*.so: the sweep runs from a copy of the package in
# build-asan/pkg. Only the extension is instrumented; libasan is preloaded into
# python (torch itself is not instrumented, but its heap is ASan's), with libstdc++ (else
# ASan's __cxa_throw interceptor finds no real __cxa_throw: python does not link
# libstdc++, and its CHECK fails at the first C++ exception), leaks are not
# reported (python and torch keep memory on purpose). The ASan log goes to
# build-asan/asan.<pid>; the script prints it and fails if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${TORCH_REPLAY_VENV:-.venv}/bin/python"
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
set -a; . ./build.env; set +a  # the build, described once (ASAN_FLAGS, OPT_LEVEL)
OUT="$PWD/build-asan"
mkdir -p "$OUT"
if [ "${ASAN_PARTIAL:-0}" = "1" ]; then
  # Instrument only the replay machinery (the observer, the transaction, tensor bytes,
  # the region store and journal, the preservation engines); every other object (the
  # planner, the schedule, the other bindings) is the normal build's, which must exist:
  # `python setup.py build_ext --inplace` first. Much faster to build on a busy machine.
  NORMAL="$(ls -d build/temp.* | head -1)"
  [ -f "$NORMAL/build.ninja" ] || { echo "no normal build in build/temp.*"; exit 2; }
  cflags="$(sed -n 's/^cflags = //p' "$NORMAL/build.ninja")"
  post="$(sed -n 's/^post_cflags = //p' "$NORMAL/build.ninja" | sed "s/$OPT_LEVEL//g")"
  asan_sources="csrc/aten/op_observer.cpp csrc/aten/operator_facts.cpp
    csrc/aten/write_watch.cpp csrc/aten/observation_floor.cpp csrc/aten/transaction.cpp
    csrc/aten/transaction_replay.cpp csrc/aten/tensor_bytes.cpp csrc/aten/byte_devices.cpp
    csrc/aten/generator_state.cpp csrc/aten/segment_function.cpp csrc/python/bind_replay.cpp
    csrc/aten/counting_allocator.cpp csrc/core/byte_kernels.cpp csrc/core/byte_ranges.cpp
    csrc/core/preservation_engine.cpp csrc/core/region_journal.cpp
    csrc/core/region_store.cpp csrc/aten/storage_reshape.cpp"
  mkdir -p "$OUT/partial" "$OUT/lib/torch_replay"
  export cflags post OUT
  # shellcheck disable=SC2086
  printf '%s\n' $asan_sources | xargs -P "${MAX_JOBS:-1}" -I{} sh -c \
    'o="$OUT/partial/$(echo {} | tr / _).o"; [ "$o" -nt {} ] ||
     c++ $cflags {} -o "$o" $post $ASAN_FLAGS'
  objs=""
  while IFS= read -r o; do
    rel="${o#"$NORMAL"/}"
    if printf '%s\n' $asan_sources | grep -qx "${rel%.o}.cpp"; then
      o="$OUT/partial/$(echo "${rel%.o}.cpp" | tr / _).o"
    fi
    objs="$objs $o"
  done < <(find "$NORMAL/csrc" -name '*.o' | sort)
  lib="$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  ext="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
  # shellcheck disable=SC2086
  c++ -shared -fsanitize=address $objs -L"$lib" -lc10 -ltorch -ltorch_cpu -ltorch_python \
    -o "$OUT/lib/torch_replay/_C$ext"
  # The instrumented objects must be in: their checks call __asan_report_*.
  symbols="$(nm -D --undefined-only "$OUT/lib/torch_replay/_C$ext")"
  case "$symbols" in
    *__asan_report_load*) ;;
    *) echo "the linked extension has no instrumented object"; exit 2 ;;
  esac
else
  TORCH_REPLAY_ASAN=1 MAX_JOBS="${MAX_JOBS:-1}" "$PY" setup.py -q build_ext \
    --build-temp "$OUT/temp" --build-lib "$OUT/lib"
fi
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
  LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)" \
    ASAN_OPTIONS="detect_leaks=0:log_path=$OUT/asan" \
    "$PY" -m benchmarks.bench_op_sweep "$@")
rc=$?
set -e
if compgen -G "$OUT/asan.*" >/dev/null; then
  cat "$OUT"/asan.*
  echo "AddressSanitizer reported the errors above (logs in $OUT/asan.*)"
  exit 1
fi
echo "AddressSanitizer: no error reported (sweep exit status $rc)"
exit "$rc"
