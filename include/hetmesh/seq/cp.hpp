// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: context-parallel partitions of one packed stream of documents over cp ranks.
//   contiguous  the stream cut into cp near-equal pieces (causal work grows with the rank);
//   zigzag      one sequence in 2cp chunks, rank r takes chunks r and 2cp-1-r, in that order:
//               identical to Megatron-LM's get_batch_on_this_cp_rank (per-sequence balancing; with
//               cp = 1 any length passes through unchanged, as there);
//   thd         the same per document of a packed (THD) stream, identical to TransformerEngine's
//               thd_get_partitioned_indices: each document must be a multiple of 2cp, or is padded
//               at its own end to one (TE's pad_thd_sequences_for_cp), when padding is asked for;
//               position ids (pads included) are TE's generate_positional_ids_for_cp.
// Every partition lists, per rank, the stream indices of its tokens, their position ids, local
// cu_seqlens and the chunks it holds; and, per stream token, its owner (the inverse map).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/numeric.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// Which context-parallel layout made a partition: Megatron-LM's zigzag for one sequence,
/// TransformerEngine's THD per-document split for packed ones, or the contiguous baseline. It records
/// what a plan is; the choice itself is a type (seq::cp_zigzag, cp_thd, cp_contiguous: partition.hpp).
enum class cp_scheme { contiguous, zigzag, thd };

/// What a partition was made with: scheme, degree, and whether documents were padded to a multiple of
/// 2cp (recorded in cp_partition, so its hash names the layout).
struct cp_policy {
  cp_scheme scheme = cp_scheme::thd;  ///< zigzag or thd
  int cp = 1;                         ///< context-parallel ranks
  bool pad = false;                   ///< pad documents to a multiple of 2 cp

  friend constexpr bool operator==(const cp_policy&, const cp_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// A run of consecutive tokens of one document held by one rank: document index (in the input),
/// chunk ordinal (zigzag/thd: 0..2cp-1; contiguous: the rank), positions inside the (padded)
/// document, and where the run starts in the rank's local buffer.
struct cp_chunk {
  std::int64_t doc = 0;           ///< document index in the batch
  int chunk = 0;                  ///< chunk index k of 2 cp
  token_range positions;          ///< token positions within the document
  std::int64_t local_offset = 0;  ///< offset of the chunk in the rank's buffer

  friend constexpr bool operator==(const cp_chunk&, const cp_chunk&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One rank's share.
struct cp_rank_shard {
  std::vector<std::int64_t> token_index;   ///< per local token: index in the padded stream
  std::vector<std::int64_t> source_index;  ///< per local token: index in the input stream; -1 = padding
  std::vector<std::int64_t> position_ids;  ///< per local token: position in its document (pads continue)
  std::vector<std::int64_t> cu_seqlens;    ///< local per-document boundaries (documents with tokens here)
  std::vector<std::int64_t> local_docs;    ///< the documents of cu_seqlens, in order
  std::vector<cp_chunk> chunks;            ///< this rank's chunks, in buffer order

  /// Tokens this rank holds.
  [[nodiscard]] std::int64_t tokens() const noexcept { return static_cast<std::int64_t>(token_index.size()); }
  friend bool operator==(const cp_rank_shard&, const cp_rank_shard&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The partition of one stream.
struct cp_partition {
  cp_policy policy{};                           ///< the policy it was made with
  std::vector<std::int64_t> cu_seqlens;         ///< input stream
  std::vector<std::int64_t> cu_seqlens_padded;  ///< padded stream (== cu_seqlens without padding)
  std::vector<cp_rank_shard> ranks;             ///< per cp rank, its shard
  std::vector<int> owner_rank;                  ///< per padded-stream token: its rank
  std::vector<std::int64_t> owner_local;        ///< per padded-stream token: its local index there

  /// Tokens after padding (the last padded cumulative length).
  [[nodiscard]] std::int64_t padded_tokens() const noexcept { return cu_seqlens_padded.back(); }
  friend bool operator==(const cp_partition&, const cp_partition&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

namespace detail {
HETMESH_COMPILED void check_cp_args(std::span<const std::int64_t> lens, int cp, const char* who);

/// Appends a run of a document to a shard and fills the bookkeeping.
HETMESH_COMPILED void add_run(cp_partition& p, int rank, std::int64_t doc, int chunk, token_range pos,
                              std::int64_t unpadded_len);

HETMESH_COMPILED void close_shards(cp_partition& p);
}  // namespace detail

/// Contiguous split: the stream of documents `lengths` (no padding) cut at floor(k*T/cp). Pure;
/// O(T). Causal work is unbalanced (later ranks see longer prefixes): kept as the baseline.
[[nodiscard]] HETMESH_COMPILED cp_partition partition_contiguous(std::span<const std::int64_t> lengths,
                                                                 int cp);

namespace detail {

/// The split behind partition_thd and partition_zigzag; `who` names the caller in errors.
HETMESH_COMPILED cp_partition partition_2cp(std::span<const std::int64_t> lengths, int cp, bool pad,
                                            cp_scheme scheme, const char* who);

}  // namespace detail

/// Per-document zigzag of a packed stream (TransformerEngine THD). Each document of length L is
/// cut into 2cp chunks of L/2cp; rank r holds, per document in stream order, chunks r then
/// 2cp-1-r. With pad = true, a document is first padded at its end to the next multiple of 2cp
/// (pad tokens: source_index -1, positions continuing the document, as TE's
/// generate_positional_ids_for_cp numbers them: see padded_position_ids); with pad = false, a length
/// not divisible by 2cp is an error (TE asserts the same), except with cp = 1, where every length
/// passes through unchanged (TE's get_batch_on_this_cp_rank returns the batch as it is).
/// Preconditions: cp >= 1, lengths >= 0. Postconditions: every padded-stream token is on exactly one
/// rank; all ranks hold equal token counts and equal causal work per document. Pure; O(T).
[[nodiscard]] HETMESH_COMPILED cp_partition partition_thd(std::span<const std::int64_t> lengths, int cp,
                                                          bool pad = false);

/// Zigzag of one sequence (Megatron-LM get_batch_on_this_cp_rank): the THD split of a single
/// document, tagged cp_scheme::zigzag; errors name partition_zigzag. With cp = 1 and pad = false any
/// length passes through unchanged, as Megatron's does; otherwise the length must be a multiple of
/// 2cp, or pad = true pads it at its end to one.
[[nodiscard]] HETMESH_COMPILED cp_partition partition_zigzag(std::int64_t length, int cp, bool pad = false);

/// Position ids of a packed stream whose documents are padded at their ends to multiples of
/// `divisibility` (2cp for THD context parallelism): each document counts 0, 1, ... through its pad
/// tokens. Identical to TransformerEngine's generate_positional_ids_for_cp(cu_seqlens, divisibility);
/// partition_thd(lengths, cp, true) gives every rank these ids at its token_index. Pre: cu_seqlens
/// starts at 0 and does not decrease, divisibility >= 1 (else invalid_argument). Pure; O(padded tokens).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> padded_position_ids(
    std::span<const std::int64_t> cu_seqlens, std::int64_t divisibility);

/// Causal attention work of one shard: the number of (query, key) pairs its queries compute under a
/// per-document causal mask, i.e. the sum of (position + 1). Pure; O(tokens).
[[nodiscard]] inline std::int64_t causal_work(const cp_rank_shard& sh) noexcept {
  std::int64_t w = 0;
  for (auto p : sh.position_ids) w += p + 1;
  return w;
}

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::cp_scheme> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::cp_scheme s, FormatContext& ctx) const -> decltype(ctx.out()) {
    using hetmesh::seq::cp_scheme;
    return hetmesh::format_to(ctx.out(), "{}",
                              s == cp_scheme::contiguous ? "contiguous"
                              : s == cp_scheme::zigzag   ? "zigzag"
                                                         : "thd");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "cp_policy{{{}, cp={}, pad={}}}", p.scheme, p.cp, p.pad);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_chunk> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_chunk& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "d{}c{}{}@{}", c.doc, c.chunk, c.positions, c.local_offset);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_rank_shard> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_rank_shard& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "shard{{tokens={}, cu_seqlens={}, chunks={}}}", s.tokens(),
                              s.cu_seqlens, s.chunks);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_partition> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_partition& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "cp_partition{{{}, cu_seqlens_padded={}, ranks={}}}", p.policy,
                              p.cu_seqlens_padded, p.ranks);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void cp_policy::hash_append(hasher& h) const { append_all(h, scheme, cp, pad); }

HETMESH_COMPILED void cp_chunk::hash_append(hasher& h) const {
  append_all(h, doc, chunk, positions, local_offset);
}

HETMESH_COMPILED void cp_rank_shard::hash_append(hasher& h) const {
  append_all(h, token_index, source_index, position_ids, cu_seqlens, local_docs, chunks);
}

HETMESH_COMPILED void cp_partition::hash_append(hasher& h) const {
  append_all(h, policy, cu_seqlens, cu_seqlens_padded, ranks, owner_rank, owner_local);
}

}  // namespace hetmesh::seq

namespace hetmesh::seq::detail {

HETMESH_COMPILED void check_cp_args(std::span<const std::int64_t> lens, int cp, const char* who) {
  if (cp < 1) throw_error<invalid_argument>("{}: cp = {}; expected >= 1", who, cp);
  for (std::size_t i = 0; i < lens.size(); ++i)
    if (lens[i] < 0)
      throw_error<invalid_argument>("{}: document {} has length {}; expected >= 0", who, i, lens[i]);
}

HETMESH_COMPILED void add_run(cp_partition& p, int rank, std::int64_t doc, int chunk, token_range pos,
                              std::int64_t unpadded_len) {
  auto& sh = p.ranks[static_cast<std::size_t>(rank)];
  if (pos.size() <= 0) return;
  const std::int64_t base = p.cu_seqlens_padded[static_cast<std::size_t>(doc)];
  const std::int64_t src = p.cu_seqlens[static_cast<std::size_t>(doc)];
  sh.chunks.push_back({doc, chunk, pos, sh.tokens()});
  if (sh.local_docs.empty() || sh.local_docs.back() != doc) {
    sh.local_docs.push_back(doc);
    sh.cu_seqlens.push_back(sh.tokens());
  }
  for (std::int64_t t = pos.begin; t < pos.end; ++t) {
    const std::int64_t g = base + t;
    p.owner_rank[static_cast<std::size_t>(g)] = rank;
    p.owner_local[static_cast<std::size_t>(g)] = sh.tokens();
    sh.token_index.push_back(g);
    sh.source_index.push_back(t < unpadded_len ? src + t : -1);
    sh.position_ids.push_back(t);
  }
}

HETMESH_COMPILED void close_shards(cp_partition& p) {
  for (auto& sh : p.ranks) sh.cu_seqlens.push_back(sh.tokens());
}

}  // namespace hetmesh::seq::detail

namespace hetmesh::seq {

HETMESH_COMPILED cp_partition partition_contiguous(std::span<const std::int64_t> lengths, int cp) {
  detail::check_cp_args(lengths, cp, "partition_contiguous");
  cp_partition p;
  p.policy = {cp_scheme::contiguous, cp, false};
  p.cu_seqlens = prefix_sums(lengths);
  p.cu_seqlens_padded = p.cu_seqlens;
  const std::int64_t total = p.cu_seqlens.back();
  p.ranks.resize(static_cast<std::size_t>(cp));
  p.owner_rank.assign(static_cast<std::size_t>(total), -1);
  p.owner_local.assign(static_cast<std::size_t>(total), -1);
  std::size_t doc = 0;
  for (int r = 0; r < cp; ++r) {
    const std::int64_t lo = r * total / cp, hi = (r + 1) * total / cp;
    for (std::int64_t at = lo; at < hi;) {
      while (p.cu_seqlens[doc + 1] <= at) ++doc;
      const std::int64_t end = std::min(hi, p.cu_seqlens[doc + 1]);
      detail::add_run(p, r, static_cast<std::int64_t>(doc), r,
                      {at - p.cu_seqlens[doc], end - p.cu_seqlens[doc]}, lengths[doc]);
      at = end;
    }
  }
  detail::close_shards(p);
  return p;
}

}  // namespace hetmesh::seq

namespace hetmesh::seq::detail {

HETMESH_COMPILED cp_partition partition_2cp(std::span<const std::int64_t> lengths, int cp, bool pad,
                                            cp_scheme scheme, const char* who) {
  check_cp_args(lengths, cp, who);
  const std::int64_t n = 2 * static_cast<std::int64_t>(cp);
  // cp = 1 without padding: nothing is split, so any length passes through unchanged (Megatron's
  // get_batch_on_this_cp_rank and TE's return the batch as it is when the cp group has one rank).
  const bool whole = cp == 1 && !pad;
  std::vector<std::int64_t> padded(lengths.begin(), lengths.end());
  for (std::size_t i = 0; i < padded.size(); ++i) {
    if (whole || padded[i] % n == 0) continue;
    if (!pad) {
      if (scheme == cp_scheme::zigzag) {
        throw_error<invalid_argument>(
            "{}: the sequence has {} tokens, not a multiple of 2*cp = {}; pad it (pad = true pads it at its "
            "end "
            "to a multiple of 2*cp) or pick cp with 2*cp dividing its length",
            who, padded[i], n);
      }
      throw_error<invalid_argument>(
          "{}: document {} has {} tokens, not a multiple of 2*cp = {}; pad it (pad = true pads each document "
          "at its end to a multiple of 2*cp) or pick cp with 2*cp dividing every length",
          who, i, padded[i], n);
    }
    padded[i] = detail::ceil_div(padded[i], n) * n;
  }
  cp_partition p;
  p.policy = {scheme, cp, pad};
  p.cu_seqlens = prefix_sums(lengths);
  p.cu_seqlens_padded = prefix_sums(padded);
  const std::int64_t total = p.cu_seqlens_padded.back();
  p.ranks.resize(static_cast<std::size_t>(cp));
  p.owner_rank.assign(static_cast<std::size_t>(total), -1);
  p.owner_local.assign(static_cast<std::size_t>(total), -1);
  for (int r = 0; r < cp; ++r) {
    for (std::size_t d = 0; d < padded.size(); ++d) {
      const int first = r, second = static_cast<int>(n) - 1 - r;
      // Chunk k is [k*L/2cp, (k+1)*L/2cp): exact when 2cp divides L, and for cp = 1 with an odd L
      // the halves [0, L/2) and [L/2, L).
      const auto cut = [&](std::int64_t k) { return k * padded[d] / n; };
      add_run(p, r, static_cast<std::int64_t>(d), first, {cut(first), cut(first + 1)}, lengths[d]);
      add_run(p, r, static_cast<std::int64_t>(d), second, {cut(second), cut(second + 1)}, lengths[d]);
    }
  }
  // TE's local cu_seqlens: cu_seqlens_padded / cp, every document included (also empty ones).
  for (auto& sh : p.ranks) {
    sh.cu_seqlens.clear();
    sh.local_docs.clear();
    for (std::size_t d = 0; d < p.cu_seqlens_padded.size(); ++d) {
      sh.cu_seqlens.push_back(p.cu_seqlens_padded[d] / cp);
      if (d + 1 < p.cu_seqlens_padded.size()) sh.local_docs.push_back(static_cast<std::int64_t>(d));
    }
  }
  return p;
}

}  // namespace hetmesh::seq::detail

namespace hetmesh::seq {

HETMESH_COMPILED cp_partition partition_thd(std::span<const std::int64_t> lengths, int cp, bool pad) {
  return detail::partition_2cp(lengths, cp, pad, cp_scheme::thd, "partition_thd");
}

HETMESH_COMPILED cp_partition partition_zigzag(std::int64_t length, int cp, bool pad) {
  const std::int64_t one[1] = {length};
  return detail::partition_2cp(one, cp, pad, cp_scheme::zigzag, "partition_zigzag");
}

HETMESH_COMPILED std::vector<std::int64_t> padded_position_ids(std::span<const std::int64_t> cu_seqlens,
                                                               std::int64_t divisibility) {
  if (divisibility < 1)
    throw_error<invalid_argument>("padded_position_ids: divisibility = {}; expected >= 1 (2*cp)",
                                  divisibility);
  if (cu_seqlens.empty() || cu_seqlens.front() != 0)
    throw_error<invalid_argument>(
        "padded_position_ids: cu_seqlens must start at 0; expected [0, l0, l0+l1, ...]");
  std::vector<std::int64_t> out;
  for (std::size_t d = 1; d < cu_seqlens.size(); ++d) {
    const std::int64_t len = cu_seqlens[d] - cu_seqlens[d - 1];
    if (len < 0) {
      throw_error<invalid_argument>(
          "padded_position_ids: cu_seqlens decreases at {} ({} after {}); expected a "
          "non-decreasing prefix sum",
          d, cu_seqlens[d], cu_seqlens[d - 1]);
    }
    const std::int64_t padded = detail::ceil_div(len, divisibility) * divisibility;
    for (std::int64_t t = 0; t < padded; ++t) out.push_back(t);
  }
  return out;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
