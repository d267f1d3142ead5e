#!/usr/bin/env bash
# Builds hetmesh and runs its tests: the default build (unit, multi-rank on loopback and under mpirun,
# package consumers, heavy sweeps; GPU tests skip without a device), then the ASan+UBSan build.
# Usage: bash scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

jobs=$(nproc)
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

echo "== default build (RelWithDebInfo) =="
cmake --preset default
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"

if [ "${1:-}" != "--no-sanitize" ]; then
  echo "== ASan + UBSan build =="
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
