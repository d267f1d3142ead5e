// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the bodies of data/planner.hpp's HETMESH_COMPILED functions, included at the end of that
// header where bodies are emitted (header-only translation units and <hetmesh/src.hpp>'s).
#pragma once

#include "../planner.hpp"

namespace hetmesh::data {

HETMESH_COMPILED void source_cursor::hash_append(hasher& h) const { append_all(h, epoch, position, carry); }

HETMESH_COMPILED void planner_state::hash_append(hasher& h) const { append_all(h, step, cursors); }

HETMESH_COMPILED void validate_state(const mixture_config& cfg, const planner_state& st,
                                     std::string_view where) {
  if (st.cursors.size() != cfg.sources.size())
    throw_error<mismatch_error>("{}: {} source cursors; the configuration has {} sources", where,
                                st.cursors.size(), cfg.sources.size());
  if (st.step < 0) throw_error<data_error>("{}.step = {}; expected >= 0", where, st.step);
  for (std::size_t s = 0; s < st.cursors.size(); ++s) {
    const auto& c = st.cursors[s];
    const auto& spec = cfg.sources[s];
    if (c.epoch < 0 || (spec.max_epochs > 0 && c.epoch >= spec.max_epochs))
      throw_error<data_error>(
          "{}.sources[{}] ('{}').epoch = {}; expected in [0, {})", where, s, spec.name, c.epoch,
          spec.max_epochs > 0 ? spec.max_epochs : std::numeric_limits<std::int64_t>::max());
    if (c.position < 0)
      throw_error<data_error>("{}.sources[{}] ('{}').position = {}; expected >= 0", where, s, spec.name,
                              c.position);
    if (c.carry <= -weight_one || c.carry >= weight_one)
      throw_error<data_error>("{}.sources[{}] ('{}').carry = {}; expected in ({}, {}) (under one sample)",
                              where, s, spec.name, c.carry, -weight_one, weight_one);
  }
}

HETMESH_COMPILED void validate_positions(const mixture_config& cfg, const planner_state& st,
                                         std::span<const std::int64_t> sizes, std::string_view where) {
  for (std::size_t s = 0; s < st.cursors.size() && s < sizes.size(); ++s)
    if (st.cursors[s].position < 0 || st.cursors[s].position > sizes[s])
      throw_error<data_error>(
          "{}.sources[{}] ('{}').position = {}; expected in [0, {}] (the source has {} samples)", where, s,
          cfg.sources[s].name, st.cursors[s].position, sizes[s], sizes[s]);
}

HETMESH_COMPILED planner_state initial_state(const mixture_config& cfg) {
  return {0, std::vector<source_cursor>(cfg.sources.size())};
}

HETMESH_COMPILED void planned_sample::hash_append(hasher& h) const {
  append_all(h, ref, meta, cost, dp_rank, micro_batch);
}

HETMESH_COMPILED std::vector<int> batch_plan::micro_batch(int r, int m) const {
  std::vector<int> out;
  for (std::size_t i = 0; i < samples.size(); ++i)
    if (samples[i].dp_rank == r && samples[i].micro_batch == m) out.push_back(static_cast<int>(i));
  return out;
}

HETMESH_COMPILED void batch_plan::hash_append(hasher& h) const {
  append_all(h, step, samples, quotas, rank_cost);
}

HETMESH_COMPILED std::vector<std::int64_t> step_quotas(const mixture_config& cfg,
                                                       const std::vector<std::int64_t>& weights,
                                                       std::vector<source_cursor>& cursors) {
  const std::size_t n = weights.size();
  const std::int64_t B = cfg.global_batch;
  std::vector<std::int64_t> q(n), count(n, 0);
  std::int64_t assigned = 0;
  for (std::size_t s = 0; s < n; ++s) {
    q[s] = checked_add(checked_mul(weights[s], B, "step_quotas: weight x global_batch"), cursors[s].carry,
                       "step_quotas: quota + carry");
    count[s] = q[s] > 0 ? q[s] / weight_one : 0;
    assigned += count[s];
  }
  std::vector<std::size_t> order{};
  for (std::size_t s = 0; s < n; ++s)
    if (q[s] - count[s] * weight_one > 0) order.push_back(s);
  hetmesh::indirect_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto ra = q[a] - count[a] * weight_one, rb = q[b] - count[b] * weight_one;
    return ra != rb ? ra > rb : a < b;
  });
  HETMESH_ASSERT(B - assigned <= static_cast<std::int64_t>(order.size()),
                 "largest remainder: {} slots left, {} candidates", B - assigned, order.size());
  for (std::size_t k = 0; assigned < B; ++k, ++assigned) ++count[order[k]];
  for (std::size_t s = 0; s < n; ++s) cursors[s].carry = q[s] - count[s] * weight_one;
  return count;
}

}  // namespace hetmesh::data

namespace hetmesh::data::detail {

HETMESH_COMPILED std::int64_t checked_price(const sample_cost& cost, const seq::sample_meta& m, int source,
                                            std::int64_t position) {
  auto one = [&](const cost::quadratic_count& q, std::int64_t t) {
    if (t < 0)
      throw_error<data_error>("source {} position {}: a length of {} tokens; expected >= 0", source, position,
                              t);
    const std::string_view what = "sample price (cost a x tokens^2 + b x tokens + c)";
    return checked_add(checked_mul(checked_add(checked_mul(q.a, t, what), q.b, what), t, what), q.c, what);
  };
  try {
    std::int64_t c = one(cost.text, m.tokens);
    for (auto t : m.item_tokens) c = checked_add(c, one(cost.item, t), "sample price (text + items)");
    return c;
  } catch (error& e) {
    e.add_context(hetmesh::format("pricing source {} position {} ({} tokens, {} items)", source, position,
                                  m.tokens, m.item_tokens.size()));
    throw;
  }
}

}  // namespace hetmesh::data::detail

namespace hetmesh::data {

HETMESH_COMPILED planner_state state_at(const mixture_config& cfg, std::int64_t step,
                                        std::span<const std::int64_t> sizes) {
  planner_state st = initial_state(cfg);
  for (; st.step < step; ++st.step) {
    const auto counts = step_quotas(cfg, weights_at(cfg, st.step), st.cursors);
    for (std::size_t s = 0; s < counts.size(); ++s)
      detail::draw_runs(cfg.sources[s], static_cast<int>(s), sizes[s], counts[s], st.cursors[s],
                        [](std::int64_t, std::int64_t, std::int64_t) {});
  }
  return st;
}

}  // namespace hetmesh::data

namespace hetmesh::data::detail {

HETMESH_COMPILED void check_step_exactly_once(const mixture_config& cfg,
                                              const std::vector<planned_sample>& samples,
                                              const std::vector<int>& members, int dp, std::int64_t step) {
  const std::size_t n = samples.size();
  // Exactly once: global_batch samples, no (source, epoch, position) drawn twice, each sample in the
  // member list of exactly one rank and in one (dp_rank, micro_batch) in range.
  std::vector<id_range> expected, assigned;
  for (std::size_t i = 0; i < n; ++i) expected.push_back({static_cast<std::int64_t>(i), 0, 1});
  for (int i : members) assigned.push_back({i, 0, 1});
  std::string v = exactly_once_violation(std::move(expected), std::move(assigned));
  if (v.empty() && static_cast<std::int64_t>(n) != cfg.global_batch)
    v = hetmesh::format("{} samples; expected global_batch = {}", n, cfg.global_batch);
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> keys;
  for (const auto& smp : samples) {
    keys.emplace_back(smp.ref.source, smp.ref.epoch, smp.ref.position);
    if (v.empty() &&
        (smp.dp_rank < 0 || smp.dp_rank >= dp || smp.micro_batch < 0 || smp.micro_batch >= cfg.micro_batches))
      v = hetmesh::format(
          "sample (source {}, epoch {}, position {}) is on rank {} micro-batch {}; expected {} x {}",
          smp.ref.source, smp.ref.epoch, smp.ref.position, smp.dp_rank, smp.micro_batch, dp,
          cfg.micro_batches);
  }
  hetmesh::indirect_sort(keys.begin(), keys.end());
  if (const auto d = std::adjacent_find(keys.begin(), keys.end()); v.empty() && d != keys.end())
    v = hetmesh::format("sample (source {}, epoch {}, position {}) drawn twice", std::get<0>(*d),
                        std::get<1>(*d), std::get<2>(*d));
  HETMESH_ASSERT_AT(heavy, v.empty(), "data::plan_step (step {}): {}", step, v);
}

}  // namespace hetmesh::data::detail

namespace hetmesh::data {

HETMESH_COMPILED delivery_group delivery_of(const trainer_mesh& m, int dp) {
  const auto& ranks = m.ranks_of(dp);
  return {dp, ranks.front(), ranks};
}

HETMESH_COMPILED std::vector<delivery_group> delivery_plan(const trainer_mesh& m) {
  std::vector<delivery_group> out{};
  for (int d = 0; d < m.dp_size(); ++d) out.push_back(delivery_of(m, d));
  return out;
}

}  // namespace hetmesh::data
