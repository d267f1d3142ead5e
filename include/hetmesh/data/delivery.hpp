// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: delivery under hybrid parallelism. Per data-parallel index, one rank (the loading rank
// of its delivery group, see delivery_of) receives the step's samples from the data plane and builds the
// packed micro-batches; the other ranks of the group get the bytes by broadcast. So every sample is read
// once per step in the whole job, and tensor/context/last-stage ranks never touch a source.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../comm/collectives.hpp"
#include "constructor.hpp"
#include "loader.hpp"
#include "planner.hpp"

namespace hetmesh::data {

/// Micro-batches as one message: the byte size of each serialised micro-batch, and their bytes end to end.
struct wire_micro_batches {
  std::vector<std::int64_t> sizes{};
  std::vector<std::uint8_t> bytes{};
};

/// Serialises micro-batches into one message. Local; O(bytes).
[[nodiscard]] inline wire_micro_batches to_wire(const std::vector<packed_micro_batch>& mbs) {
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

/// The micro-batches of a message. Throws data_error when the sizes do not add up to the bytes (a
/// message cut short or from another protocol), and what deserialize throws for a corrupt one.
[[nodiscard]] inline std::vector<packed_micro_batch> from_wire(std::span<const std::int64_t> sizes,
                                                               std::span<const std::uint8_t> bytes) {
  std::int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) throw_error<data_error>("micro-batch message: a size of {} bytes; expected >= 0", s);
    total += s;
  }
  if (total != static_cast<std::int64_t>(bytes.size()))
    throw_error<data_error>("micro-batch message: sizes add up to {} bytes but {} arrived; expected equal",
                            total, bytes.size());
  std::vector<packed_micro_batch> out;
  out.reserve(sizes.size());
  std::size_t at = 0;
  for (auto s : sizes) {
    out.push_back(deserialize(std::as_bytes(bytes.subspan(at, static_cast<std::size_t>(s)))));
    at += static_cast<std::size_t>(s);
  }
  return out;
}

/// Broadcasts micro-batches from `root` over `group`. Collective over `group`: every member calls it with
/// the same root; only the root's `mine` is read. Returns the root's micro-batches on every member.
/// Three broadcasts (count, sizes, bytes); cost O(bytes) per member.
template <class C>
[[nodiscard]] std::vector<packed_micro_batch> broadcast_micro_batches(
    C& group, const std::vector<packed_micro_batch>& mine, int root) {
  wire_micro_batches w;
  if (group.rank() == root) w = to_wire(mine);
  std::int64_t count[2] = {static_cast<std::int64_t>(w.sizes.size()),
                           static_cast<std::int64_t>(w.bytes.size())};
  comm::broadcast(group, std::span<std::int64_t>(count, 2), root);
  w.sizes.resize(static_cast<std::size_t>(count[0]));
  w.bytes.resize(static_cast<std::size_t>(count[1]));
  comm::broadcast(group, std::span<std::int64_t>(w.sizes), root);
  comm::broadcast(group, std::span<std::uint8_t>(w.bytes), root);
  return from_wire(w.sizes, w.bytes);
}

/// This rank's micro-batches of a step. `world` spans the whole layout (rank numbering of `cfg.layout`);
/// `batch` is the step's batch and must be non-null on loading ranks (it is not read elsewhere). Collective
/// over each delivery group (the group's communicator is made from `world`); ranks in no group (middle
/// pipeline stages) return an empty list without communicating.
template <class C>
[[nodiscard]] std::vector<packed_micro_batch> deliver(C& world, const mixture_config& cfg,
                                                      const step_batch* batch) {
  const auto& t = cfg.layout;
  if (world.size() != t.world())
    throw_error<invalid_argument>(
        "deliver: the communicator has {} ranks; the layout tp={} cp={} dp={} pp={} needs {}", world.size(),
        t.tp, t.cp, t.dp, t.pp, t.world());
  const int me = world.rank();
  const int dp = (me / (t.tp * t.cp)) % t.dp;
  const auto g = delivery_of(t, dp);
  const auto it = std::find(g.ranks.begin(), g.ranks.end(), me);
  if (it == g.ranks.end()) return {};
  std::vector<packed_micro_batch> mine{};
  if (me == g.loader) {
    if (batch == nullptr)
      throw_error<invalid_argument>("deliver: rank {} is the loading rank of dp {} but got no batch", me, dp);
    mine = construct(batch->plan, batch->samples, dp, cfg.micro_batches);
  }
  if (g.ranks.size() == 1) return mine;
  auto group = world.subgroup(std::span<const int>(g.ranks));
  return broadcast_micro_batches(group, mine, 0);
}

}  // namespace hetmesh::data
