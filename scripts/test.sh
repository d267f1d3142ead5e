#!/usr/bin/env bash
# Builds hetmesh and runs its tests: the default build (Release, -Werror; unit, multi-rank on loopback
# and under mpirun, examples, package consumers: build tree, install tree, an install of a tree that was
# only configured consumed with no components and with all, add_subdirectory; heavy sweeps; GPU tests
# skip without a device), the API reference (doxygen, warnings as errors), the fuzz targets, then the
# ThreadSanitizer tests (label tsan) and the ASan+UBSan build.
# Compiles through ccache where it is installed.
# Usage: bash scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

jobs=$(nproc)
# ccache keys on paths relative to the checkout, so a fresh clone in another folder (CI) reuses what a
# build of the same sources elsewhere on this machine compiled; the Debug (ASan) flags' -g would
# otherwise hash the build directory too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

echo "== default build (Release) =="
cmake --preset default
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"

echo "== API reference (doxygen; a warning, e.g. an undocumented public name, fails) =="
cmake --build --preset default --target docs

# libFuzzer targets (fuzz/, clang only): each parser of untrusted input for a bounded time; a finding fails.
fuzz_seconds="${HETMESH_FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" != 0 ] && { command -v clang++-14 || command -v clang++; } > /dev/null; then
  echo "== fuzz (libFuzzer + ASan + UBSan, ${fuzz_seconds}s per target) =="
  JOBS="$jobs" bash scripts/fuzz.sh "$fuzz_seconds"
fi

if [ "${1:-}" != "--no-sanitize" ]; then
  # ThreadSanitizer on the threaded tests only (label tsan: loopback comm, data loaders and service,
  # training system): just their three binaries are built, at -O1.
  echo "== ThreadSanitizer (tests labelled tsan) =="
  cmake --preset tsan
  cmake --build --preset tsan -j "$jobs" --target test_comm test_data test_train
  ctest --preset tsan -j "$jobs"

  echo "== ASan + UBSan build =="
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
