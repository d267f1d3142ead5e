// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's data plane in processes of its own (--hosts H): the world is the R trainers, then H
// data-plane hosts (data::source_hosts: host h serves the samples of sources s with s mod H == h). Per step:
//  1. every host draws the step (each opens the whole mixture here: the example's loader is one object;
//     the library's own hosts hold only their sources' state, tests/data/routes.cpp) and contributes the
//     metadata of its own samples (stream index, id, length, encoder items); one all-gather over the
//     world gives every rank the step's metadata, in stream order;
//  2. every rank plans the same step from the metadata alone (train::plan_system_step, what
//     train::system::plan calls) and routes it (train::plan_delivery, what system::delivery calls);
//  3. hosts send each trainer exactly the parts routed to it (run::send_routed); trainers receive them
//     (run::receive_routed) and run on their share. The losses are the local run's, bit for bit.
// step_feed is the trainer's side of it, or, without hosts, the step source every trainer reads itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/data/routes.hpp>
#include <hetmesh/run/plan_delivery.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/data.hpp"
#include "mllm_train/options.hpp"

namespace mllm {

namespace host_detail {

/// The metadata of the documents of `b` that `mine(id)` selects: per document its stream index, id,
/// length, item count, whether it has a loss mask, then per item encoder, id, position and tokens, then
/// the mask's bits (64 per word) when it has one: the trainers count the step's targets from them.
template <class Mine>
std::vector<std::int64_t> metadata(const hetmesh::model::step_batch& b, Mine&& mine) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    const auto& d = b.documents[i];
    if (!mine(d.id)) continue;
    out.insert(out.end(), {static_cast<std::int64_t>(i), d.id, d.length(),
                           static_cast<std::int64_t>(d.items.size()), d.loss_mask.empty() ? 0 : 1});
    for (const auto& it : d.items) out.insert(out.end(), {it.encoder, it.id, it.position, it.tokens});
    for (std::size_t k = 0; k < d.loss_mask.size(); ++k) {
      if (k % 64 == 0) out.push_back(0);
      if (d.loss_mask[k] != 0) out.back() |= std::int64_t{1} << (k % 64);
    }
  }
  return out;
}

/// The step's metadata batch from every rank's contribution: documents in stream order with their items
/// and loss masks, tokens all pad (their count is the length), what the planners read. Collective over
/// `world`.
template <class Comm>
hetmesh::model::step_batch exchange_metadata(Comm& world, const std::vector<std::int64_t>& mine) {
  std::map<std::int64_t, hetmesh::model::document> by_index;
  for (const auto& v : hetmesh::comm::all_gather_vectors(world, std::span<const std::int64_t>(mine)))
    for (std::size_t i = 0; i < v.size();) {
      auto& d = by_index[v[i]];
      d.id = v[i + 1];
      d.tokens.assign(static_cast<std::size_t>(v[i + 2]), pad_token);
      const auto n = v[i + 3];
      const bool masked = v[i + 4] != 0;
      i += 5;
      for (std::int64_t k = 0; k < n; ++k, i += 4)
        d.items.push_back({static_cast<int>(v[i]), v[i + 1], v[i + 2], v[i + 3]});
      if (!masked) continue;
      d.loss_mask.resize(d.tokens.size());
      for (std::size_t k = 0; k < d.loss_mask.size(); ++k)
        d.loss_mask[k] = static_cast<std::uint8_t>((v[i + k / 64] >> (k % 64)) & 1);
      i += (d.loss_mask.size() + 63) / 64;
    }
  hetmesh::model::step_batch b;
  b.pad_token = pad_token;
  for (auto& [index, d] : by_index) b.documents.push_back(std::move(d));
  return b;
}

/// Encoder-pool ranks per pipeline of a placement (train::system::encoder_ranks()).
template <class Placement>
int encoder_ranks(const Placement& p) {
  if constexpr (std::is_same_v<Placement, hetmesh::pipeline::encoder_pool>)
    return p.ranks;
  else
    return 0;
}

}  // namespace host_detail

/// The data-plane layout of a world of `world` ranks whose last `hosts` serve the data of `dir`'s mixture.
inline hetmesh::data::source_hosts host_layout(int world, int hosts, const std::filesystem::path& dir) {
  const hetmesh::data::source_hosts sh{.trainers = world - hosts,
                                       .hosts = hosts,
                                       .sources = static_cast<int>(load_mixture(dir).sources.size())};
  sh.validate();
  return sh;
}

/// A trainer's steps: read locally from a step_source (no hosts), or from the hosts (metadata, then the
/// parts routed to this rank). `world` is every rank, trainers and hosts.
template <class Comm>
class step_feed {
 public:
  step_feed(Comm& world, int hosts, const std::filesystem::path& dir, const data_config& dc)
      : world_(&world), dc_(dc) {
    if (hosts == 0)
      local_.emplace(dir, dc);
    else
      hosts_ = host_layout(world.size(), hosts, dir);
  }
  /// The step next() returns next.
  [[nodiscard]] std::int64_t step() const { return local_ ? local_->step() : step_; }
  /// The next step's batch: the whole step, or its metadata (tokens all pad) from the hosts.
  [[nodiscard]] hetmesh::model::step_batch next() {
    if (local_) return local_->next();
    ++step_;
    return host_detail::exchange_metadata(*world_, {});
  }
  /// This rank's parts of step `step` under `routes`: taken from the local step, or received from the hosts.
  [[nodiscard]] hetmesh::data::delivered_share share(std::int64_t step,
                                                     const hetmesh::data::route_plan& routes,
                                                     const hetmesh::model::step_batch& batch) const {
    if (!local_) return hetmesh::run::receive_routed(*world_, step, routes, *hosts_);
    return hetmesh::data::local_share(routes, world_->rank(), [&](std::size_t i) {
      const auto& part = routes.parts[i];
      return local_->part_bytes(*std::find_if(batch.documents.begin(), batch.documents.end(),
                                              [&](const auto& d) { return d.id == part.sample; }),
                                part.item);
    });
  }
  /// The local step source (null with hosts): checkpoints, the parity check's inputs.
  [[nodiscard]] step_source* source() noexcept { return local_ ? &*local_ : nullptr; }
  /// Floats per token of `encoder`.
  [[nodiscard]] int width(int encoder) const { return feature_width(dc_, encoder); }

 private:
  Comm* world_;
  data_config dc_;
  std::optional<step_source> local_;
  std::optional<hetmesh::data::source_hosts> hosts_;
  std::int64_t step_ = 0;
};

namespace host_detail {

/// A host's share of step `step`'s metadata exchange (its own samples of `batch`); returns the step's
/// metadata. Collective over `world`. (A template on the communicator only: one instantiation per
/// translation unit, whatever the policies.)
template <class Comm>
hetmesh::model::step_batch host_metadata(Comm& world, const hetmesh::data::source_hosts& sh,
                                         const hetmesh::model::step_batch& batch) {
  return exchange_metadata(
      world, metadata(batch, [&](std::int64_t id) { return sh.host_of_sample(id) == world.rank(); }));
}

/// Sends every trainer the parts of `routes` this host holds (the bytes of `batch`, step `step` of `data`).
template <class Comm>
void host_send(Comm& world, std::int64_t step, const hetmesh::data::route_plan& routes,
               const hetmesh::data::source_hosts& sh, const hetmesh::model::step_batch& batch,
               const step_source& data) {
  hetmesh::run::send_routed(world, step, routes, sh, [&](std::size_t i) {
    const auto& part = routes.parts[i];
    return data.part_bytes(*std::find_if(batch.documents.begin(), batch.documents.end(),
                                         [&](const auto& d) { return d.id == part.sample; }),
                           part.item);
  });
}

}  // namespace host_detail

/// A host's whole run: `steps` steps of the mixture under `dir`, planned as train::system<Partition, ...,
/// Balancer, Schedule, Placement> over the trainers plans them (`pc`, `so`), each trainer sent its parts.
/// Collective over `world` with the trainers' step_feed.
template <class Comm, class Partition, class Balancer, class Schedule, class Placement>
void serve_hosts(Comm& world, int hosts, int steps, const std::filesystem::path& dir, const data_config& dc,
                 const Partition& partition, const Balancer& balancer,
                 const hetmesh::train::pipeline_config<Schedule, Placement>& pc,
                 const hetmesh::train::system_options& so) {
  step_source data(dir, dc);
  const auto sh = host_layout(world.size(), hosts, dir);
  const int enc = host_detail::encoder_ranks(pc.encoders);
  // The trainers' mesh, as their train::system lays it out: its pool, and where each trainer sits.
  const hetmesh::train::system_layout layout(so.mesh, sh.trainers, pc.pp + enc, enc);
  const auto where = layout.ranks();
  for (std::int64_t step = data.step(); step < steps; ++step) {
    const auto batch = data.next();
    const auto meta = host_detail::host_metadata(world, sh, batch);
    const auto docs = hetmesh::model::document_descs(meta);
    const auto plan = hetmesh::train::plan_system_step(partition, balancer, pc, so.cost, layout.pool(), docs,
                                                       &meta, so.encoder_sp, {}, layout.tp());
    host_detail::host_send(world, step, hetmesh::train::plan_delivery(plan, meta, where), sh, batch, data);
  }
}

}  // namespace mllm
