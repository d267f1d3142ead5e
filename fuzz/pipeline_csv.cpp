// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the PyTorch CSV schedule reader (pipeline/io.hpp). An accepted schedule must print back
// to CSV that reads to the same schedule.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <hetmesh/pipeline/io.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hetmesh::pipeline;
  try {
    const auto s = from_csv(std::string_view(reinterpret_cast<const char*>(data), size));
    const auto again = from_csv(to_csv(s));
    if (to_csv(again) != to_csv(s)) __builtin_trap();
  } catch (const hetmesh::error&) {
  }
  return 0;
}
