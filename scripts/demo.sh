#!/usr/bin/env bash
# Builds hetmesh and runs the demo: the planner compares balancing strategies on a real workload
# and prints the table; then the mesh example prints a 64-rank layout and the layout search's choice.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target example_mesh
./build/default/examples/mesh/example_mesh
