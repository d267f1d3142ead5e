// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: token dispatch plans. The ranks that load data (owners) hold whole sequences; a
// partition plan (seq::cp_partition, seq::hdp_plan, or any list of token ranges per rank) says which
// rank computes which tokens of which sequence, and at which row of its buffer. plan_token_dispatch
// turns the two into one reshard_plan of token rows, checking that every token of every sequence is
// planned exactly once; run::dispatch_tokens (run/dispatch.hpp) executes it with one all_to_all_v and
// run::gather_tokens moves rows back by the transposed plan (outputs, gradients). Plans only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../seq/cp.hpp"
#include "../seq/hdp.hpp"
#include "../seq/types.hpp"
#include "reshard.hpp"

namespace hetmesh::balance {

/// A whole sequence before dispatch: its tokens are rows [offset, offset + length) of its owner
/// rank's source buffer, token t at row offset + t.
struct token_source {
  std::int64_t seq_id = 0;  ///< the sequence
  int rank = 0;             ///< owner (loader) rank holding it whole
  std::int64_t offset = 0;  ///< first row in the owner's buffer
  std::int64_t length = 0;  ///< tokens
  friend constexpr bool operator==(const token_source&, const token_source&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Sources of owners that hold their sequences back to back: rank r holds per_rank[r] in order from
/// row 0. Pure; O(sequences).
[[nodiscard]] HETMESH_COMPILED std::vector<token_source> packed_sources(
    std::span<const std::vector<seq::seq_desc>> per_rank);

/// The target blocks of a context-parallel partition of one packed stream: chunk k of document d on
/// rank r becomes llm_block{seq_ids[d], r, chunk positions, chunk local_offset}. Pad positions (at or
/// past a document's length) stay in the block; plan_token_dispatch fills no pad row. Pre:
/// seq_ids.size() == number of documents (invalid_argument). Pure; O(chunks).
[[nodiscard]] HETMESH_COMPILED std::vector<llm_block> dispatch_targets(const seq::cp_partition& p,
                                                                       std::span<const std::int64_t> seq_ids);

/// The target blocks of an HDP plan: llm_blocks_from_hdp (each pool rank's micro-batches in execution
/// order, segments at consecutive rows). Pure; O(segments).
[[nodiscard]] HETMESH_COMPILED std::vector<llm_block> dispatch_targets(const seq::hdp_plan& p);

/// A token dispatch over `ranks` ranks: the row moves (tokens as rows) and each rank's buffer sizes.
struct dispatch_plan {
  int ranks = 0;                          ///< ranks of the exchange
  reshard_plan moves;                     ///< owner rows -> target rows; moves.transposed() gathers back
  std::vector<std::int64_t> source_rows;  ///< per rank: rows its source buffer must hold
  std::vector<std::int64_t> target_rows;  ///< per rank: rows its target buffer must hold (pads included)
  std::int64_t tokens = 0;                ///< tokens moved (every sequence token, once)
  friend bool operator==(const dispatch_plan&, const dispatch_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Plans the dispatch of `sources` (whole sequences on their owners) to `targets` (token ranges on the
/// ranks that compute them). Pre, each checked with invalid_argument naming the sequence, rank and
/// rows: ranks >= 1; every rank in [0, ranks); sequence ids unique among sources; lengths, offsets >= 0;
/// sources of one rank do not overlap, nor do the targets of one rank (so the inverse is well defined);
/// every target names a known sequence; the in-range parts of a sequence's targets cover
/// [0, length) exactly once (positions at or past length are pads: allowed, moved nowhere).
/// Post: every token of every source moves exactly once, to the target row holding its position;
/// runs sorted by (src, dst, src row) and merged when contiguous on both sides. Pure; deterministic;
/// O((S + B) log(S + B)) for S sources and B targets. Not collective.
[[nodiscard]] HETMESH_COMPILED dispatch_plan plan_token_dispatch(int ranks,
                                                                 std::span<const token_source> sources,
                                                                 std::span<const llm_block> targets);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::token_source> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::token_source& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "source(seq {} x {} on {}@{})", s.seq_id, s.length, s.rank,
                              s.offset);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::dispatch_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::dispatch_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "dispatch_plan(ranks={}, tokens={}, runs={})", p.ranks, p.tokens,
                              p.moves.runs.size());
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void token_source::hash_append(hasher& h) const {
  append_all(h, seq_id, rank, offset, length);
}

HETMESH_COMPILED std::vector<token_source> packed_sources(
    std::span<const std::vector<seq::seq_desc>> per_rank) {
  std::vector<token_source> out;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    std::int64_t off = 0;
    for (const auto& s : per_rank[r]) {
      out.push_back({s.id, static_cast<int>(r), off, s.length});
      off += s.length;
    }
  }
  return out;
}

HETMESH_COMPILED std::vector<llm_block> dispatch_targets(const seq::cp_partition& p,
                                                         std::span<const std::int64_t> seq_ids) {
  const auto docs = p.cu_seqlens.empty() ? std::size_t{0} : p.cu_seqlens.size() - 1;
  if (seq_ids.size() != docs)
    throw_error<invalid_argument>(
        "balance::dispatch_targets: {} sequence ids for a partition of {} documents; expected one id per "
        "document",
        seq_ids.size(), docs);
  std::vector<llm_block> out;
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    for (const auto& ch : p.ranks[r].chunks)
      out.push_back(
          {seq_ids[static_cast<std::size_t>(ch.doc)], static_cast<int>(r), ch.positions, ch.local_offset});
  return out;
}

HETMESH_COMPILED std::vector<llm_block> dispatch_targets(const seq::hdp_plan& p) {
  return llm_blocks_from_hdp(p);
}

HETMESH_COMPILED void dispatch_plan::hash_append(hasher& h) const {
  append_all(h, ranks, moves, source_rows, target_rows, tokens);
}

HETMESH_COMPILED dispatch_plan plan_token_dispatch(int ranks, std::span<const token_source> sources,
                                                   std::span<const llm_block> targets) {
  constexpr const char* op = "balance::plan_token_dispatch";
  if (ranks < 1) throw_error<invalid_argument>("{}: ranks = {}; expected >= 1", op, ranks);
  dispatch_plan plan;
  plan.ranks = ranks;
  const auto n = static_cast<std::size_t>(ranks);
  plan.source_rows.assign(n, 0);
  plan.target_rows.assign(n, 0);
  std::vector<token_source> src(sources.begin(), sources.end());
  for (const auto& s : src)
    if (s.rank < 0 || s.rank >= ranks || s.offset < 0 || s.length < 0)
      throw_error<invalid_argument>(
          "{}: sequence {} has source rank {}, offset {}, length {}; expected a rank in [0, {}) and offset, "
          "length >= 0",
          op, s.seq_id, s.rank, s.offset, s.length, ranks);
  auto overlap_check = [&](auto& v, auto rank_of, auto begin_of, auto end_of, const char* what) {
    hetmesh::indirect_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
      return std::tuple(rank_of(a), begin_of(a)) < std::tuple(rank_of(b), begin_of(b));
    });
    std::size_t reach = v.size();  // the block of this rank, so far, that ends last
    for (std::size_t k = 0; k < v.size(); ++k) {
      if (end_of(v[k]) == begin_of(v[k])) continue;  // an empty block uses no row
      if (reach != v.size() && rank_of(v[reach]) == rank_of(v[k]) && end_of(v[reach]) > begin_of(v[k]))
        throw_error<invalid_argument>(
            "{}: {} rows [{}, {}) and [{}, {}) overlap on rank {}; expected each row of a rank's buffer "
            "used once",
            op, what, begin_of(v[reach]), end_of(v[reach]), begin_of(v[k]), end_of(v[k]), rank_of(v[k]));
      if (reach == v.size() || rank_of(v[reach]) != rank_of(v[k]) || end_of(v[k]) > end_of(v[reach]))
        reach = k;
    }
  };
  overlap_check(
      src, [](const token_source& s) { return s.rank; }, [](const token_source& s) { return s.offset; },
      [](const token_source& s) { return s.offset + s.length; }, "source");
  for (const auto& s : src) {
    auto& rows = plan.source_rows[static_cast<std::size_t>(s.rank)];
    rows = std::max(rows, s.offset + s.length);
  }
  hetmesh::indirect_sort(src.begin(), src.end(),
                         [](const token_source& a, const token_source& b) { return a.seq_id < b.seq_id; });
  for (std::size_t k = 1; k < src.size(); ++k)
    if (src[k].seq_id == src[k - 1].seq_id)
      throw_error<invalid_argument>("{}: sequence {} has two sources (ranks {} and {}); expected one owner",
                                    op, src[k].seq_id, src[k - 1].rank, src[k].rank);
  std::vector<llm_block> tgt(targets.begin(), targets.end());
  for (const auto& t : tgt)
    if (t.rank < 0 || t.rank >= ranks || t.offset < 0 || t.tokens.begin < 0 || t.tokens.end < t.tokens.begin)
      throw_error<invalid_argument>(
          "{}: target of sequence {} on rank {} (tokens {}, row {}) is malformed; expected a rank in [0, "
          "{}), "
          "row >= 0 and 0 <= begin <= end",
          op, t.sample_id, t.rank, t.tokens, t.offset, ranks);
  overlap_check(
      tgt, [](const llm_block& b) { return b.rank; }, [](const llm_block& b) { return b.offset; },
      [](const llm_block& b) { return b.offset + b.tokens.size(); }, "target");
  for (const auto& t : tgt) {
    auto& rows = plan.target_rows[static_cast<std::size_t>(t.rank)];
    rows = std::max(rows, t.offset + t.tokens.size());
  }
  hetmesh::indirect_sort(tgt.begin(), tgt.end(), [](const llm_block& a, const llm_block& b) {
    return std::tie(a.sample_id, a.tokens.begin, a.rank) < std::tie(b.sample_id, b.tokens.begin, b.rank);
  });
  std::vector<reshard_run> runs;
  std::size_t k = 0;
  auto unknown = [&] {
    throw_error<invalid_argument>(
        "{}: a target on rank {} names sequence {}, which has no source; expected every target sequence held "
        "by an owner",
        op, tgt[k].rank, tgt[k].sample_id);
  };
  for (const auto& s : src) {
    if (k < tgt.size() && tgt[k].sample_id < s.seq_id) unknown();
    std::int64_t covered = 0;  // tokens [0, covered) of s are planned
    for (; k < tgt.size() && tgt[k].sample_id == s.seq_id; ++k) {
      const auto& t = tgt[k];
      const std::int64_t b = t.tokens.begin, e = std::min(t.tokens.end, s.length);
      if (b >= e) continue;  // an empty block, or pads only
      if (b != covered)
        throw_error<invalid_argument>(
            "{}: sequence {} (length {}): {} on rank {}; expected tokens from {} next (token {} is {})", op,
            s.seq_id, s.length, t.tokens, t.rank, covered, std::min(b, covered),
            b > covered ? "planned on no rank" : "planned twice");
      runs.push_back({s.rank, t.rank, s.offset + b, t.offset, e - b});
      covered = e;
    }
    if (covered != s.length)
      throw_error<invalid_argument>(
          "{}: sequence {} (length {}, on rank {}): tokens [{}, {}) are planned on no rank; expected every "
          "token "
          "planned once",
          op, s.seq_id, s.length, s.rank, covered, s.length);
    plan.tokens += s.length;
  }
  if (k != tgt.size()) unknown();
  hetmesh::indirect_sort(runs.begin(), runs.end(), [](const reshard_run& a, const reshard_run& b) {
    return std::tie(a.src, a.dst, a.src_offset) < std::tie(b.src, b.dst, b.src_offset);
  });
  plan.moves.ranks = ranks;
  for (const auto& r : runs) {
    if (!plan.moves.runs.empty()) {
      auto& last = plan.moves.runs.back();
      if (last.src == r.src && last.dst == r.dst && last.src_offset + last.rows == r.src_offset &&
          last.dst_offset + last.rows == r.dst_offset) {
        last.rows += r.rows;
        continue;
      }
    }
    plan.moves.runs.push_back(r);
  }
  plan.moves.counts.assign(n * n, 0);
  for (const auto& r : plan.moves.runs)
    plan.moves.counts[static_cast<std::size_t>(r.src) * n + static_cast<std::size_t>(r.dst)] += r.rows;
  return plan;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
