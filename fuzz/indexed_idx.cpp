// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the Megatron indexed-dataset reader (data/indexed_dataset.hpp). The input is split into
// a .bin (its length in the first byte, times 8) and the .idx (the rest); an accepted dataset must read
// every sequence and document inside its files.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <hetmesh/data/indexed_dataset.hpp>

#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::string prefix = hetmesh::fuzz::scratch("ds");
  const std::size_t bin = std::min<std::size_t>(std::size_t{data[0]} * 8, size - 1);
  hetmesh::fuzz::put(prefix + ".bin", data + 1, bin);
  hetmesh::fuzz::put(prefix + ".idx", data + 1 + bin, size - 1 - bin);
  try {
    const hetmesh::data::indexed_dataset ds(prefix);
    std::vector<std::int32_t> tokens;
    for (std::int64_t i = 0; i < ds.size(); ++i) {
      tokens.clear();
      ds.read_tokens(i, tokens);
      if (static_cast<std::int64_t>(tokens.size()) != ds.length(i)) __builtin_trap();
    }
    for (std::int64_t d = 0; d < ds.documents(); ++d) {
      const auto [b, e] = ds.document(d);
      if (b < 0 || b > e || e > ds.size()) __builtin_trap();
    }
  } catch (const hetmesh::error&) {
  }
  return 0;
}
