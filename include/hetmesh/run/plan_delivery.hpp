// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: delivery by plan. Data-plane hosts (data::source_hosts: each runs the loaders of its group
// of sources) send each trainer exactly the parts a data::route_plan routes to it: one message pair per
// (host, trainer) that shares a part, none otherwise; a trainer receives from every host that holds a part
// it needs and from no other. Both sides derive who sends what from the same plan, so no sizes are
// negotiated beyond each part's byte count. The metadata the plan is made from reaches every rank by
// comm::all_gather_vectors (each host contributes its own sources' samples), so the planner works from
// exchanged metadata and no host holds another's source state.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../data/routes.hpp"

namespace hetmesh::run {

namespace detail {
inline constexpr std::int64_t routes_magic = 0x6d6d2d726f740001;  // protocol id and version
inline constexpr int routes_header_tag = 0x5e0;
inline constexpr int routes_bytes_tag = 0x5e1;

/// Per trainer, the indices of the parts of `plan` host `host` sends it (in the plan's order).
HETMESH_COMPILED std::vector<std::vector<std::size_t>> parts_from(const data::route_plan& plan,
                                                                  const data::source_hosts& hosts, int host)
#if HETMESH_BODIES
{
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(plan.trainers));
  for (std::size_t i = 0; i < plan.parts.size(); ++i) {
    const auto& p = plan.parts[i];
    if (hosts.host_of_sample(p.sample) != host) continue;
    for (int r : p.ranks) {
      if (r < 0 || r >= plan.trainers)
        throw_error<invalid_argument>(
            "run::delivery: sample {} part {} routed to rank {}; expected a trainer rank in [0, {})",
            p.sample, p.item, r, plan.trainers);
      out[static_cast<std::size_t>(r)].push_back(i);
    }
  }
  return out;
}
#else
    ;
#endif

HETMESH_COMPILED void check_world(int world, const data::source_hosts& hosts, const data::route_plan& plan,
                                  const char* who)
#if HETMESH_BODIES
{
  hosts.validate();
  if (world != hosts.trainers + hosts.hosts || plan.trainers != hosts.trainers)
    throw_error<invalid_argument>(
        "{}: a world of {} ranks, {} and a plan for {} trainers; expected trainers + hosts ranks", who, world,
        hosts, plan.trainers);
}
#else
    ;
#endif
}  // namespace detail

/// Host side of step `step`: sends every trainer the parts of `plan` it needs whose samples this host
/// holds (by data::source_hosts::host_of_sample). `bytes(part)` returns the bytes of plan.parts[i] as a
/// std::span<const std::uint8_t> (called once per part and receiving trainer, for parts of this host's
/// samples only); the spans must stay valid until this call returns. Point-to-point with those trainers,
/// which call receive_routed for the same step and plan. Pre: this rank is a host of `hosts`; the
/// world is hosts.trainers + hosts.hosts ranks (invalid_argument otherwise). Cost O(bytes sent + parts x
/// ranks).
template <comm::communicator C, class Bytes>
void send_routed(C& world, std::int64_t step, const data::route_plan& plan, const data::source_hosts& hosts,
                 Bytes&& bytes) {
  static_assert(comm::host_communicator<C>,
                "run::send_routed sends host vectors: it needs a comm::host_communicator (loopback, mpi)");
  static_assert(
      std::is_same_v<std::invoke_result_t<Bytes&, std::size_t>, std::span<const std::uint8_t>>,
      "run::send_routed: bytes(i) must return std::span<const std::uint8_t> over storage that outlives "
      "the call (a returned vector would dangle)");
  detail::check_world(world.size(), hosts, plan, "run::send_routed");
  if (!hosts.is_host(world.rank()))
    throw_error<invalid_argument>(
        "run::send_routed: rank {} is a trainer (trainers are [0, {})); expected a host", world.rank(),
        hosts.trainers);
  const auto to = detail::parts_from(plan, hosts, world.rank());
  std::vector<std::vector<std::int64_t>> headers(to.size());
  std::vector<std::vector<std::uint8_t>> payload(to.size());
  std::vector<comm::p2p_op> ops;
  for (std::size_t t = 0; t < to.size(); ++t) {
    if (to[t].empty()) continue;
    auto& h = headers[t];
    h = {detail::routes_magic, step, static_cast<std::int64_t>(to[t].size())};
    for (auto i : to[t]) {
      const std::span<const std::uint8_t> b = bytes(i);
      h.push_back(static_cast<std::int64_t>(b.size()));
      payload[t].insert(payload[t].end(), b.begin(), b.end());
    }
    ops.push_back(
        comm::send_op(std::span<const std::int64_t>(h), static_cast<int>(t), detail::routes_header_tag));
    ops.push_back(comm::send_op(std::span<const std::uint8_t>(payload[t]), static_cast<int>(t),
                                detail::routes_bytes_tag));
  }
  comm::group_p2p(world, std::span<const comm::p2p_op>(ops));
}

/// Trainer side of step `step`: this trainer's share of `plan`, its parts in the plan's order
/// (route_plan::parts_of), received from the hosts that hold them (send_routed of the same step and
/// plan). A trainer that needs nothing receives nothing and returns an empty share. Throws data_error for a
/// message of another protocol, mismatch_error for another step or part count (the sides are out of step),
/// and the backend's timeout_error when a host never sends. Cost O(bytes received + parts x ranks).
template <comm::communicator C>
[[nodiscard]] data::delivered_share receive_routed(C& world, std::int64_t step, const data::route_plan& plan,
                                                   const data::source_hosts& hosts) {
  static_assert(
      comm::host_communicator<C>,
      "run::receive_routed receives host vectors: it needs a comm::host_communicator (loopback, mpi)");
  detail::check_world(world.size(), hosts, plan, "run::receive_routed");
  const int me = world.rank();
  if (hosts.is_host(me))
    throw_error<invalid_argument>(
        "run::receive_routed: rank {} is a data-plane host; expected a trainer rank", me);
  const auto mine = plan.parts_of(me);
  // Per host, the parts it sends (in plan order), then headers first, bytes second.
  std::vector<std::vector<std::size_t>> from(static_cast<std::size_t>(hosts.hosts));
  for (auto i : mine)
    from[static_cast<std::size_t>(hosts.host_of_sample(plan.parts[i].sample) - hosts.trainers)].push_back(i);
  std::vector<std::vector<std::int64_t>> headers(from.size());
  std::vector<comm::p2p_op> ops;
  for (std::size_t h = 0; h < from.size(); ++h) {
    if (from[h].empty()) continue;
    headers[h].resize(3 + from[h].size());
    ops.push_back(comm::recv_op(std::span<std::int64_t>(headers[h]), hosts.trainers + static_cast<int>(h),
                                detail::routes_header_tag));
  }
  comm::group_p2p(world, std::span<const comm::p2p_op>(ops));
  std::vector<std::int64_t> total(from.size(), 0);
  for (std::size_t h = 0; h < from.size(); ++h) {
    if (from[h].empty()) continue;
    const auto& hd = headers[h];
    const int host = hosts.trainers + static_cast<int>(h);
    if (hd[0] != detail::routes_magic)
      throw_error<data_error>(
          "run::receive_routed: rank {} got a message from host {} that is not a routed "
          "delivery header (magic {:#x}); expected {:#x}",
          me, host, hd[0], detail::routes_magic);
    if (hd[1] != step || hd[2] != static_cast<std::int64_t>(from[h].size()))
      throw_error<mismatch_error>(
          "run::receive_routed: rank {} expected step {} with {} parts from host {}, got step {} with {}; "
          "the "
          "host and the trainers are out of step",
          me, step, from[h].size(), host, hd[1], hd[2]);
    for (std::size_t k = 0; k < from[h].size(); ++k) {
      if (hd[3 + k] < 0)
        throw_error<data_error>("run::receive_routed: host {} announced a part of {} bytes; expected >= 0",
                                host, hd[3 + k]);
      total[h] += hd[3 + k];
    }
  }
  std::vector<std::vector<std::uint8_t>> payload(from.size());
  ops.clear();
  for (std::size_t h = 0; h < from.size(); ++h) {
    if (from[h].empty()) continue;
    payload[h].resize(static_cast<std::size_t>(total[h]));
    ops.push_back(comm::recv_op(std::span<std::uint8_t>(payload[h]), hosts.trainers + static_cast<int>(h),
                                detail::routes_bytes_tag));
  }
  comm::group_p2p(world, std::span<const comm::p2p_op>(ops));
  // Assemble in the plan's order.
  data::delivered_share out;
  std::vector<std::size_t> next(from.size(), 0);
  std::vector<std::int64_t> at(from.size(), 0);
  for (auto i : mine) {
    const auto h = static_cast<std::size_t>(hosts.host_of_sample(plan.parts[i].sample) - hosts.trainers);
    const auto size = headers[h][3 + next[h]++];
    const auto begin = payload[h].begin() + at[h];
    out.parts.push_back(
        {plan.parts[i].sample, plan.parts[i].item, static_cast<std::int64_t>(out.bytes.size()), size});
    out.bytes.insert(out.bytes.end(), begin, begin + size);
    at[h] += size;
  }
  return out;
}

}  // namespace hetmesh::run
