// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the plan of a causal halo exchange. A token mixer that reads the k tokens before each token
// of its document (a causal convolution, a token shift, an SSM chunk's carry) needs, under a sequence split,
// tokens another rank holds: the positions just before each run of consecutive positions a rank holds. The
// members of a group (a CP or HDP ring, a Ulysses group) each hold runs of documents in a local order; the
// plan says, for every local token and lag 1..k, where the token `lag` positions earlier in its document is:
// a local token, a halo row received from another member, or nothing (before the document's start: zero).
// It also lists, per member, the local tokens to send it and the halo rows it fills, in an order every member
// derives alike from the same layout. Pure: no communication (run/halo.hpp executes it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// Consecutive positions of one document that a member holds next to each other in its local order.
struct position_run {
  std::int64_t doc = 0;   ///< the document (any key the group's members share: an index or an id)
  token_range positions;  ///< its positions, in order

  friend constexpr bool operator==(const position_run&, const position_run&) = default;
};

/// Where the token `lag` positions before a local token comes from (halo_plan::source).
struct halo_source {
  /// Which buffer holds it.
  enum class kind : std::uint8_t {
    zero,   ///< before the document's start: the mixer reads zeros
    local,  ///< a local token: `index` is its local row
    halo,   ///< a halo row another member sent: `index` is its row in the halo buffer
  };
  kind where = kind::zero;  ///< which buffer
  std::int64_t index = 0;   ///< its row there (0 for zero)

  friend constexpr bool operator==(const halo_source&, const halo_source&) = default;
};

/// The halo exchange of one member of a group for a causal halo of `k` tokens (make_halo_plan).
struct halo_plan {
  int k = 0;                                    ///< tokens before each token the mixer reads
  int me = 0;                                   ///< the caller's member index
  std::int64_t tokens = 0;                      ///< the caller's local tokens
  std::int64_t halo_rows = 0;                   ///< rows of the caller's halo buffer
  std::vector<std::int64_t> token_run;          ///< per local token: its run (merged, local order)
  std::vector<std::int64_t> run_first;          ///< per run: its first local token
  std::vector<std::int64_t> run_source;         ///< per run x k: >= 0 local row, -1 zero, -2 - h halo row h
  std::vector<std::vector<std::int64_t>> send;  ///< per member: the caller's local rows it receives, in order
  std::vector<std::vector<std::int64_t>> recv;  ///< per member: the caller's halo rows it fills, in order

  /// Where the token `lag` positions before local token `token` is, 1 <= lag <= k. O(1).
  [[nodiscard]] HETMESH_COMPILED halo_source source(std::int64_t token, int lag) const;
  /// Whether the caller exchanges nothing with another member (every source local or zero). O(members).
  [[nodiscard]] bool local_only() const noexcept { return halo_rows == 0 && sends() == 0; }
  /// Rows the caller sends over all members. O(members).
  [[nodiscard]] HETMESH_COMPILED std::int64_t sends() const noexcept;

  friend bool operator==(const halo_plan&, const halo_plan&) = default;
};

/// The runs of a local token order: `doc[i]` and `pos[i]` of every local token, consecutive tokens of one
/// document at consecutive positions joined. Errors: spans of different sizes (invalid_argument). O(tokens).
[[nodiscard]] HETMESH_COMPILED std::vector<position_run> runs_of(std::span<const std::int64_t> doc,
                                                                 std::span<const std::int64_t> pos)
#if HETMESH_BODIES
{
  if (doc.size() != pos.size())
    throw_error<invalid_argument>("seq::runs_of: {} documents for {} positions; expected one per token",
                                  doc.size(), pos.size());
  std::vector<position_run> out;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    if (!out.empty() && out.back().doc == doc[i] && out.back().positions.end == pos[i])
      ++out.back().positions.end;
    else
      out.push_back({doc[i], {pos[i], pos[i] + 1}});
  }
  return out;
}
#else
    ;
#endif

/// The halo plan of member `me` of a group whose members hold `members[m]` (runs in each member's local
/// order; every position of a document the group needs held by exactly one member) for a causal halo of `k`
/// tokens. Every member computes the same sends and receives from the same `members`, so member m's send
/// list to m' and m''s receive list from m match row for row. A token whose earlier position is held by the
/// caller reads it locally, whichever run holds it. Errors (invalid_argument, naming the member, document
/// and position): k < 0, `me` outside the group, a run of negative positions or empty, a position held twice,
/// or a position some token needs held by no member. Pure; O(R log R + R k log R) for R runs in the group.
[[nodiscard]] HETMESH_COMPILED halo_plan make_halo_plan(std::span<const std::vector<position_run>> members,
                                                        int me, int k)
#if HETMESH_BODIES
{
  const int n = static_cast<int>(members.size());
  if (k < 0) throw_error<invalid_argument>("seq::make_halo_plan: halo of {} tokens; expected k >= 0", k);
  if (me < 0 || me >= n)
    throw_error<invalid_argument>("seq::make_halo_plan: member {} of a group of {}; expected 0 <= me < {}",
                                  me, n, n);
  struct held {  // a merged run of some member, with its first local row
    std::int64_t doc, begin, end, first;
    int member;
  };
  std::vector<std::vector<held>> merged(static_cast<std::size_t>(n));
  std::vector<held> index;
  for (int m = 0; m < n; ++m) {
    std::int64_t row = 0;
    for (const auto& r : members[static_cast<std::size_t>(m)]) {
      if (r.positions.begin < 0 || r.positions.size() <= 0)
        throw_error<invalid_argument>(
            "seq::make_halo_plan: member {} holds positions [{}, {}) of document {}; expected a non-empty "
            "run of positions >= 0",
            m, r.positions.begin, r.positions.end, r.doc);
      auto& list = merged[static_cast<std::size_t>(m)];
      if (!list.empty() && list.back().doc == r.doc && list.back().end == r.positions.begin)
        list.back().end = r.positions.end;
      else
        list.push_back({r.doc, r.positions.begin, r.positions.end, row, m});
      row += r.positions.size();
    }
    index.insert(index.end(), merged[static_cast<std::size_t>(m)].begin(),
                 merged[static_cast<std::size_t>(m)].end());
  }
  std::sort(index.begin(), index.end(),
            [](const held& a, const held& b) { return a.doc != b.doc ? a.doc < b.doc : a.begin < b.begin; });
  for (std::size_t i = 1; i < index.size(); ++i)
    if (index[i].doc == index[i - 1].doc && index[i].begin < index[i - 1].end)
      throw_error<invalid_argument>(
          "seq::make_halo_plan: position {} of document {} is held by members {} and {}; expected each "
          "position held once",
          index[i].begin, index[i].doc, index[i - 1].member, index[i].member);
  auto owner = [&](int m, std::int64_t doc, std::int64_t p) -> const held& {
    auto it =
        std::upper_bound(index.begin(), index.end(), std::pair{doc, p}, [](const auto& key, const held& h) {
          return key.first != h.doc ? key.first < h.doc : key.second < h.begin;
        });
    if (it == index.begin() || (it - 1)->doc != doc || p >= (it - 1)->end)
      throw_error<invalid_argument>(
          "seq::make_halo_plan: member {} needs position {} of document {}, which no member of the group "
          "holds; expected every document's earlier positions in the group",
          m, p, doc);
    return *(it - 1);
  };
  halo_plan plan;
  plan.k = k;
  plan.me = me;
  plan.send.resize(static_cast<std::size_t>(n));
  plan.recv.resize(static_cast<std::size_t>(n));
  for (const auto& r : merged[static_cast<std::size_t>(me)]) {
    plan.run_first.push_back(r.first);
    plan.token_run.insert(plan.token_run.end(), static_cast<std::size_t>(r.end - r.begin),
                          static_cast<std::int64_t>(plan.run_first.size() - 1));
  }
  plan.tokens = static_cast<std::int64_t>(plan.token_run.size());
  // Every member's runs in member order, and each run's rows in position order: the order both ends of
  // every transfer list their rows in.
  for (int q = 0; q < n; ++q)
    for (const auto& r : merged[static_cast<std::size_t>(q)])
      for (std::int64_t p = r.begin - k; p < r.begin; ++p) {
        if (p < 0) {
          if (q == me) plan.run_source.push_back(-1);
          continue;
        }
        const held& o = owner(q, r.doc, p);
        const auto row = o.first + (p - o.begin);
        if (q == me && o.member == me) {
          plan.run_source.push_back(row);
        } else if (q == me) {
          plan.recv[static_cast<std::size_t>(o.member)].push_back(plan.halo_rows);
          plan.run_source.push_back(-2 - plan.halo_rows++);
        } else if (o.member == me) {
          plan.send[static_cast<std::size_t>(q)].push_back(row);
        }
      }
  return plan;
}
#else
    ;
#endif

}  // namespace hetmesh::seq

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED halo_source halo_plan::source(std::int64_t token, int lag) const {
  HETMESH_ASSERT(token >= 0 && token < tokens && lag >= 1 && lag <= k, "halo_plan::source: out of range");
  const auto run = token_run[static_cast<std::size_t>(token)];
  const auto offset = token - run_first[static_cast<std::size_t>(run)];
  if (lag <= offset) return {halo_source::kind::local, token - lag};
  const auto s = run_source[static_cast<std::size_t>(run * k + k + offset - lag)];
  if (s >= 0) return {halo_source::kind::local, s};
  if (s == -1) return {};
  return {halo_source::kind::halo, -2 - s};
}

HETMESH_COMPILED std::int64_t halo_plan::sends() const noexcept {
  std::int64_t n = 0;
  for (const auto& s : send) n += static_cast<std::int64_t>(s.size());
  return n;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
