// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: micro-batches as one message (sizes, then bytes end to end). Pure serialisation: the
// delivery and the data service (run/delivery.hpp, run/data_service.hpp) send what to_wire makes.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "constructor.hpp"

namespace hetmesh::data {

/// Micro-batches as one message: the byte size of each serialised micro-batch, and their bytes end to end.
struct wire_micro_batches {
  std::vector<std::int64_t> sizes{};  ///< size in bytes of each micro-batch
  std::vector<std::uint8_t> bytes{};  ///< the micro-batches, serialised back to back
};

/// Serialises micro-batches into one message. Local; O(bytes).
[[nodiscard]] HETMESH_COMPILED wire_micro_batches to_wire(const std::vector<thd_micro_batch>& mbs);

/// The micro-batches of a message. Throws data_error when the sizes do not add up to the bytes (a
/// message cut short or from another protocol), and what deserialize throws for a corrupt one.
[[nodiscard]] HETMESH_COMPILED std::vector<thd_micro_batch> from_wire(std::span<const std::int64_t> sizes,
                                                                      std::span<const std::uint8_t> bytes);

}  // namespace hetmesh::data

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED wire_micro_batches to_wire(const std::vector<thd_micro_batch>& mbs) {
  wire_micro_batches w;
  std::vector<std::vector<std::byte>> blobs;
  blobs.reserve(mbs.size());
  std::size_t total = 0;
  for (const auto& mb : mbs) {
    blobs.push_back(serialize(mb));
    w.sizes.push_back(static_cast<std::int64_t>(blobs.back().size()));
    total += blobs.back().size();
  }
  w.bytes.resize(total);
  std::size_t at = 0;
  for (const auto& b : blobs) {
    if (!b.empty()) std::memcpy(w.bytes.data() + at, b.data(), b.size());
    at += b.size();
  }
  return w;
}

HETMESH_COMPILED std::vector<thd_micro_batch> from_wire(std::span<const std::int64_t> sizes,
                                                        std::span<const std::uint8_t> bytes) {
  std::int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) throw_error<data_error>("micro-batch message: a size of {} bytes; expected >= 0", s);
    total += s;
  }
  if (total != static_cast<std::int64_t>(bytes.size()))
    throw_error<data_error>("micro-batch message: sizes add up to {} bytes but {} arrived; expected equal",
                            total, bytes.size());
  std::vector<thd_micro_batch> out;
  out.reserve(sizes.size());
  std::size_t at = 0;
  for (auto s : sizes) {
    out.push_back(deserialize(std::as_bytes(bytes.subspan(at, static_cast<std::size_t>(s)))));
    at += static_cast<std::size_t>(s);
  }
  return out;
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
