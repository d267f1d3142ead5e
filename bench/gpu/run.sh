#!/usr/bin/env bash
# The one prepared script for a GPU machine (one H200, 15 minutes of device time in all):
# configure with CUDA, build the GPU tests and benchmarks, run them, and leave every result under $OUT.
# Usage (from the repository root): OUT=/some/dir bash bench/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/bench/results/gpu}"
mkdir -p "$OUT"
log="$OUT/run.log"
exec > >(tee -a "$log") 2>&1

echo "== machine =="; date -u; nvidia-smi -L || true; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
export PATH="/usr/local/cuda/bin:$PATH"
command -v cmake >/dev/null || { echo "cmake missing: trying scripts/setup.sh"; bash scripts/setup.sh || true; }

build=build/gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETMESH_WITH_NCCL=ON \
  -DHETMESH_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90 || exit 1
# Only what the GPU checks need: the targets of tests labelled gpu, and the GPU benchmarks.
gpu_targets=$(cd "$build" && ctest -N -L gpu | awk '/Test +#/ {print $3}' | sed 's/_mpi$//' | sort -u)
bench_targets=$(ninja -C "$build" -t targets all | awk -F: '/^bench_gpu[^ ]*:/ {print $1}' | sort -u)
echo "gpu test targets: $gpu_targets"; echo "gpu bench targets: $bench_targets"
cmake --build "$build" -j "$(nproc)" --target $gpu_targets $bench_targets || exit 1

echo "== GPU tests =="
(cd "$build" && ctest -L gpu --output-on-failure --output-junit "$OUT/gpu_tests.xml")
tests_rc=$?

echo "== GPU benchmarks =="
for b in $bench_targets; do
  exe=$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)
  [ -n "$exe" ] || continue
  echo "-- $b"
  timeout 240 "$exe" --out "$OUT/$b.json" || echo "$b exited with $?"
done
echo "tests rc=$tests_rc"
exit $tests_rc
