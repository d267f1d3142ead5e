// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the data plane in processes of its own (MegaScale-Data's source loaders and
// constructors on hosts apart from the trainers). The communicator `world` holds the trainer ranks
// first, [0, layout.world()), numbered as the trainers' mesh (cfg.layout, any order) says, and after
// them H >= 1 data-plane hosts. Host h serves the data-parallel indices d with d mod H == h: it runs a
// data_loader whose serve_dp is that share (every host plans the whole step, a pure function, and reads only
// its share, so no sample is read twice and no trainer opens a source), constructs each served rank's
// micro-batches and sends them to that rank's loading rank, which broadcasts them to its delivery group as
// run::deliver() does. Every host holds the same planner state, so any one of them writes the checkpoint.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../data/service_layout.hpp"
#include "../data/wire.hpp"
#include "delivery.hpp"

namespace hetmesh::run {

namespace detail {
inline constexpr std::int64_t service_magic = 0x6d6d2d7376630001;  // protocol id and version
inline constexpr int service_header_tag = 0x5d0;
inline constexpr int service_sizes_tag = 0x5d1;
inline constexpr int service_bytes_tag = 0x5d2;
}  // namespace detail

/// Host side of one step: constructs the micro-batches of every data-parallel index this host serves
/// from `batch` (loaded with serve_dp = data::served_by(...)) and sends them to the indices' loading ranks.
/// Point-to-point with those loading ranks, which call receive_step for the same step. Pre: this rank is
/// a host of data::service_layout_of(cfg.layout, world.size()). Cost O(bytes served).
template <comm::communicator C>
void serve_step(C& world, const data::mixture_config& cfg, const data::loaded_batch& batch) {
  static_assert(comm::host_communicator<C>,
                "run::serve_step sends host vectors: it needs a comm::host_communicator (loopback, mpi), "
                "not a device communicator");
  const auto sl = data::service_layout_of(cfg.layout, world.size());
  if (!sl.is_host(world.rank()))
    throw_error<invalid_argument>(
        "serve_step: rank {} is a trainer rank (trainers are [0, {})); expected a host", world.rank(),
        sl.trainers);
  std::vector<std::array<std::int64_t, 4>> headers;
  std::vector<data::wire_micro_batches> wires;
  std::vector<int> peers;
  for (int d : data::served_by(sl, cfg.layout, world.rank())) {
    wires.push_back(data::to_wire(data::construct(batch.plan, batch.samples, d, cfg.micro_batches)));
    headers.push_back({detail::service_magic, batch.plan.step,
                       static_cast<std::int64_t>(wires.back().sizes.size()),
                       static_cast<std::int64_t>(wires.back().bytes.size())});
    peers.push_back(data::delivery_of(cfg.layout, d).loader);
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
/// receives them from its host (serve_step of the same step) and broadcasts them to the group (every
/// trainer is in the group of its data-parallel index). Collective over each delivery group. Throws
/// mismatch_error when the host sends another step (the two sides are out of step), data_error for a message
/// of another protocol, and the backend's timeout_error when the host never sends.
template <comm::communicator C>
[[nodiscard]] std::vector<data::thd_micro_batch> receive_step(C& world, const data::mixture_config& cfg,
                                                              std::int64_t step) {
  static_assert(comm::host_communicator<C>,
                "run::receive_step receives into host vectors: it needs a comm::host_communicator (loopback, "
                "mpi), not a device communicator");
  const auto sl = data::service_layout_of(cfg.layout, world.size());
  const int me = world.rank();
  if (sl.is_host(me))
    throw_error<invalid_argument>(
        "receive_step: rank {} is a data-plane host (hosts are [{}, {})); expected a "
        "trainer rank",
        me, sl.trainers, sl.trainers + sl.hosts);
  const int dp = cfg.layout.dp_of(me);
  const auto g = data::delivery_of(cfg.layout, dp);
  std::vector<data::thd_micro_batch> mine;
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
    data::wire_micro_batches w;
    w.sizes.resize(static_cast<std::size_t>(header[2]));
    w.bytes.resize(static_cast<std::size_t>(header[3]));
    comm::group_p2p(world,
                    {comm::recv_op(std::span<std::int64_t>(w.sizes), host, detail::service_sizes_tag),
                     comm::recv_op(std::span<std::uint8_t>(w.bytes), host, detail::service_bytes_tag)});
    mine = data::from_wire(w.sizes, w.bytes);
  }
  if (g.ranks.size() == 1) return mine;
  auto group = world.subgroup(std::span<const int>(g.ranks));
  return broadcast_micro_batches(group, mine, 0);
}

}  // namespace hetmesh::run
