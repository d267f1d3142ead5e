// SPDX-License-Identifier: Apache-2.0
// Delivery by plan (train::plan_delivery, run::send_routed / receive_routed), one body for loopback threads
// and mpirun: trainer ranks followed by data-plane hosts in the host-per-source-group layout. Each host
// makes only its own sources' samples (metadata and bytes are pure functions of seed, step, id), the
// metadata is all-gathered, every rank plans the step (HDP, a joint pipeline, static CP over a searched
// mesh) and its delivery; hosts send, trainers receive. Checked on every trainer: the parts it received
// are exactly those whose rank set names it, each rank set equals the ranks that read the part when the
// step runs (micro-batches and encoder work built from the whole batch, independently of the delivery
// planner), and every received byte equals the source's.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/data/routes.hpp>
#include <hetmesh/data/trainer_mesh.hpp>
#include <hetmesh/mesh/search.hpp>
#include <hetmesh/run/plan_delivery.hpp>
#include <hetmesh/seq/sample.hpp>
#include <hetmesh/train/delivery.hpp>
#include <hetmesh/train/encoders.hpp>
#include <hetmesh/train/families.hpp>
#include <hetmesh/train/pipeline_plan.hpp>

namespace routestest {
using namespace hetmesh;

/// Which plan a case makes.
enum class routed_case { hdp, joint_pp4, searched, encoder_pool };

/// The trainers' rank map of a case over `trainers` ranks (4 or 8).
inline train::rank_map routed_ranks(routed_case c, int trainers) {
  if (c == routed_case::hdp) return train::system_ranks(trainers, 1);
  if (c == routed_case::joint_pp4) return train::system_ranks(trainers / 4, 4);
  if (c == routed_case::encoder_pool)
    return train::system_ranks(trainers / 2, 2);  // pp = 1, one encoder rank
  // tp x cp (x dp) in the order the layout search picks for 2-device nodes.
  const auto choice = trainers == 8
                          ? mesh::search_layout(mesh::make_mesh(mesh::tp(2), mesh::cp(2), mesh::dp(2)),
                                                mesh::traffic{.tp = 1e9, .cp = 4e9, .dp = 1e8},
                                                mesh::topology{.nodes = 4, .devices_per_node = 2})
                          : mesh::search_layout(mesh::make_mesh(mesh::tp(2), mesh::cp(2)),
                                                mesh::traffic{.tp = 1e9, .cp = 4e9},
                                                mesh::topology{.nodes = 2, .devices_per_node = 2});
  const auto& shape = choice.shape;
  return train::mesh_ranks(data::mesh_of_order(choice.best().order, shape));
}

namespace detail {
inline std::uint8_t item_byte(std::int64_t id, int item, std::int64_t k) {
  return static_cast<std::uint8_t>(key_hash({static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(item),
                                             static_cast<std::uint64_t>(k)}) >>
                                   56);
}
inline std::int64_t token_of(std::int64_t id, std::int64_t pos) {
  return static_cast<std::int64_t>(
      key_hash({static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(pos)}) % 50000);
}
/// Host `rank`'s samples of step `step`: per source it runs, 1-3 samples; lengths 8-160, up to two items.
inline std::vector<model::document> host_samples(const data::source_hosts& sh, int rank, std::uint64_t seed,
                                                 std::int64_t step, bool items) {
  std::vector<model::document> out;
  for (int s : sh.sources_of(rank)) {
    rng g(key_hash({seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(step)}));
    const int n = 1 + static_cast<int>(g.uniform(0, 2));
    for (int k = 0; k < n; ++k) {
      model::document d;
      d.id = seq::make_sample_id(s, step, k);
      const auto len = static_cast<std::int64_t>(g.uniform(8, 160));
      for (std::int64_t p = 0; p < len; ++p) d.tokens.push_back(token_of(d.id, p));
      if (items)
        for (std::int64_t at = 1; at + 6 < len && d.items.size() < 2; at += 30)
          if (g.uniform(0, 1) == 1)
            d.items.push_back({static_cast<int>(d.items.size()),
                               d.id * 2 + static_cast<std::int64_t>(d.items.size()), at,
                               static_cast<std::int64_t>(g.uniform(2, 6))});
      out.push_back(std::move(d));
    }
  }
  return out;
}
}  // namespace detail

/// One step of case `c` over `world` (trainers then hosts): returns "" or what failed on this rank.
template <class C>
std::string routed_body(C& world, routed_case c, int trainers, std::uint64_t seed) {
  const data::source_hosts sh{.trainers = trainers, .hosts = world.size() - trainers, .sources = 5};
  const auto where = routed_ranks(c, trainers);
  const bool with_items = c != routed_case::searched;
  // Items of 2-6 tokens: with a pool of 2, the longer ones are split over a shard's row (long-short SP).
  const seq::long_short_policy sp{
      .max_tokens_per_rank = c == routed_case::joint_pp4 && trainers >= 8 ? 4 : 64,
      .heads = 0};  // the heads as a declared value: token-local encoders, any split
  std::string failure;
  std::vector<seq::seq_desc> docs;
  std::vector<std::vector<model::encoder_item>> items;
  train::step_layout plan;
  auto check_routed = [&](std::int64_t step, const data::route_plan& routes,
                          const data::delivered_share& got) -> std::string {
    // Independently: who reads what when the step runs (whole batch at hand).
    model::step_batch whole;
    for (std::size_t i = 0; i < docs.size(); ++i) {
      model::document d{docs[i].id, {}, items[i], {}};
      for (std::int64_t p = 0; p < docs[i].length; ++p) d.tokens.push_back(detail::token_of(d.id, p));
      whole.documents.push_back(std::move(d));
    }
    const auto s = model::summarize_step(whole);
    std::map<std::pair<std::int64_t, int>, std::set<int>> reads;  // (sample, part) -> trainer ranks
    // Per slot and encoder, the distinct items landing in any pool rank's micro-batch (from the whole batch,
    // not from the plan's landings), encoded over the domain of E shards x pool ranks.
    const int E = plan.pipeline.num_encoder_shards();
    std::vector<std::map<int, std::vector<seq::seq_desc>>> slot_items(
        static_cast<std::size_t>(std::max(plan.slots, 1)));
    for (int r = 0; r < plan.world; ++r) {
      const auto mbs = train::build_micro_batches(plan, whole, s, r);
      for (int p = 0; p < where.pp; ++p)  // encoder-pool ranks build them too (to size their work)
        for (const auto& mb : mbs)
          for (auto id : mb.doc_ids)
            for (int w : where.at(p, r)) reads[{id, data::text_part}].insert(w);
      for (const auto& mb : mbs)
        for (const auto& land : mb.encoder_outputs) {
          auto& list = slot_items[static_cast<std::size_t>(mb.index)][land.encoder];
          if (std::none_of(list.begin(), list.end(),
                           [&](const seq::seq_desc& d) { return d.id == land.item; }))
            list.push_back({land.item, whole.documents[static_cast<std::size_t>(s.find(land.item / 2))]
                                           .items[static_cast<std::size_t>(land.item % 2)]
                                           .tokens});
        }
    }
    // The encoder domain: E shards x rows of tp x pool ranks; row position q is pool rank q / tp's q % tp-th
    // tp peer, the one rank that reads the piece.
    const int row = plan.tp * plan.world;
    for (const auto& per_encoder : slot_items)
      for (const auto& [k, list] : per_encoder) {
        const auto ls = train::domain_policy(sp, row).plan(list, E * row);
        for (int d = 0; d < E * row; ++d)
          for (const auto& piece : model::make_encoder_batch(ls, k, d).pieces) {
            const std::int64_t doc = piece.item / 2;  // item ids are doc id * 2 + index
            const int q = d % row;
            const auto& peers =
                where.at(plan.pipeline.encoder_shard_to_rank[static_cast<std::size_t>(d / row)], q / plan.tp);
            reads[{doc, static_cast<int>(piece.item % 2)}].insert(
                peers[static_cast<std::size_t>(q % plan.tp)]);
          }
      }
    const int me = world.rank();
    for (const auto& part : routes.parts) {
      const auto& want = reads[{part.sample, part.item}];
      if (std::vector<int>(want.begin(), want.end()) != part.ranks)
        return fmt::format("step {}: sample {} part {} routed to {}; the step reads it on {}", step,
                           part.sample, part.item, part.ranks, std::vector<int>(want.begin(), want.end()));
      if (part.item == data::text_part && part.ranks.empty())
        return fmt::format("step {}: sample {} reaches no rank", step, part.sample);
    }
    const auto expect = routes.parts_of(me);
    if (got.parts.size() != expect.size())
      return fmt::format("step {}: rank {} received {} parts; its plan names {}", step, me, got.parts.size(),
                         expect.size());
    for (std::size_t k = 0; k < expect.size(); ++k) {
      const auto& p = routes.parts[expect[k]];
      const auto& g = got.parts[k];
      if (g.sample != p.sample || g.item != p.item)
        return fmt::format("step {}: rank {} part {} is ({}, {}); expected ({}, {})", step, me, k, g.sample,
                           g.item, p.sample, p.item);
      const auto b = got.find(g.sample, g.item);
      const auto& d = whole.documents[static_cast<std::size_t>(s.find(g.sample))];
      std::vector<std::uint8_t> src;
      if (g.item == data::text_part) {
        const auto t = train::text_bytes(d);
        src.assign(t.begin(), t.end());
      } else {
        for (std::int64_t j = 0; j < d.items[static_cast<std::size_t>(g.item)].tokens * 3; ++j)
          src.push_back(detail::item_byte(g.sample, g.item, j));
      }
      if (!std::equal(b.begin(), b.end(), src.begin(), src.end()))
        return fmt::format("step {}: rank {} sample {} part {}: {} bytes differ from the source's {}", step,
                           me, g.sample, g.item, b.size(), src.size());
    }
    // A rank holding every sample itself takes the same share without communication.
    std::vector<std::vector<std::uint8_t>> item_src(routes.parts.size());
    const auto local = data::local_share(routes, me, [&](std::size_t i) -> std::span<const std::uint8_t> {
      const auto& p = routes.parts[i];
      const auto& d = whole.documents[static_cast<std::size_t>(s.find(p.sample))];
      if (p.item == data::text_part) return train::text_bytes(d);
      for (std::int64_t j = 0; j < d.items[static_cast<std::size_t>(p.item)].tokens * 3; ++j)
        item_src[i].push_back(detail::item_byte(p.sample, p.item, j));
      return item_src[i];
    });
    if (!(local == got))
      return fmt::format("step {}: rank {}: data::local_share differs from the routed share", step, me);
    // The share the system runs on holds exactly the documents this rank reads.
    const auto share = train::share_of(plan, items, got);
    if (share.step_targets != s.targets)
      return fmt::format("step {}: share_of counts {} targets; the step has {}", step, share.step_targets,
                         s.targets);
    return "";
  };
  for (std::int64_t step = 0; step < 3; ++step) {
    // Metadata exchange: each host contributes its own sources' samples (id, length, items).
    std::vector<model::document> mine;
    if (sh.is_host(world.rank())) mine = detail::host_samples(sh, world.rank(), seed, step, with_items);
    std::vector<std::int64_t> flat;
    for (const auto& d : mine) {
      flat.insert(flat.end(), {d.id, d.length(), static_cast<std::int64_t>(d.items.size())});
      for (const auto& it : d.items) flat.insert(flat.end(), {it.encoder, it.id, it.position, it.tokens});
    }
    const auto all = comm::all_gather_vectors(world, std::span<const std::int64_t>(flat));
    docs.clear();
    items.clear();
    for (const auto& v : all)
      for (std::size_t i = 0; i < v.size();) {
        docs.push_back({v[i], v[i + 1]});
        items.emplace_back();
        const auto n = v[i + 2];
        i += 3;
        for (std::int64_t k = 0; k < n; ++k, i += 4)
          items.back().push_back({static_cast<int>(v[i]), v[i + 1], v[i + 2], v[i + 3]});
      }
    // The plan, on every rank.
    model::step_batch shape;  // metadata only: tokens are zeros, for the pipeline's encoder placement
    for (std::size_t i = 0; i < docs.size(); ++i)
      shape.documents.push_back(
          {docs[i].id, std::vector<std::int64_t>(static_cast<std::size_t>(docs[i].length), 0), items[i], {}});
    if (c == routed_case::searched)
      plan = train::plan_step(seq::cp_zigzag{.cp = 2, .pad = true}, docs, where.pool);
    else {
      seq::hdp<seq::selective_offload> hdp{.capacity = 48};  // long documents offload (the link declared)
      hdp.model.d2h_bandwidth = hdp.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
      hdp.model.activation.layers = 32;  // a declared link needs the layers per rank
      plan = train::plan_step(hdp, docs, where.pool);
    }
    const int tp = static_cast<int>(where.ranks.front().size());  // the ranks sharing a pool rank's data
    if (c == routed_case::joint_pp4)
      train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::colocated_encoder{}, where.pp, &shape,
                             sp, {}, tp);
    else if (c == routed_case::encoder_pool)
      train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::encoder_pool{.ranks = 1}, 1, &shape, sp,
                             {}, tp);
    else
      train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::encoder_on_first_stage{}, where.pp,
                             &shape, sp, {}, tp);
    const auto routes = train::plan_delivery(plan, items, where);
    if (sh.is_host(world.rank())) {
      std::vector<std::vector<std::uint8_t>> keep(routes.parts.size());
      run::send_routed(world, step, routes, sh, [&](std::size_t i) -> std::span<const std::uint8_t> {
        const auto& p = routes.parts[i];
        const auto d = std::find_if(mine.begin(), mine.end(),
                                    [&](const model::document& x) { return x.id == p.sample; });
        if (d == mine.end()) throw std::logic_error("host asked for a sample it does not hold");
        if (p.item == data::text_part) return train::text_bytes(*d);
        auto& b = keep[i];
        if (b.empty())
          for (std::int64_t k = 0; k < d->items[static_cast<std::size_t>(p.item)].tokens * 3; ++k)
            b.push_back(detail::item_byte(p.sample, p.item, k));
        return b;
      });
      continue;
    }
    const auto got = run::receive_routed(world, step, routes, sh);
    // A failure does not end the loop: the hosts go on to the next step's collectives.
    if (auto f = check_routed(step, routes, got); failure.empty()) failure = std::move(f);
  }
  return failure;
}

}  // namespace routestest
