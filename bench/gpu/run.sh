#!/usr/bin/env bash
# The one prepared script for a GPU machine (one H200, 15 minutes of device time in all): runs the GPU
# tests, the GPU benchmarks and the GPU example, and leaves every result under $OUT (at most 8 files). The
# per-command limits add up to 560 s, within the device tool's 600 s per call (each ran in seconds before).
# Binaries: build/gpu-pack (bench/gpu/pack.sh, built on a machine with the CUDA toolkit and carried over)
# when present, else built here. NCCL and cuBLAS come from the machine: the CUDA toolkit's folders, the
# dynamic linker's cache, or the Python wheels (nvidia-nccl-cu13, nvidia-cublas).
# Usage (from the repository root): OUT=/some/dir bash bench/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/bench/results/gpu}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

echo "== machine =="; date -u; uname -m
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
export PATH="/usr/local/cuda/bin:$PATH"

pack=build/gpu-pack
if [ ! -d "$pack/bin" ]; then
  echo "== no build/gpu-pack: building here =="
  HETMESH_JOBS="$(nproc)" bash bench/gpu/pack.sh || exit 1
fi

# Libraries: the pack's own, then wherever NCCL and cuBLAS live on this machine.
libdirs="$PWD/$pack/lib"
for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libdirs="$libdirs:$d"
done
py_libs=$(python3 - <<'PY' 2>/dev/null
import importlib, os
for m in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        mod = importlib.import_module(m)
        for p in getattr(mod, "__path__", []):
            lib = os.path.join(p, "lib")
            if os.path.isdir(lib):
                print(lib)
    except Exception:
        pass
PY
)
for d in $py_libs; do libdirs="$libdirs:$d"; done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
for exe in "$pack"/bin/*; do
  missing=$(ldd "$exe" | grep "not found" | tr -s ' \t' ' ')
  echo "$(basename "$exe"): ${missing:-all libraries found}"
done
for lib in libnccl.so.2 libcublas.so.13; do
  echo "$lib -> $(ldd "$pack"/bin/* 2>/dev/null | awk -v l="$lib" '$1 == l {print $3}' | sort -u | head -n 1)"
done

status=0
run() {  # run NAME TIMEOUT CMD...: one line of outcome per command; 77 = skipped
  local name=$1 limit=$2; shift 2
  echo "== $name =="
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "-- $name: rc=$rc ($((SECONDS - t0)) s)"
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
  summary="$summary$name rc=$rc $((SECONDS - t0))s"$'\n'
}
summary=""
bin="$pack/bin"
run test_cuda 80 "$bin/test_cuda"
run test_comm_nccl 140 "$bin/test_comm_nccl"
[ -x "$bin/example_mllm_train_gpu" ] &&
  run example_mllm_train_gpu 100 "$bin/example_mllm_train_gpu" --device cuda --steps "${HETMESH_GPU_STEPS:-30}" \
    --check-reference --report "$OUT/mllm_train_gpu.json"
# ByteScale's HDP on one GPU: a capacity below the longest document, so selective offload moves activations
# to pinned host memory (train::offload_store over cuda::device_memory).
[ -x "$bin/example_mllm_train_gpu" ] &&
  run example_mllm_train_gpu_hdp 80 "$bin/example_mllm_train_gpu" --device cuda --partition hdp --capacity 256 \
    --steps 10 --check-reference --report "$OUT/mllm_train_gpu_hdp.json"
run bench_gpu_gather 60 "$bin/bench_gpu_gather" --out "$OUT/gpu_gather.json"
NCCL_DEBUG=WARN run bench_gpu_nccl 100 "$bin/bench_gpu_nccl" --out "$OUT/comm_nccl.json" --iters 20 --warmup 5

echo "== summary =="; printf '%s' "$summary"
exit $status
