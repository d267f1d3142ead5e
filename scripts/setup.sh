#!/usr/bin/env bash
# Installs what hetmesh's build, tests and demo need, from Debian's packages (libtorch-dev: the optional
# hetmesh::torch component and its tests; docs/torch.md says why Debian's libtorch over the PyPI wheel). Idempotent: installs only
# what is missing. The CUDA toolkit (nvcc, NCCL, CCCL) is optional: where it is absent the CUDA parts
# are skipped with one message at configure time.
set -euo pipefail

packages=(cmake ninja-build ccache g++ clang libclang-rt-14-dev libfmt-dev doctest-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin clang-format python3 doxygen libtorch-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

# mpirun refuses to run as root unless told; our tests run as root in CI.
if [ "$(id -u)" -eq 0 ]; then
  echo "setup: note: as root, mpirun needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (CTest sets them)"
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1))"
else
  echo "setup: no CUDA toolkit: the hetmesh::nccl component and CUDA parts will be skipped"
fi
