// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: who is who when the data plane runs in processes of its own (MegaScale-Data's source
// loaders and constructors on hosts apart from the trainers): the trainer ranks first, numbered as the
// trainers' mesh says, then H >= 1 data-plane hosts; host h serves the data-parallel indices d with d mod H
// == h. Pure; the service itself (serve_step, receive_step) is in run/data_service.hpp.
#pragma once

#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "mixture.hpp"
#include "trainer_mesh.hpp"

namespace hetmesh::data {

/// Who is who in a world of trainers followed by data-plane hosts (1 <= hosts <= dp). Plain data.
struct service_layout {
  int trainers = 0;  ///< ranks [0, trainers): the layout's ranks
  int hosts = 0;     ///< ranks [trainers, trainers + hosts): data-plane hosts
  /// The world rank of the host serving data-parallel index dp.
  [[nodiscard]] int host_of(int dp) const noexcept { return trainers + dp % hosts; }
  /// Whether `rank` is a data-plane host (not a trainer).
  [[nodiscard]] bool is_host(int rank) const noexcept { return rank >= trainers; }
  friend bool operator==(const service_layout&, const service_layout&) = default;
};

/// The service layout of a world of `world_size` ranks around the trainers' mesh `t`. Throws
/// invalid_argument when the world has no room for a host, or more hosts than data-parallel indices.
[[nodiscard]] HETMESH_COMPILED service_layout service_layout_of(const trainer_mesh& t, int world_size);

/// The data-parallel indices host `rank` serves, ascending; never empty for a host (at most dp hosts).
/// What its data_loader takes as loader_options::serve_dp. Pre: sl.is_host(rank).
[[nodiscard]] HETMESH_COMPILED std::vector<int> served_by(const service_layout& sl, const trainer_mesh& t,
                                                          int rank);

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::service_layout> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::service_layout& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "service_layout(trainers=[0, {}), hosts=[{}, {}))", s.trainers,
                              s.trainers, s.trainers + s.hosts);
  }
};

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED service_layout service_layout_of(const trainer_mesh& t, int world_size) {
  if (world_size <= t.world())
    throw_error<invalid_argument>(
        "data service: a world of {} ranks for a mesh of {} trainer ranks ({}); "
        "expected the trainers followed by at least one data-plane host",
        world_size, t.world(), t.str());
  if (world_size - t.world() > t.dp_size())
    throw_error<invalid_argument>(
        "data service: {} data-plane hosts for {} data-parallel indices; expected at most one host per "
        "index (a host serves whole indices)",
        world_size - t.world(), t.dp_size());
  return {t.world(), world_size - t.world()};
}

HETMESH_COMPILED std::vector<int> served_by(const service_layout& sl, const trainer_mesh& t, int rank) {
  std::vector<int> out;
  for (int d = 0; d < t.dp_size(); ++d)
    if (sl.host_of(d) == rank) out.push_back(d);
  return out;
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
