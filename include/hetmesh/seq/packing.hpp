// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: packing variable-length documents into fixed-capacity micro-batches (THD layout).
// Best-fit decreasing keeps the micro-batch count low; each micro-batch carries cu_seqlens and
// position ids that restart at 0 for every document, as varlen attention kernels expect.
// A document longer than the capacity is never cut: it is an error, or listed as rejected.
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
#include "../core/sort.hpp"
#include "detail/best_fit.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// What to do with a document longer than the capacity.
enum class overlong_action { error, reject };

/// Policy value of packing.
struct pack_policy {
  std::int64_t capacity = 8192;                       ///< tokens per micro-batch
  overlong_action overlong = overlong_action::error;  ///< what to do with a sequence longer than capacity

  friend constexpr bool operator==(const pack_policy&, const pack_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One packed micro-batch: its documents in order, and cu_seqlens over them (size docs+1, from 0).
struct packed_micro_batch {
  std::vector<seq_desc> docs;            ///< documents, in pack order
  std::vector<std::int64_t> cu_seqlens;  ///< cumulative lengths, from 0

  /// Tokens of the micro-batch.
  [[nodiscard]] std::int64_t tokens() const noexcept { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  /// Position ids of the micro-batch's tokens: 0..len-1 for each document in turn. O(tokens).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> position_ids() const;
  friend bool operator==(const packed_micro_batch&, const packed_micro_batch&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The packing plan: micro-batches in creation order, and documents rejected as over-long.
struct pack_plan {
  pack_policy policy{};                           ///< the policy it was made with
  std::vector<packed_micro_batch> micro_batches;  ///< the packed micro-batches
  std::vector<seq_desc> rejected;                 ///< (-length, id) order; empty unless overlong == reject

  friend bool operator==(const pack_plan&, const pack_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Packs `docs` by best-fit decreasing into micro-batches of `policy.capacity` tokens. Documents
/// of length 0 are kept (in a micro-batch, contributing an empty cu_seqlens step). Preconditions:
/// capacity >= 1, unique ids, lengths >= 0. Postconditions: every document is in exactly one
/// micro-batch or in `rejected`; every micro-batch holds <= capacity tokens. Throws capacity_error
/// for a document longer than the capacity when policy.overlong == error (naming every such
/// document's id, up to 8). Pure; independent of input order; O(n log n). Not collective.
[[nodiscard]] HETMESH_COMPILED pack_plan pack(std::span<const seq_desc> docs, const pack_policy& policy);

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::overlong_action> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::overlong_action a, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              a == hetmesh::seq::overlong_action::error ? "error" : "reject");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::pack_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::pack_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "pack_policy{{capacity={}, overlong={}}}", p.capacity,
                              p.overlong == hetmesh::seq::overlong_action::error ? "error" : "reject");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::packed_micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::packed_micro_batch& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "packed{{tokens={}, cu_seqlens={}}}", m.tokens(), m.cu_seqlens);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::pack_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::pack_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "pack_plan{{{}, micro_batches={}, rejected={}}}", p.policy,
                              p.micro_batches.size(), p.rejected);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void pack_policy::hash_append(hasher& h) const { append_all(h, capacity, overlong); }

HETMESH_COMPILED std::vector<std::int64_t> packed_micro_batch::position_ids() const {
  std::vector<std::int64_t> p;
  p.reserve(static_cast<std::size_t>(tokens()));
  for (const auto& d : docs)
    for (std::int64_t i = 0; i < d.length; ++i) p.push_back(i);
  return p;
}

HETMESH_COMPILED void packed_micro_batch::hash_append(hasher& h) const { append_all(h, docs, cu_seqlens); }

HETMESH_COMPILED void pack_plan::hash_append(hasher& h) const {
  append_all(h, policy, micro_batches, rejected);
}

HETMESH_COMPILED pack_plan pack(std::span<const seq_desc> docs, const pack_policy& policy) {
  if (policy.capacity < 1)
    throw_error<invalid_argument>("pack: capacity {}; expected >= 1 token", policy.capacity);
  check_seq_descs(docs, "pack");
  pack_plan out;
  out.policy = policy;
  std::vector<seq_desc> fits;
  fits.reserve(docs.size());
  for (const auto& d : docs) (d.length > policy.capacity ? out.rejected : fits).push_back(d);
  hetmesh::indirect_sort(out.rejected.begin(), out.rejected.end(), longer_first);
  if (!out.rejected.empty() && policy.overlong == overlong_action::error) {
    std::vector<seq_desc> shown(
        out.rejected.begin(),
        out.rejected.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(8, out.rejected.size())));
    throw_error<capacity_error>(
        "pack: {} document(s) longer than the micro-batch capacity {} (never cut; use "
        "overlong_action::reject to list them instead): {}",
        out.rejected.size(), policy.capacity, shown);
  }
  for (const auto& bin : detail::best_fit_decreasing(fits, policy.capacity)) {
    packed_micro_batch mb;
    std::vector<std::int64_t> lengths;
    for (std::size_t i : bin) {
      mb.docs.push_back(fits[i]);
      lengths.push_back(fits[i].length);
    }
    mb.cu_seqlens = prefix_sums(lengths);
    out.micro_batches.push_back(std::move(mb));
  }
  return out;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
