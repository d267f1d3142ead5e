#!/usr/bin/env bash
# Builds hetmesh and runs the demo: example_mllm_train trains a small multimodal model (a vision and an
# audio encoder, a causal transformer backbone with an MoE layer) through train::system on 8 loopback ranks
# in a 5-D layout: tensor parallelism 2 x a 2-stage joint encoder-LLM pipeline (1F1B) x an HDP pool of 2
# (ByteScale's rings and selective offload), the MoE layer's experts over ep 2 inside the pool, ZeRO-1;
# it prints the layout and its groups first. Data from three sources mixed with a curriculum. Each step prints the loss, the plan, the measured per-rank busy time
# (thread CPU) and its imbalance, and the modelled step time; the run writes a Chrome trace and SVG
# timelines of one step (measured and modelled) and a loss plot under build/demo/. Then hetmesh-plan
# compares five balancing strategies on a real long-context workload for 64 ranks (modelled step times,
# measured plan times). Extra arguments go to example_mllm_train (e.g. --steps 200, --partition static-cp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target example_mllm_train hetmesh-plan
echo
echo "== example_mllm_train: a multimodal model trains on 8 ranks (tp 2 x pp 2 x HDP 2, ep 2, ZeRO-1) =="
./build/default/examples/mllm_train/example_mllm_train --tp 2 --ep 2 --zero 1 --out build/demo \
  --report build/demo/report.json "$@"
echo "(wrote build/demo/: trace.json for ui.perfetto.dev, timeline_measured.svg, timeline_modelled.svg, loss.svg, report.json)"
echo
echo "== hetmesh-plan compare: 2,000 documents of a long-context mix on 64 ranks, 16K tokens per rank =="
./build/default/tools/hetmesh-plan/hetmesh-plan compare --workload examples/data/prolong_sample.txt \
  --ranks 64 --capacity 16384 --format table
