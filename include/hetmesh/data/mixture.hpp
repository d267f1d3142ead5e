// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the declarative mixture. One value says which sources exist, how much of each goes
// into every step (weights as piecewise-linear functions of the step: constant weights and curricula are
// the same thing), how long/short buckets and modalities are mixed, how samples are priced for
// balancing, and the trainers' mesh the batch is delivered to. The C++ aggregate and the JSON file are
// two spellings of the same value (see mixture_json.hpp); validate() checks either.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../cost/compute.hpp"
#include "../seq/sample.hpp"
#include "sample.hpp"
#include "trainer_mesh.hpp"

namespace hetmesh::data {

/// One control point of a schedule: at `step` the weight is `weight`.
struct weight_point {
  std::int64_t step = 0;  ///< step from which the weight holds
  double weight = 0;      ///< the weight there (linear in between)
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const weight_point&, const weight_point&) = default;
};

/// A piecewise-linear function of the step: constant before the first point and after the last, linear
/// in between. One point is a constant weight; several are a curriculum. Points sorted by step.
using weight_schedule = std::vector<weight_point>;

/// The schedule's value at `step`. Pre: non-empty, steps strictly increasing (validate() checks).
[[nodiscard]] HETMESH_COMPILED double evaluate(const weight_schedule& s, std::int64_t step);

/// How a source is stored: Megatron indexed dataset (.bin/.idx), WebDataset tar shards, or in this
/// process (records in memory or a generator: source_spec::in_process, data/memory_source.hpp).
enum class source_format { indexed, webdataset, in_process };

class source_reader;
struct source_spec;

/// The hook of an in-process source (data/memory_source.hpp builds it: data::from_memory,
/// data::from_generator): how each of its source loaders opens a reader, and a fingerprint of its content.
/// Two hooks compare and hash by fingerprint, so equal content on every rank gives equal configurations.
struct in_process_source {
  /// Opens one reader for one source loader (called once per loader, k_s times per source); the spec is
  /// the source's, for its token filter. Empty: not an in-process source.
  std::function<std::unique_ptr<source_reader>(const source_spec&)> open{};
  std::uint64_t fingerprint = 0;  ///< identity of the content: what == and hashing look at
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const in_process_source& a, const in_process_source& b) {
    return a.fingerprint == b.fingerprint && static_cast<bool>(a.open) == static_cast<bool>(b.open);
  }
};

/// One data source.
struct source_spec {
  std::string name{};                             ///< unique name, used in logs and checkpoints
  source_format format = source_format::indexed;  ///< indexed or webdataset
  /// indexed: dataset prefixes (`p.bin`/`p.idx`), concatenated; webdataset: shard paths, concatenated.
  std::vector<std::string> paths{};
  /// Mixture weight over steps. Without modality/bucket mixes, the weights of all sources sum to one at
  /// every step; with them, a source's weight is relative to the others of its (modality, bucket) group.
  weight_schedule weight = {{0, 1.0}};
  std::string modality = "text";  ///< modality group for the modality mix
  std::string bucket{};           ///< long/short bucket for the bucket mix
  /// Long/short filter: keep the samples with min_tokens <= tokens (+ encoder tokens) and, when
  /// max_tokens > 0, tokens < max_tokens. Two specs over the same files make a short and a long bucket.
  std::int64_t min_tokens = 0;
  std::int64_t max_tokens = 0;  ///< 0: no upper bound
  /// 0: the source repeats epochs forever; n > 0: it runs dry after n epochs (an error, not a skip).
  std::int64_t max_epochs = 0;
  /// in_process: the reader's hook (data::from_memory, data::from_generator); otherwise empty.
  in_process_source in_process{};

  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const source_spec&, const source_spec&) = default;
};

/// A named weight of a modality or bucket mix.
struct group_weight {
  std::string name{};  ///< the modality or bucket
  /// Its weight over steps.
  weight_schedule weight{};
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const group_weight&, const group_weight&) = default;
};

/// The price of a sample for balancing, in integer units: a composition of cost/'s exact integer
/// models (cost::quadratic_count, a s^2 + b s + c), one for the text tokens and one per encoder item.
/// Integers keep the balance plan bitwise equal on every rank.
struct sample_cost {
  cost::quadratic_count text{.a = 0, .b = 1, .c = 0};  ///< price of the text tokens
  cost::quadratic_count item{.a = 0, .b = 1, .c = 0};  ///< price of each encoder item
  /// The price of sample `m`: text(tokens) plus item(t) for each encoder item. O(items).
  [[nodiscard]] std::int64_t operator()(const seq::sample_meta& m) const noexcept {
    std::int64_t c = text(m.tokens);
    for (auto t : m.item_tokens) c += item(t);
    return c;
  }
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const sample_cost&, const sample_cost&) = default;
};

/// The whole declarative data plane.
struct mixture_config {
  std::uint64_t seed = 0;                  ///< seeds every source's permutation
  std::int64_t global_batch = 0;           ///< samples per step
  std::vector<source_spec> sources{};      ///< the sources
  std::vector<group_weight> modalities{};  ///< optional modality mix (weights sum to one)
  std::vector<group_weight> buckets{};     ///< optional long/short mix (weights sum to one)
  /// Prices samples for balancing.
  sample_cost cost{};
  /// The trainers' mesh: any mesh::layout (every order, with ep), a mesh::view, the LLM side of a
  /// mesh::decoupled, or data::mesh_of_order(order, shape) for a layout search's choice.
  trainer_mesh layout{};
  int micro_batches = 1;                        ///< per data-parallel rank and step
  std::int64_t max_tokens_per_micro_batch = 0;  ///< 0: unlimited; else a capacity_error when exceeded

  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const mixture_config&, const mixture_config&) = default;
};

/// Fixed-point scale of per-step weights: integers summing to exactly this make quotas exact.
inline constexpr std::int64_t weight_one = 1'000'000'000;
/// The largest global batch a mixture accepts: samples are indexed by int inside a step, and the quota
/// arithmetic (weight x global_batch in 1/weight_one units) must fit int64.
inline constexpr std::int64_t max_global_batch = 2'147'483'647;
/// Tolerance on weights that must sum to one (floating-point input).
inline constexpr double weight_tolerance = 1e-6;

namespace detail {

HETMESH_COMPILED void check_schedule(const weight_schedule& s, const std::string& what);

HETMESH_COMPILED double group_value(const std::vector<group_weight>& gs, const std::string& name,
                                    std::int64_t step);

HETMESH_COMPILED void check_group_sum(const std::vector<group_weight>& gs, const char* axis,
                                      std::int64_t step);

}  // namespace detail

/// The effective weight of every source at `step`, as doubles summing to one. Throws invalid_argument
/// when they do not (naming the step and the sum, or the (modality, bucket) group that has weight but
/// no source). Pure; O(sources x groups).
[[nodiscard]] HETMESH_COMPILED std::vector<double> real_weights_at(const mixture_config& cfg,
                                                                   std::int64_t step);

/// The weights at `step` in fixed point: integers summing to exactly weight_one (largest remainder,
/// ties by source index). Pure and deterministic.
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> weights_at(const mixture_config& cfg,
                                                                    std::int64_t step);

/// Checks a configuration: sizes, names, schedules, formats, and that the weights sum to one at every
/// control point (the sums are linear between them). Throws invalid_argument naming the field.
HETMESH_COMPILED void validate(const mixture_config& cfg);

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::source_spec> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::source_spec& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    using hetmesh::data::source_format;
    return hetmesh::format_to(ctx.out(), "source({}, {}, {} paths, {} weight points, {}/{})", s.name,
                              s.format == source_format::indexed      ? "indexed"
                              : s.format == source_format::webdataset ? "webdataset"
                                                                      : "in_process",
                              s.paths.size(), s.weight.size(), s.modality, s.bucket);
  }
};
template <>
struct fmt::formatter<hetmesh::data::mixture_config> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::mixture_config& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "mixture(seed={}, batch={}, {} sources, mesh {}, {} micro-batches)",
                              c.seed, c.global_batch, c.sources.size(), c.layout, c.micro_batches);
  }
};

#if HETMESH_BODIES
#include <algorithm>
#include <cmath>
#include <map>

#include "../core/sort.hpp"

namespace hetmesh::data {

HETMESH_COMPILED void weight_point::hash_append(hasher& h) const { append_all(h, step, weight); }

HETMESH_COMPILED double evaluate(const weight_schedule& s, std::int64_t step) {
  if (step <= s.front().step) return s.front().weight;
  if (step >= s.back().step) return s.back().weight;
  const auto hi = std::upper_bound(s.begin(), s.end(), step,
                                   [](std::int64_t v, const weight_point& p) { return v < p.step; });
  const auto lo = hi - 1;
  const double t = static_cast<double>(step - lo->step) / static_cast<double>(hi->step - lo->step);
  return lo->weight + (hi->weight - lo->weight) * t;
}

HETMESH_COMPILED void in_process_source::hash_append(hasher& h) const { append_all(h, fingerprint); }

HETMESH_COMPILED void source_spec::hash_append(hasher& h) const {
  append_all(h, name, format, paths, weight, modality, bucket, min_tokens, max_tokens, max_epochs,
             in_process);
}

HETMESH_COMPILED void group_weight::hash_append(hasher& h) const { append_all(h, name, weight); }

HETMESH_COMPILED void sample_cost::hash_append(hasher& h) const { append_all(h, text, item); }

HETMESH_COMPILED void mixture_config::hash_append(hasher& h) const {
  append_all(h, seed, global_batch, sources, modalities, buckets, cost, layout, micro_batches,
             max_tokens_per_micro_batch);
}

}  // namespace hetmesh::data

namespace hetmesh::data::detail {

HETMESH_COMPILED void check_schedule(const weight_schedule& s, const std::string& what) {
  if (s.empty())
    throw_error<invalid_argument>(
        "{}: the weight schedule is empty; expected at least one (step, weight) point", what);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s[i].weight) || s[i].weight < 0)
      throw_error<invalid_argument>("{}: weight {} at step {} is not a finite non-negative number", what,
                                    s[i].weight, s[i].step);
    if (i > 0 && s[i].step <= s[i - 1].step)
      throw_error<invalid_argument>("{}: schedule steps {} then {} are not strictly increasing", what,
                                    s[i - 1].step, s[i].step);
  }
}

HETMESH_COMPILED double group_value(const std::vector<group_weight>& gs, const std::string& name,
                                    std::int64_t step) {
  if (gs.empty()) return 1.0;
  for (const auto& g : gs)
    if (g.name == name) return evaluate(g.weight, step);
  return 0.0;
}

HETMESH_COMPILED void check_group_sum(const std::vector<group_weight>& gs, const char* axis,
                                      std::int64_t step) {
  if (gs.empty()) return;
  double sum = 0;
  for (const auto& g : gs) sum += evaluate(g.weight, step);
  if (std::abs(sum - 1.0) > weight_tolerance)
    throw_error<invalid_argument>("mixture: the {} weights sum to {:.9f} at step {}; expected 1", axis, sum,
                                  step);
}

}  // namespace hetmesh::data::detail

namespace hetmesh::data {

HETMESH_COMPILED std::vector<double> real_weights_at(const mixture_config& cfg, std::int64_t step) {
  const auto n = cfg.sources.size();
  std::vector<double> w(n, 0.0);
  detail::check_group_sum(cfg.modalities, "modality", step);
  detail::check_group_sum(cfg.buckets, "bucket", step);
  const bool grouped = !cfg.modalities.empty() || !cfg.buckets.empty();
  auto group_of = [&](const source_spec& s) {
    return std::pair(cfg.modalities.empty() ? std::string() : s.modality,
                     cfg.buckets.empty() ? std::string() : s.bucket);
  };
  std::map<std::pair<std::string, std::string>, double> group_base{};
  for (const auto& s : cfg.sources) group_base[group_of(s)] += evaluate(s.weight, step);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& s = cfg.sources[i];
    const double base = evaluate(s.weight, step);
    if (grouped) {
      const double factor = detail::group_value(cfg.modalities, s.modality, step) *
                            detail::group_value(cfg.buckets, s.bucket, step);
      const double gb = group_base[group_of(s)];
      w[i] = gb > 0 ? factor * base / gb : 0.0;
    } else {
      w[i] = base;
    }
    sum += w[i];
  }
  if (std::abs(sum - 1.0) > weight_tolerance) {
    if (grouped) {
      for (const auto& m :
           cfg.modalities.empty() ? std::vector<group_weight>{{"", {{0, 1.0}}}} : cfg.modalities)
        for (const auto& b :
             cfg.buckets.empty() ? std::vector<group_weight>{{"", {{0, 1.0}}}} : cfg.buckets) {
          const double f = evaluate(m.weight, step) * evaluate(b.weight, step);
          const auto it = group_base.find({m.name, b.name});
          if (f > 0 && (it == group_base.end() || it->second <= 0))
            throw_error<invalid_argument>(
                "mixture: modality '{}' x bucket '{}' has weight {:.6f} at step {} but no source with weight "
                "> 0 in it",
                m.name, b.name, f, step);
        }
    }
    throw_error<invalid_argument>("mixture: source weights sum to {:.9f} at step {}; expected 1", sum, step);
  }
  return w;
}

HETMESH_COMPILED std::vector<std::int64_t> weights_at(const mixture_config& cfg, std::int64_t step) {
  const auto w = real_weights_at(cfg, step);
  double total = 0;
  for (double x : w) total += x;
  std::vector<std::int64_t> out(w.size());
  std::vector<std::pair<double, std::size_t>> rem(w.size());
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double scaled = w[i] / total * static_cast<double>(weight_one);
    out[i] = static_cast<std::int64_t>(std::floor(scaled));
    rem[i] = {scaled - static_cast<double>(out[i]), i};
    sum += out[i];
  }
  hetmesh::indirect_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (std::size_t k = 0; sum < weight_one; ++k, ++sum) ++out[rem[k % rem.size()].second];
  return out;
}

HETMESH_COMPILED void validate(const mixture_config& cfg) {
  if (cfg.global_batch <= 0 || cfg.global_batch > max_global_batch)
    throw_error<invalid_argument>("mixture: global_batch = {}; expected in [1, {}]", cfg.global_batch,
                                  max_global_batch);
  for (const auto* q : {&cfg.cost.text, &cfg.cost.item})
    if (q->a < 0 || q->b < 0 || q->c < 0)
      throw_error<invalid_argument>("mixture.cost: {} coefficients a = {}, b = {}, c = {}; expected >= 0",
                                    q == &cfg.cost.text ? "text" : "item", q->a, q->b, q->c);
  if (cfg.max_tokens_per_micro_batch < 0)
    throw_error<invalid_argument>("mixture: max_tokens_per_micro_batch = {}; expected >= 0 (0: unlimited)",
                                  cfg.max_tokens_per_micro_batch);
  if (cfg.sources.empty()) throw_error<invalid_argument>("mixture: no sources; expected at least one");
  if (static_cast<std::int64_t>(cfg.sources.size()) > seq::sample_id_layout::max_source + 1)
    throw_error<invalid_argument>(
        "mixture: {} sources; expected at most {} (the source field of a sample id)", cfg.sources.size(),
        seq::sample_id_layout::max_source + 1);
  if (cfg.micro_batches < 1)
    throw_error<invalid_argument>("mixture: micro_batches = {}; expected >= 1", cfg.micro_batches);
  std::vector<std::int64_t> steps{};
  for (std::size_t i = 0; i < cfg.sources.size(); ++i) {
    const auto& s = cfg.sources[i];
    const std::string what = hetmesh::format("source {} '{}'", i, s.name);
    if (s.name.empty())
      throw_error<invalid_argument>("{}: empty name; every source needs a unique name", what);
    for (std::size_t j = 0; j < i; ++j)
      if (cfg.sources[j].name == s.name)
        throw_error<invalid_argument>("{}: the name is used by source {} too", what, j);
    if (s.format == source_format::in_process) {
      if (!s.in_process.open || !s.paths.empty())
        throw_error<invalid_argument>(
            "{}: an in_process source has {} and {} paths; expected the reader's hook (data::from_memory, "
            "data::from_generator) and no paths",
            what, s.in_process.open ? "its hook" : "no hook", s.paths.size());
    } else if (s.in_process.open) {
      throw_error<invalid_argument>(
          "{}: the in_process hook is set but the format is {}; expected format = source_format::in_process",
          what, s.format == source_format::indexed ? "indexed" : "webdataset");
    } else if (s.paths.empty()) {
      throw_error<invalid_argument>("{}: no paths; expected dataset prefixes or shard files", what);
    }
    if (s.min_tokens < 0 || s.max_tokens < 0 || (s.max_tokens > 0 && s.max_tokens <= s.min_tokens))
      throw_error<invalid_argument>("{}: token bucket [{}, {}) is empty or negative", what, s.min_tokens,
                                    s.max_tokens);
    if (s.max_epochs < 0)
      throw_error<invalid_argument>("{}: max_epochs = {}; expected >= 0", what, s.max_epochs);
    detail::check_schedule(s.weight, what);
    for (const auto& p : s.weight) steps.push_back(p.step);
    if (!cfg.modalities.empty() && std::none_of(cfg.modalities.begin(), cfg.modalities.end(),
                                                [&](auto& g) { return g.name == s.modality; }))
      throw_error<invalid_argument>("{}: modality '{}' is not in the modality mix", what, s.modality);
    if (!cfg.buckets.empty() &&
        std::none_of(cfg.buckets.begin(), cfg.buckets.end(), [&](auto& g) { return g.name == s.bucket; }))
      throw_error<invalid_argument>("{}: bucket '{}' is not in the bucket mix", what, s.bucket);
  }
  for (const auto* axis : {&cfg.modalities, &cfg.buckets})
    for (const auto& g : *axis) {
      detail::check_schedule(g.weight, hetmesh::format("group '{}'", g.name));
      for (const auto& p : g.weight) steps.push_back(p.step);
    }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (auto st : steps) (void)real_weights_at(cfg, st);
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
