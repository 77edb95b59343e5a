#!/usr/bin/env bash
# Makes gpu_bundle/: what a bare GPU machine lacks for scripts/gpu_check.sh,
# in one ignored folder that travels with the tree (the device tool's `carry`,
# 64 MiB at most). Run it here (Debian, with the packages scripts/setup.sh
# installs); it needs no GPU.
#
#   bash scripts/gpu_bundle.sh [--out DIR]     (default: gpu_bundle)
#
# Contents:
#   boost/include/boost/...  the Boost headers csrc/ includes (Boost.Graph's
#                            max-flow and adjacency list), cut to their include
#                            closure; header-only, nothing to build
#   googletest/              GoogleTest sources (built there for CTest)
#   wheels/                  pytest and hypothesis (+ their dependencies) for
#                            Python 3.12, installed there only when missing
#   MANIFEST.md              versions, sizes and the command that made it
#
# The include closure is the union of (1) every file reachable through
# literal #include lines, whatever the #if around them (a superset of what any
# compiler configuration reads), (2) whole directories whose headers are
# reached through computed includes (Boost.MPL preprocessed headers,
# Boost.Preprocessor iteration, Boost.Config, Boost.Typeof) and (3) what
# `g++ -M` reports. The script then checks that g++ -M resolves every Boost
# header of csrc/ inside the bundle and that the min-cut code compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
set -a; . ./build.env; set +a  # the build, described once (C++ standards, flags, Boost)

OUT="gpu_bundle"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY_VERSION="3.12"          # the GPU machine's Python
LIMIT_MIB=64               # what the device tool carries with the tree
BOOST_SRC="${BOOST_INCLUDE:-/usr/include}"
GTEST_SRC="${GTEST_SOURCE:-/usr/src/googletest}"
PIP="${TORCH_REPLAY_VENV:-.venv}/bin/pip"
[ -x "$PIP" ] || PIP="$(command -v pip3 || command -v pip || true)"
log() { echo "[gpu_bundle] $*"; }
die() { echo "[gpu_bundle] error: $*" >&2; exit 1; }

[ -f "$BOOST_SRC/boost/version.hpp" ] \
  || die "no Boost headers in $BOOST_SRC; install libboost-graph-dev (bash scripts/setup.sh) or set BOOST_INCLUDE"
[ -f "$GTEST_SRC/CMakeLists.txt" ] \
  || die "no GoogleTest sources in $GTEST_SRC; install googletest (apt-get install googletest) or set GTEST_SOURCE"
[ -n "$PIP" ] || die "no pip found; run bash scripts/setup.sh first"

rm -rf "$OUT"
mkdir -p "$OUT/boost/include" "$OUT/wheels"

# 1. Boost: the headers csrc/ and cuda/ include, and their closure.
mapfile -t seeds < <(grep -rhoE '^\s*#\s*include\s*<boost/[^>]+>' csrc cuda \
  | sed -E 's/.*<(boost\/[^>]+)>.*/\1/' | sort -u)
[ ${#seeds[@]} -gt 0 ] || die "no Boost include found in csrc/ (nothing to bundle?)"
log "Boost seeds: ${seeds[*]}"
deps="$(mktemp)"
trap 'rm -f "$deps"' EXIT
for std in "c++$CXX_STANDARD" "c++$CXX_STANDARD_TORCH_2_14"; do
  for src in $(grep -rlE '#\s*include\s*<boost/' csrc cuda); do
    g++ -std="$std" -M -Icsrc -Icuda "$src" 2>/dev/null | tr ' \\' '\n\n' \
      | grep -E "^$BOOST_SRC/boost/" | sed "s#^$BOOST_SRC/##" >>"$deps" || true
  done
done
python3 - "$BOOST_SRC" "$OUT/boost/include" "$deps" "${seeds[@]}" <<'EOF'
import os, re, shutil, sys

root, dest, deps_file, *seeds = sys.argv[1:]
literal = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
whole_dirs = ["boost/config", "boost/mpl", "boost/preprocessor", "boost/typeof"]
todo = list(seeds) + ["boost/version.hpp", "boost/config.hpp"]
todo += [line.strip() for line in open(deps_file) if line.strip()]
for d in whole_dirs:
    for base, _, files in os.walk(os.path.join(root, d)):
        todo += [os.path.relpath(os.path.join(base, f), root) for f in files]
seen = set()
while todo:
    p = os.path.normpath(todo.pop())
    if p in seen or not p.startswith("boost/") or not os.path.isfile(os.path.join(root, p)):
        continue
    seen.add(p)
    with open(os.path.join(root, p), errors="replace") as f:
        text = f.read()
    for inc in literal.findall(text):
        todo.append(inc)  # <boost/...>
        todo.append(os.path.join(os.path.dirname(p), inc))  # "relative.hpp"
for p in sorted(seen):
    os.makedirs(os.path.join(dest, os.path.dirname(p)), exist_ok=True)
    shutil.copy2(os.path.join(root, p), os.path.join(dest, p))
print(f"[gpu_bundle] Boost: {len(seen)} headers copied")
EOF

# Check: every Boost header g++ reads now resolves inside the bundle.
inc="$OUT/boost/include"
for std in "c++$CXX_STANDARD" "c++$CXX_STANDARD_TORCH_2_14"; do
  for src in $(grep -rlE '#\s*include\s*<boost/' csrc cuda); do
    outside="$(g++ -std="$std" -M -I"$inc" -Icsrc -Icuda "$src" | tr ' \\' '\n\n' \
      | grep -E '/boost/' | grep -v "^$inc/" || true)"
    [ -z "$outside" ] || die "$src (-std=$std) reads Boost headers outside the bundle: $(echo "$outside" | head -3)"
  done
done
for src in $(grep -rlE '#\s*include\s*<boost/' csrc cuda); do
  g++ -std="c++$CXX_STANDARD" -fsyntax-only -w -I"$inc" -Icsrc -Icuda "$src" \
    || die "$src does not compile against the bundled Boost headers"
done
log "Boost: g++ -M resolves every header of csrc/ inside $inc (c++$CXX_STANDARD, c++$CXX_STANDARD_TORCH_2_14); syntax check passed"

# 2. GoogleTest sources (googletest + googlemock, with their CMake files).
cp -r "$GTEST_SRC" "$OUT/googletest"
rm -rf "$OUT/googletest/.git" "$OUT/googletest/build"

# 3. Test tools for the GPU machine's Python (installed there only if missing).
pytest_pin="$(grep -E '^pytest==' requirements-dev.txt || echo pytest)"
hyp_pin="$(grep -E '^hypothesis==' requirements-dev.txt || echo hypothesis)"
"$PIP" download -q --only-binary=:all: --python-version "$PY_VERSION" \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d "$OUT/wheels" "$pytest_pin" "$hyp_pin" "setuptools<82" wheel \
  || die "pip could not fetch the test wheels for Python $PY_VERSION (is the package index reachable?)"

# 4. Manifest and size.
boost_version="$(sed -nE 's/^#define BOOST_LIB_VERSION "([^"]+)"/\1/p' "$BOOST_SRC/boost/version.hpp")"
gtest_version="$(dpkg-query -W -f='${Version}' googletest 2>/dev/null || echo unknown)"
bytes="$(du -sb "$OUT" | cut -f1)"
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
{
  echo "# gpu_bundle (made by \`bash scripts/gpu_bundle.sh\`, $(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Carried to the GPU machine with the tree (device tool: \`carry: [\"$OUT\"]\`);"
  echo "\`bash scripts/gpu_check.sh\` finds it there. Total: $mib MiB (limit $LIMIT_MIB MiB)."
  echo
  echo "| part | what | size |"
  echo "|---|---|---|"
  echo "| boost/include | Boost $boost_version headers: include closure of ${seeds[*]} ($(find "$OUT/boost" -type f | wc -l) files) | $(du -sh "$OUT/boost" | cut -f1) |"
  echo "| googletest | GoogleTest $gtest_version sources | $(du -sh "$OUT/googletest" | cut -f1) |"
  echo "| wheels | $(cd "$OUT/wheels" && ls | tr '\n' ' ') | $(du -sh "$OUT/wheels" | cut -f1) |"
} >"$OUT/MANIFEST.md"
log "wrote $OUT ($mib MiB; limit $LIMIT_MIB MiB)"
if [ "$bytes" -ge $((LIMIT_MIB * 1048576)) ]; then
  die "$OUT is $mib MiB, over the $LIMIT_MIB MiB the device tool carries"
fi
