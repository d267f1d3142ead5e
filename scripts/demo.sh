#!/usr/bin/env bash
# Builds hetmesh and runs the demo: hetmesh-plan compares five balancing strategies (random, token
# count, static dp x cp, ByteScale's hybrid data parallelism, hetmesh) on a real long-context workload
# for 64 ranks and prints the table; then the mesh example prints a 64-rank layout and the layout
# search's choice. Step times in the table are modelled; plan times are measured here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target hetmesh-plan example_mesh
echo
echo "== hetmesh-plan compare: 2,000 documents of a long-context mix on 64 ranks, 16K tokens per rank =="
./build/default/tools/hetmesh-plan/hetmesh-plan compare --workload examples/data/prolong_sample.txt \
  --ranks 64 --capacity 16384 --format table
echo
echo "== the mesh example =="
./build/default/examples/mesh/example_mesh
