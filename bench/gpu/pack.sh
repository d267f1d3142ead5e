#!/usr/bin/env bash
# Builds the GPU tests, benchmarks and the GPU example here (a machine with the CUDA toolkit and NCCL,
# no GPU needed) and packs them for a GPU machine: build/gpu-pack/bin (executables) and
# build/gpu-pack/lib (the shared libraries they need that a bare CUDA image may lack: fmt, cudart).
# NCCL and cuBLAS are too large to carry (200 MB, 600 MB): run.sh finds them on the GPU machine.
# Then: device run with carry [build/gpu-pack] and `bash bench/gpu/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
build=build/gpu
pack=build/gpu-pack
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETMESH_WITH_NCCL=ON -DHETMESH_WITH_MPI=OFF \
  -DHETMESH_BUILD_TOOLS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
targets=(test_comm_nccl test_cuda bench_gpu_nccl bench_gpu_gather)
if ninja -C "$build" -t targets all | grep -q '^example_mllm_train_gpu:'; then targets+=(example_mllm_train_gpu); fi
cmake --build "$build" -j "${HETMESH_JOBS:-2}" --target "${targets[@]}"
rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for t in "${targets[@]}"; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  cp "$exe" "$pack/bin/"
done
# Libraries: every dependency but glibc's, the C++ runtime, the driver, NCCL and cuBLAS.
for exe in "$pack"/bin/*; do
  ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | grep -E 'libfmt|libcudart' | while read -r lib; do cp -L "$lib" "$pack/lib/"; done
echo "packed: $(ls "$pack/bin" | tr '\n' ' ')| libs: $(ls "$pack/lib" | tr '\n' ' ')($(du -sh "$pack" | cut -f1))"
