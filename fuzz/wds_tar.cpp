// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the WebDataset tar index reader (data/tar.hpp, data/webdataset.hpp build_wds_index).
// The input is the shard's bytes; every member of an accepted index must lie inside the shard.
#include <cstddef>
#include <cstdint>

#include <hetmesh/data/webdataset.hpp>

#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = hetmesh::fuzz::scratch("shard.tar");
  hetmesh::fuzz::put(path, data, size);
  try {
    const auto idx = hetmesh::data::build_wds_index(path);
    for (const auto& e : idx.samples)
      for (std::size_t k = 0; k < e.offsets.size(); ++k)
        if (e.offsets[k] < 0 || e.sizes[k] < 0 || e.offsets[k] + e.sizes[k] > static_cast<std::int64_t>(size))
          __builtin_trap();
  } catch (const hetmesh::error&) {
  }
  return 0;
}
