// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: delivery by plan, as plain data. A step's plan (train::plan_delivery makes one from a
// train::batch_plan) names, per part of every sample (its text, and each of its encoder items), the exact
// trainer ranks that need the part's bytes. The data plane runs on hosts of its own in MegaScale-Data's
// host-per-source-group layout: the mixture's sources are partitioned across the hosts, each host runs the
// source loaders of its group only (no host holds every source's state), and a sample's host follows from
// its stable id (seq::sample_origin_of(id).source). A delivered share is what one trainer receives: its
// parts, in the plan's order, over one flat byte buffer. The exchange itself is run/plan_delivery.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../seq/sample.hpp"

namespace hetmesh::data {

/// Part index of a sample's text (its encoder items are parts 0, 1, ...).
inline constexpr int text_part = -1;

/// One part of one sample and the trainer ranks that need its bytes (ascending, each once).
struct part_route {
  std::int64_t sample = 0;  ///< the sample's stable id (seq::make_sample_id)
  int item = text_part;     ///< text_part, or the index of the encoder item in the sample's item order
  std::vector<int> ranks;   ///< trainer ranks that receive the part: ascending, no repeats

  friend bool operator==(const part_route&, const part_route&) = default;
  /// Feeds the route to a plan hash.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Where every part of a step's samples goes. Plain data; equal on every rank that computed it from the
/// same plan; hashable. Parts are in stream order of their samples, text before items.
struct route_plan {
  int trainers = 0;               ///< trainer ranks [0, trainers)
  std::vector<part_route> parts;  ///< every part of every sample of the step

  /// The indices (into `parts`) of the parts trainer `rank` receives, ascending. O(parts x ranks).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::size_t> parts_of(int rank) const;
  /// The trainer ranks that need any part of sample `id`, ascending (empty for a sample not in the
  /// plan). O(parts x ranks).
  [[nodiscard]] HETMESH_COMPILED std::vector<int> ranks_of(std::int64_t id) const;
  friend bool operator==(const route_plan&, const route_plan&) = default;
  /// Feeds the plan to a plan hash.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// MegaScale-Data's host-per-source-group layout: trainer ranks [0, trainers), then `hosts` data-plane
/// hosts; source s of the mixture's `sources` belongs to host trainers + s mod hosts, which alone runs its
/// source loader. Plain data.
struct source_hosts {
  int trainers = 0;  ///< ranks [0, trainers) train
  int hosts = 1;     ///< ranks [trainers, trainers + hosts) are data-plane hosts
  int sources = 1;   ///< sources of the mixture

  /// Throws invalid_argument unless trainers >= 1 and 1 <= hosts <= sources (a host without a source
  /// would serve nothing).
  HETMESH_COMPILED void validate() const;
  /// The world rank of the host that runs source `s`'s loader. Pre: 0 <= s < sources.
  [[nodiscard]] int host_of_source(std::int64_t s) const noexcept {
    return trainers + static_cast<int>(s % hosts);
  }
  /// The world rank of the host holding sample `id` (by its source). Throws invalid_argument for a
  /// negative id or a source outside [0, sources).
  [[nodiscard]] HETMESH_COMPILED int host_of_sample(std::int64_t id) const;
  /// The sources host `rank` runs, ascending. Pre: a host rank.
  [[nodiscard]] HETMESH_COMPILED std::vector<int> sources_of(int rank) const;
  /// Whether `rank` is a data-plane host.
  [[nodiscard]] bool is_host(int rank) const noexcept { return rank >= trainers; }
  friend bool operator==(const source_hosts&, const source_hosts&) = default;
};

/// One received part: which sample and part, and where its bytes sit in delivered_share::bytes.
struct delivered_part {
  std::int64_t sample = 0;  ///< sample id
  int item = text_part;     ///< text_part or item index
  std::int64_t offset = 0;  ///< first byte in delivered_share::bytes
  std::int64_t size = 0;    ///< bytes

  friend constexpr bool operator==(const delivered_part&, const delivered_part&) = default;
};

/// What one trainer received for a step: its parts in the plan's order (route_plan::parts_of), their
/// bytes in one buffer.
struct delivered_share {
  std::vector<delivered_part> parts;  ///< in the plan's order
  std::vector<std::uint8_t> bytes;    ///< every part's bytes, one after the other

  /// The bytes of part (`sample`, `item`); empty span when the share lacks it. O(parts).
  [[nodiscard]] HETMESH_COMPILED std::span<const std::uint8_t> find(std::int64_t sample,
                                                                    int item = text_part) const noexcept;
  /// Whether the share holds part (`sample`, `item`). O(parts).
  [[nodiscard]] HETMESH_COMPILED bool has(std::int64_t sample, int item = text_part) const noexcept;
  friend bool operator==(const delivered_share&, const delivered_share&) = default;
};

/// The share trainer `rank` takes of `plan` when it holds every sample's bytes itself (each rank reads the
/// whole step, or a file system every rank sees): its parts (route_plan::parts_of(rank)) in the plan's
/// order, with `bytes(i)`, a std::span<const std::uint8_t> of the bytes of plan.parts[i], called once per
/// such part (the span need only stay valid until it is copied). Equal to what run::receive_routed returns
/// for the same plan and bytes, without communication. Pure; O(parts x ranks + the share's bytes).
template <class Bytes>
[[nodiscard]] delivered_share local_share(const route_plan& plan, int rank, Bytes&& bytes) {
  delivered_share out;
  for (auto i : plan.parts_of(rank)) {
    const std::span<const std::uint8_t> b = bytes(i);
    out.parts.push_back({plan.parts[i].sample, plan.parts[i].item,
                         static_cast<std::int64_t>(out.bytes.size()), static_cast<std::int64_t>(b.size())});
    out.bytes.insert(out.bytes.end(), b.begin(), b.end());
  }
  return out;
}

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::route_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::route_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::size_t copies = 0;
    for (const auto& r : p.parts) copies += r.ranks.size();
    return hetmesh::format_to(ctx.out(), "route_plan{{trainers={}, parts={}, copies={}}}", p.trainers,
                              p.parts.size(), copies);
  }
};
template <>
struct fmt::formatter<hetmesh::data::source_hosts> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::source_hosts& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "source_hosts(trainers=[0, {}), hosts=[{}, {}), sources={})",
                              s.trainers, s.trainers, s.trainers + s.hosts, s.sources);
  }
};

#if HETMESH_BODIES
#include <algorithm>

namespace hetmesh::data {

HETMESH_COMPILED void part_route::hash_append(hasher& h) const { append_all(h, sample, item, ranks); }

HETMESH_COMPILED std::vector<std::size_t> route_plan::parts_of(int rank) const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (std::binary_search(parts[i].ranks.begin(), parts[i].ranks.end(), rank)) out.push_back(i);
  return out;
}

HETMESH_COMPILED std::vector<int> route_plan::ranks_of(std::int64_t id) const {
  std::vector<int> out;
  for (const auto& p : parts)
    if (p.sample == id) out.insert(out.end(), p.ranks.begin(), p.ranks.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

HETMESH_COMPILED void route_plan::hash_append(hasher& h) const { append_all(h, trainers, parts); }

HETMESH_COMPILED void source_hosts::validate() const {
  if (trainers < 1 || hosts < 1 || hosts > sources)
    throw_error<invalid_argument>(
        "source_hosts: {} trainers, {} hosts, {} sources; expected trainers >= 1 and 1 <= hosts <= sources",
        trainers, hosts, sources);
}

HETMESH_COMPILED int source_hosts::host_of_sample(std::int64_t id) const {
  const auto s = seq::sample_origin_of(id).source;
  if (s >= sources)
    throw_error<invalid_argument>("source_hosts: sample {} is of source {}; expected a source < {}", id, s,
                                  sources);
  return host_of_source(s);
}

HETMESH_COMPILED std::vector<int> source_hosts::sources_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < sources; ++s)
    if (host_of_source(s) == rank) out.push_back(s);
  return out;
}

HETMESH_COMPILED std::span<const std::uint8_t> delivered_share::find(std::int64_t sample,
                                                                     int item) const noexcept {
  for (const auto& p : parts)
    if (p.sample == sample && p.item == item)
      return std::span<const std::uint8_t>(bytes).subspan(static_cast<std::size_t>(p.offset),
                                                          static_cast<std::size_t>(p.size));
  return {};
}

HETMESH_COMPILED bool delivered_share::has(std::int64_t sample, int item) const noexcept {
  return std::any_of(parts.begin(), parts.end(),
                     [&](const delivered_part& p) { return p.sample == sample && p.item == item; });
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
