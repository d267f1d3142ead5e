// SPDX-License-Identifier: Apache-2.0
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "torch_train/options.hpp"
#include "torch_train/reference.hpp"

int main(int argc, char** argv) {
  using namespace torch_train;
  const auto dc = data_config(HETMESH_EXAMPLE_DATA_DIR);
  const std::string dir = argc > 1 ? argv[1] : "/tmp/torchex-data";
  mllm::make_sources(dir, dc);
  mllm::step_source src(dir, dc);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = train_reference(model_shape(dc), model_seed, dtype, src, 10, 1e-2);
  const auto t1 = std::chrono::steady_clock::now();
  for (double l : r.losses) std::printf("%.9f\n", l);
  std::printf("%.3f s\n", std::chrono::duration<double>(t1 - t0).count());
  mllm::step_source s2(dir, dc);
  for (int i = 0; i < 3; ++i) {
    const auto b = s2.next();
    std::printf("step %d: %zu docs:", i, b.documents.size());
    for (const auto& d : b.documents) std::printf(" %ld/%zu", d.length(), d.items.size());
    std::printf("\n");
  }
}
