// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: adaptive resharding (MegaScale-Omni): encoder outputs move from the encoder ranks
// that produced them to the LLM ranks that consume the matching token positions -- whole samples, or
// context-parallel / HDP shards (zigzag chunks) of them. The plan is a list of runs (src rank, dst
// rank, src row, dst row, rows), coalesced, sorted by (src, dst, src row); counts per (src, dst) pair
// are the all_to_all_v shape. The backward pass moves the gradients by the transposed plan (src and
// dst swapped), so one executor (run::reshard in run/reshard.hpp) serves both directions. Rows are
// hidden-size vectors: the executor moves `width` elements per row. Plans only: nothing here communicates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../seq/hdp.hpp"
#include "../seq/types.hpp"
#include "reorder.hpp"

namespace hetmesh::balance {

/// Where an item's embedding rows go in its sample: row r is the sample's token position + r.
struct item_span {
  std::int64_t sample_id = 0;  ///< sample the item belongs to
  int item = 0;                ///< item index within the sample
  std::int64_t position = 0;   ///< token position of the item's first row
  std::int64_t rows = 0;       ///< embedding rows (the item's tokens)
};

/// Rows [row_begin, row_end) of an item, produced on encoder `rank` at row `offset` of its output buffer.
struct encoder_block {
  std::int64_t sample_id = 0;  ///< sample the item belongs to
  int item = 0;                ///< item index within the sample
  int rank = 0;                ///< encoder rank that produces it
  std::int64_t row_begin = 0;  ///< first row of the item in this block
  std::int64_t row_end = 0;    ///< one past the last row
  std::int64_t offset = 0;     ///< row in the rank's output buffer
};

/// Token positions `tokens` of a sample, consumed on LLM `rank` at row `offset` of its input buffer.
struct llm_block {
  std::int64_t sample_id = 0;  ///< sample the tokens belong to
  int rank = 0;                ///< LLM rank that consumes them
  seq::token_range tokens;     ///< token positions within the sample
  std::int64_t offset = 0;     ///< row in the rank's input buffer
};

/// One contiguous copy: `rows` rows from src's buffer at src_offset to dst's buffer at dst_offset.
struct reshard_run {
  int src = 0;                  ///< sending rank
  int dst = 0;                  ///< receiving rank
  std::int64_t src_offset = 0;  ///< first row in the sender's buffer
  std::int64_t dst_offset = 0;  ///< first row in the receiver's buffer
  std::int64_t rows = 0;        ///< rows copied
  friend constexpr bool operator==(const reshard_run&, const reshard_run&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The reshard plan of one step over `ranks` ranks. counts[src * ranks + dst] = rows from src to dst.
struct reshard_plan {
  int ranks = 0;                     ///< ranks of the exchange
  std::vector<reshard_run> runs;     ///< contiguous copies, by (src, dst, src_offset)
  std::vector<std::int64_t> counts;  ///< ranks x ranks row counts, row = sender

  /// The backward plan: every run reversed; same rows, same pairs transposed. O(runs log runs).
  [[nodiscard]] HETMESH_COMPILED reshard_plan transposed() const;
  /// Rows moved in all, self-copies included. O(ranks^2).
  [[nodiscard]] HETMESH_COMPILED std::int64_t total_rows() const noexcept;
  friend bool operator==(const reshard_plan&, const reshard_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Plans the forward reshard. Pre: ranks in [0, ranks); the encoder blocks of each item cover its rows
/// [0, rows) exactly once; the LLM blocks of a sample do not overlap and cover the positions of every
/// item (invalid_argument naming the first row produced twice, or never, or consumed nowhere).
/// Post: every item row is moved exactly once, to the LLM block holding its position; runs contiguous
/// on both sides are merged. Pure; deterministic; O(B log B) for B blocks plus the runs. Not collective.
[[nodiscard]] HETMESH_COMPILED reshard_plan plan_reshard(int ranks, std::span<const item_span> items,
                                                         std::span<const encoder_block> produced,
                                                         std::span<const llm_block> consumed);

/// The LLM blocks of an HDP plan: on each pool rank, its micro-batches in execution order, each
/// segment (a whole packed sequence, or a zigzag chunk of a ring) at consecutive rows of the rank's
/// input buffer. O(segments).
[[nodiscard]] HETMESH_COMPILED std::vector<llm_block> llm_blocks_from_hdp(const seq::hdp_plan& plan);

/// Both sides of a grouped-reorder plan as reshard blocks (see blocks_from_reorder).
struct reorder_blocks {
  std::vector<encoder_block> encoder;  ///< one block per encoder item, whole
  std::vector<llm_block> llm;          ///< one block per sample, whole
};

/// The blocks of a grouped-reorder plan, beside llm_blocks_from_hdp: each encoder item whole on its
/// encoder rank, each sample's tokens [0, tokens) whole on its LLM rank, both at consecutive rows of the
/// rank's buffer in canonical (sample id, item) order. Reads the lengths the plan carries (no second
/// gather). Together with the items' positions in their samples, what plan_reshard takes. Pure; O(samples
/// + items).
[[nodiscard]] HETMESH_COMPILED reorder_blocks blocks_from_reorder(const reorder_plan& plan);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::reshard_run> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::reshard_run& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "run({}->{}, rows {}@{} -> @{})", r.src, r.dst, r.rows, r.src_offset,
                              r.dst_offset);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::reshard_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::reshard_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "reshard_plan(ranks={}, runs={}, rows={})", p.ranks, p.runs.size(),
                              p.total_rows());
  }
};

template <>
struct fmt::formatter<hetmesh::balance::item_span> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::item_span& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "item({}, {}) at {} x {}", s.sample_id, s.item, s.position, s.rows);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::encoder_block> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::encoder_block& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "enc({}, {}) rows [{}, {}) on {}@{}", b.sample_id, b.item,
                              b.row_begin, b.row_end, b.rank, b.offset);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::llm_block> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::llm_block& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "llm({}) {} on {}@{}", b.sample_id, b.tokens, b.rank, b.offset);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void reshard_run::hash_append(hasher& h) const {
  append_all(h, src, dst, src_offset, dst_offset, rows);
}

HETMESH_COMPILED reshard_plan reshard_plan::transposed() const {
  reshard_plan t;
  t.ranks = ranks;
  t.runs.reserve(runs.size());
  for (const auto& r : runs) t.runs.push_back({r.dst, r.src, r.dst_offset, r.src_offset, r.rows});
  hetmesh::indirect_sort(t.runs.begin(), t.runs.end(), [](const reshard_run& a, const reshard_run& b) {
    return std::tie(a.src, a.dst, a.src_offset) < std::tie(b.src, b.dst, b.src_offset);
  });
  const auto n = static_cast<std::size_t>(ranks);
  t.counts.assign(n * n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) t.counts[j * n + i] = counts[i * n + j];
  return t;
}

HETMESH_COMPILED std::int64_t reshard_plan::total_rows() const noexcept {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

HETMESH_COMPILED void reshard_plan::hash_append(hasher& h) const { append_all(h, ranks, runs, counts); }

HETMESH_COMPILED reshard_plan plan_reshard(int ranks, std::span<const item_span> items,
                                           std::span<const encoder_block> produced,
                                           std::span<const llm_block> consumed) {
  if (ranks < 1) throw_error<invalid_argument>("balance::plan_reshard: ranks = {}; expected >= 1", ranks);
  auto key = [](std::int64_t s, int i) { return std::pair<std::int64_t, int>(s, i); };
  std::vector<item_span> its(items.begin(), items.end());
  hetmesh::indirect_sort(its.begin(), its.end(), [&](const item_span& a, const item_span& b) {
    return key(a.sample_id, a.item) < key(b.sample_id, b.item);
  });
  for (std::size_t k = 1; k < its.size(); ++k)
    if (key(its[k].sample_id, its[k].item) == key(its[k - 1].sample_id, its[k - 1].item))
      throw_error<invalid_argument>("balance::plan_reshard: item ({}, {}) listed twice", its[k].sample_id,
                                    its[k].item);
  std::vector<llm_block> llm(consumed.begin(), consumed.end());
  hetmesh::indirect_sort(llm.begin(), llm.end(), [](const llm_block& a, const llm_block& b) {
    return std::tie(a.sample_id, a.tokens.begin) < std::tie(b.sample_id, b.tokens.begin);
  });
  for (std::size_t k = 0; k < llm.size(); ++k) {
    if (llm[k].rank < 0 || llm[k].rank >= ranks || llm[k].tokens.begin < 0 || llm[k].tokens.size() < 0)
      throw_error<invalid_argument>(
          "balance::plan_reshard: LLM block of sample {} on rank {} {} is malformed; expected "
          "a rank in [0, {}) and a valid range",
          llm[k].sample_id, llm[k].rank, llm[k].tokens, ranks);
    if (k > 0 && llm[k].sample_id == llm[k - 1].sample_id && llm[k].tokens.begin < llm[k - 1].tokens.end)
      throw_error<invalid_argument>(
          "balance::plan_reshard: LLM blocks {} and {} of sample {} overlap; expected each "
          "token on one rank",
          llm[k - 1].tokens, llm[k].tokens, llm[k].sample_id);
  }
  std::vector<encoder_block> enc(produced.begin(), produced.end());
  hetmesh::indirect_sort(enc.begin(), enc.end(), [](const encoder_block& a, const encoder_block& b) {
    return std::tie(a.sample_id, a.item, a.row_begin) < std::tie(b.sample_id, b.item, b.row_begin);
  });
  std::vector<reshard_run> runs;
  std::size_t e = 0;
  for (const auto& it : its) {
    std::int64_t covered = 0;
    for (; e < enc.size() && key(enc[e].sample_id, enc[e].item) == key(it.sample_id, it.item); ++e) {
      const auto& b = enc[e];
      if (b.rank < 0 || b.rank >= ranks || b.row_begin != covered || b.row_end <= b.row_begin ||
          b.row_end > it.rows)
        throw_error<invalid_argument>(
            "balance::plan_reshard: item ({}, {}) of {} rows: encoder block [{}, {}) on rank {} "
            "does not continue the rows covered so far ([0, {})); expected blocks that tile the "
            "item once",
            it.sample_id, it.item, it.rows, b.row_begin, b.row_end, b.rank, covered);
      // Positions [p, q) of the sample; walk the LLM blocks of the sample that intersect them.
      std::int64_t p = it.position + b.row_begin;
      const std::int64_t q = it.position + b.row_end;
      auto lb =
          std::upper_bound(llm.begin(), llm.end(), std::pair<std::int64_t, std::int64_t>(it.sample_id, p),
                           [](const std::pair<std::int64_t, std::int64_t>& v, const llm_block& x) {
                             return v < std::pair<std::int64_t, std::int64_t>(x.sample_id, x.tokens.begin);
                           });
      if (lb != llm.begin()) --lb;
      while (p < q) {
        if (lb == llm.end() || lb->sample_id != it.sample_id || lb->tokens.begin > p || lb->tokens.end <= p) {
          if (lb != llm.end() && lb->sample_id == it.sample_id && lb->tokens.end <= p) {
            ++lb;
            continue;
          }
          throw_error<invalid_argument>(
              "balance::plan_reshard: position {} of sample {} (item {}) is on no LLM block; "
              "expected the LLM blocks to cover every item position",
              p, it.sample_id, it.item);
        }
        const std::int64_t end = std::min(q, lb->tokens.end);
        runs.push_back({b.rank, lb->rank, b.offset + (p - it.position - b.row_begin),
                        lb->offset + (p - lb->tokens.begin), end - p});
        p = end;
        ++lb;
      }
      covered = b.row_end;
    }
    if (covered != it.rows)
      throw_error<invalid_argument>(
          "balance::plan_reshard: item ({}, {}) has {} rows but encoder blocks cover [0, {}); "
          "expected every row produced once",
          it.sample_id, it.item, it.rows, covered);
  }
  if (e != enc.size())
    throw_error<invalid_argument>(
        "balance::plan_reshard: encoder block of sample {} item {} names no listed item", enc[e].sample_id,
        enc[e].item);
  hetmesh::indirect_sort(runs.begin(), runs.end(), [](const reshard_run& a, const reshard_run& b) {
    return std::tie(a.src, a.dst, a.src_offset) < std::tie(b.src, b.dst, b.src_offset);
  });
  reshard_plan plan;
  plan.ranks = ranks;
  for (const auto& r : runs) {
    if (!plan.runs.empty()) {
      auto& last = plan.runs.back();
      if (last.src == r.src && last.dst == r.dst && last.src_offset + last.rows == r.src_offset &&
          last.dst_offset + last.rows == r.dst_offset) {
        last.rows += r.rows;
        continue;
      }
    }
    plan.runs.push_back(r);
  }
  const auto n = static_cast<std::size_t>(ranks);
  plan.counts.assign(n * n, 0);
  for (const auto& r : plan.runs)
    plan.counts[static_cast<std::size_t>(r.src) * n + static_cast<std::size_t>(r.dst)] += r.rows;
  return plan;
}

HETMESH_COMPILED std::vector<llm_block> llm_blocks_from_hdp(const seq::hdp_plan& plan) {
  std::vector<llm_block> out;
  for (std::size_t r = 0; r < plan.per_rank.size(); ++r) {
    std::int64_t off = 0;
    for (const auto& mb : plan.per_rank[r])
      for (const auto& sg : mb.segments) {
        out.push_back({sg.seq_id, static_cast<int>(r), sg.tokens, off});
        off += sg.tokens.size();
      }
  }
  return out;
}

HETMESH_COMPILED reorder_blocks blocks_from_reorder(const reorder_plan& plan) {
  const std::size_t n = plan.sample_ids.size();
  if (plan.tokens.size() != n || plan.item_offset.size() != n + 1 ||
      plan.item_tokens.size() != plan.encoder_rank.size() ||
      plan.encoder_rank.size() != static_cast<std::size_t>(plan.item_offset.back()))
    throw_error<invalid_argument>(
        "balance::blocks_from_reorder: the plan's arrays disagree ({} samples, {} lengths, {} item offsets, "
        "{} items, {} item lengths); expected a plan from plan_grouped_reorder",
        n, plan.tokens.size(), plan.item_offset.size(), plan.encoder_rank.size(), plan.item_tokens.size());
  reorder_blocks out;
  const auto nr = static_cast<std::size_t>(plan.ranks);
  std::vector<std::int64_t> enc_rows(nr, 0), llm_rows(nr, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const int r = plan.llm_rank[i];
    auto& off = llm_rows[static_cast<std::size_t>(r)];
    out.llm.push_back({plan.sample_ids[i], r, {0, plan.tokens[i]}, off});
    off += plan.tokens[i];
    for (auto j = plan.item_offset[i]; j < plan.item_offset[i + 1]; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const int e = plan.encoder_rank[u];
      auto& eoff = enc_rows[static_cast<std::size_t>(e)];
      out.encoder.push_back(
          {plan.sample_ids[i], static_cast<int>(j - plan.item_offset[i]), e, 0, plan.item_tokens[u], eoff});
      eoff += plan.item_tokens[u];
    }
  }
  return out;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
