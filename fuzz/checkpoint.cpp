// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the data checkpoint reader (data/checkpoint.hpp) against a fixed two-source mixture.
// Accepted states are then planned from, so a state that passes validation but breaks the planner is
// found too.
#include <cstddef>
#include <cstdint>

#include <hetmesh/data/checkpoint.hpp>

#include "common.hpp"

namespace {
using namespace hetmesh::data;

const mixture_config& config() {
  static const mixture_config cfg{
      .seed = 7,
      .global_batch = 10,
      .sources = {{.name = "web", .paths = {"w"}, .weight = {{0, 0.7}}, .max_epochs = 3},
                  {.name = "code", .paths = {"c"}, .weight = {{0, 0.3}}}},
      .cost = {.text = {.a = 1, .b = 1}},
      .layout = hetmesh::mesh::make_mesh(hetmesh::mesh::dp(2)),
      .micro_batches = 2,
  };
  return cfg;
}

struct table {
  std::int64_t source_size(int s) const { return s == 0 ? 40 : 25; }
  std::pair<std::int64_t, hetmesh::seq::sample_meta> lookup(int s, std::int64_t, std::int64_t p) const {
    if (p < 0 || p >= source_size(s)) __builtin_trap();  // the planner must never ask outside a source
    return {p, hetmesh::seq::sample_meta{.tokens = 1 + p, .item_tokens = {}, .bytes = 2 + 2 * p}};
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const auto st = checkpoint_from_json(config(), j);
    table t;
    (void)plan_step(config(), st, t);
  } catch (const hetmesh::error&) {
  }
  return 0;
}
