// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the data plane in processes of its own (MegaScale-Data's source loaders and
// constructors on hosts apart from the trainers). The communicator `world` holds the trainer ranks
// first, [0, layout.world()), numbered as the layout says, and after them H >= 1 data-plane hosts.
// Host h serves the data-parallel indices d with d mod H == h: it runs a data_loader whose serve_dp is
// that share (every host plans the whole step, a pure function, and reads only its share, so no
// sample is read twice and no trainer opens a source), constructs each served rank's micro-batches
// and sends them to that rank's loading rank, which broadcasts them to its delivery group as
// deliver() does. Every host holds the same planner state, so any one of them writes the checkpoint.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../core/format.hpp"
#include "delivery.hpp"
#include "loader.hpp"

namespace hetmesh::data {

/// Who is who in a world of trainers followed by data-plane hosts (1 <= hosts <= dp). Plain data.
struct service_layout {
  int trainers = 0;  // ranks [0, trainers): the layout's ranks
  int hosts = 0;     // ranks [trainers, trainers + hosts): data-plane hosts
  /// The world rank of the host serving data-parallel index dp.
  [[nodiscard]] int host_of(int dp) const noexcept { return trainers + dp % hosts; }
  [[nodiscard]] bool is_host(int rank) const noexcept { return rank >= trainers; }
  friend bool operator==(const service_layout&, const service_layout&) = default;
};

/// The service layout of a world of `world_size` ranks around layout `t`. Throws invalid_argument when
/// the world has no room for a host.
[[nodiscard]] inline service_layout service_layout_of(const topology& t, int world_size) {
  if (world_size <= t.world())
    throw_error<invalid_argument>(
        "data service: a world of {} ranks for a layout of {} trainer ranks (tp={} cp={} dp={} pp={}); "
        "expected the trainers followed by at least one data-plane host",
        world_size, t.world(), t.tp, t.cp, t.dp, t.pp);
  if (world_size - t.world() > t.dp)
    throw_error<invalid_argument>(
        "data service: {} data-plane hosts for dp = {} data-parallel indices; expected at most one host per "
        "index (a host serves whole indices)",
        world_size - t.world(), t.dp);
  return {t.world(), world_size - t.world()};
}

/// The data-parallel indices host `rank` serves, ascending; never empty for a host (at most dp hosts).
/// What its data_loader takes as loader_options::serve_dp. Pre: sl.is_host(rank).
[[nodiscard]] inline std::vector<int> served_by(const service_layout& sl, const topology& t, int rank) {
  std::vector<int> out;
  for (int d = 0; d < t.dp; ++d)
    if (sl.host_of(d) == rank) out.push_back(d);
  return out;
}

namespace detail {
inline constexpr std::int64_t service_magic = 0x6d6d2d7376630001;  // protocol id and version
inline constexpr int service_header_tag = 0x5d0;
inline constexpr int service_sizes_tag = 0x5d1;
inline constexpr int service_bytes_tag = 0x5d2;
}  // namespace detail

/// Host side of one step: constructs the micro-batches of every data-parallel index this host serves
/// from `batch` (loaded with serve_dp = served_by(...)) and sends them to the indices' loading ranks.
/// Point-to-point with those loading ranks, which call receive_step for the same step. Pre: this rank is
/// a host of service_layout_of(cfg.layout, world.size()). Cost O(bytes served).
template <class C>
void serve_step(C& world, const mixture_config& cfg, const step_batch& batch) {
  const auto sl = service_layout_of(cfg.layout, world.size());
  if (!sl.is_host(world.rank()))
    throw_error<invalid_argument>(
        "serve_step: rank {} is a trainer rank (trainers are [0, {})); expected a host", world.rank(),
        sl.trainers);
  std::vector<std::array<std::int64_t, 4>> headers;
  std::vector<wire_micro_batches> wires;
  std::vector<int> peers;
  for (int d : served_by(sl, cfg.layout, world.rank())) {
    wires.push_back(to_wire(construct(batch.plan, batch.samples, d, cfg.micro_batches)));
    headers.push_back({detail::service_magic, batch.plan.step,
                       static_cast<std::int64_t>(wires.back().sizes.size()),
                       static_cast<std::int64_t>(wires.back().bytes.size())});
    peers.push_back(delivery_of(cfg.layout, d).loader);
  }
  std::vector<comm::p2p_op> ops;
  for (std::size_t k = 0; k < peers.size(); ++k)
    ops.push_back(
        comm::send_op(std::span<const std::int64_t>(headers[k]), peers[k], detail::service_header_tag));
  comm::group_p2p(world, std::span<const comm::p2p_op>(ops));
  ops.clear();
  for (std::size_t k = 0; k < peers.size(); ++k) {
    ops.push_back(
        comm::send_op(std::span<const std::int64_t>(wires[k].sizes), peers[k], detail::service_sizes_tag));
    ops.push_back(
        comm::send_op(std::span<const std::uint8_t>(wires[k].bytes), peers[k], detail::service_bytes_tag));
  }
  comm::group_p2p(world, std::span<const comm::p2p_op>(ops));
}

/// Trainer side of step `step`: this rank's micro-batches. The loading rank of each delivery group
/// receives them from its host (serve_step of the same step) and broadcasts them to the group; ranks in
/// no group (middle pipeline stages) return an empty list without communicating. Collective over each
/// delivery group. Throws mismatch_error when the host sends another step (the two sides are out of
/// step), data_error for a message of another protocol, and the backend's timeout_error when the host
/// never sends.
template <class C>
[[nodiscard]] std::vector<packed_micro_batch> receive_step(C& world, const mixture_config& cfg,
                                                           std::int64_t step) {
  const auto sl = service_layout_of(cfg.layout, world.size());
  const int me = world.rank();
  if (sl.is_host(me))
    throw_error<invalid_argument>(
        "receive_step: rank {} is a data-plane host (hosts are [{}, {})); expected a "
        "trainer rank",
        me, sl.trainers, sl.trainers + sl.hosts);
  const auto& t = cfg.layout;
  const int dp = (me / (t.tp * t.cp)) % t.dp;
  const auto g = delivery_of(t, dp);
  if (std::find(g.ranks.begin(), g.ranks.end(), me) == g.ranks.end()) return {};
  std::vector<packed_micro_batch> mine;
  if (me == g.loader) {
    const int host = sl.host_of(dp);
    std::array<std::int64_t, 4> header{};
    comm::recv(world, std::span<std::int64_t>(header), host, detail::service_header_tag);
    if (header[0] != detail::service_magic)
      throw_error<data_error>(
          "receive_step: rank {} got a message from host {} that is not a data-service "
          "header (magic {:#x}); expected {:#x}",
          me, host, header[0], detail::service_magic);
    if (header[1] != step)
      throw_error<mismatch_error>(
          "receive_step: rank {} expected step {} but host {} sent step {}; the host and "
          "the trainers are out of step",
          me, step, host, header[1]);
    if (header[2] < 0 || header[3] < 0)
      throw_error<data_error>("receive_step: host {} announced {} micro-batches of {} bytes; expected >= 0",
                              host, header[2], header[3]);
    wire_micro_batches w;
    w.sizes.resize(static_cast<std::size_t>(header[2]));
    w.bytes.resize(static_cast<std::size_t>(header[3]));
    comm::group_p2p(world,
                    {comm::recv_op(std::span<std::int64_t>(w.sizes), host, detail::service_sizes_tag),
                     comm::recv_op(std::span<std::uint8_t>(w.bytes), host, detail::service_bytes_tag)});
    mine = from_wire(w.sizes, w.bytes);
  }
  if (g.ranks.size() == 1) return mine;
  auto group = world.subgroup(std::span<const int>(g.ranks));
  return broadcast_micro_batches(group, mine, 0);
}

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::service_layout> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::data::service_layout& s, fmt::format_context& ctx) const -> decltype(ctx.out()) {
    return fmt::format_to(ctx.out(), "service_layout(trainers=[0, {}), hosts=[{}, {}))", s.trainers,
                          s.trainers, s.trainers + s.hosts);
  }
};
