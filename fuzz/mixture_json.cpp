// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the mixture and curriculum JSON reader (data/mixture_json.hpp). An accepted mixture must
// round-trip through its JSON and give weights at a few steps that sum to exactly weight_one.
#include <cstddef>
#include <cstdint>

#include <hetmesh/data/mixture_json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hetmesh::data;
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const auto cfg = mixture_from_json(j);
    for (std::int64_t step : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}}) {
      std::int64_t sum = 0;
      for (auto w : weights_at(cfg, step)) sum += w;
      if (sum != weight_one) __builtin_trap();
    }
    if (!(mixture_from_json(mixture_to_json(cfg)) == cfg)) __builtin_trap();
  } catch (const hetmesh::error&) {
  }
  return 0;
}
