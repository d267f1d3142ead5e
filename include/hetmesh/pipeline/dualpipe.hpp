// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: DualPipeV, the V-shaped half of DeepSeek's DualPipe (arXiv 2412.19437), with the
// order PyTorch's ScheduleDualPipeV (torch 2.15) gives it. Rank r of pp holds stages r and 2*pp-1-r (the
// V layout of zbv). In its steady state each rank runs a forward of one of its stages overlapped with
// the full backward of its other stage: one OVERLAP_F_B action, `(0F3;3B1)OVERLAP_F_B`, whose halves a
// runtime may interleave so that each hides the other's communication (hetmesh's executor runs them one
// after the other, as PyTorch's runtime does). The warm-up runs single forwards and zero-bubble I/W
// pairs on the far stage; the cool-down switches from full backwards to I with deferred W halfway.
//
// The order, per rank r (s0 = r, s1 = 2*pp-1-r; micro-batch numbers count per stage and kind, a B counts
// as that micro-batch's I and W; each I queues its W, and "W" takes the oldest queued one):
//   1. 2*(pp-1-r) x  F(s0)
//   2. r+1        x  F(s0) F(s1)
//   3. pp-1-r     x  I(s1) W F(s1)
//   4. M-2*pp+r+1 x  OVERLAP(F(s0), B(s1)) OVERLAP(F(s1), B(s0))   (the last rank's first pair not
//                                                                   overlapped: F(s0) B(s1))
//   5. pp-1-r     x  B(s1) OVERLAP(F(s1), B(s0))
//   6. r+1        x  X(s1) X(s0), X = B until the middle iteration, I from then on (on odd ranks the
//                    switch comes before that iteration's s1 action, on even ranks after it)
//   7. pp-1-r     x  W X(s0)
//   8. r+1        x  W
// PyTorch accepts it for M >= 2*pp micro-batches (its stage count) and exactly two stages per rank.
#pragma once

#include <cstddef>
#include <deque>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "action.hpp"
#include "generators.hpp"
#include "schedule_family.hpp"
#include "verify.hpp"

namespace hetmesh::pipeline {

/// DualPipeV: two stages per rank in a V (rank r holds stages r and 2*pp-1-r), forward and backward of
/// the two stages overlapped (OVERLAP_F_B) in the steady state; PyTorch's ScheduleDualPipeV order.
struct dualpipev {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "dualpipev";
  /// Its warm-up and cool-down split backwards into I and W: the stage must provide both.
  static constexpr bool requires_split_backward = true;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  friend constexpr bool operator==(const dualpipev&, const dualpipev&) = default;
  void hash_append(hasher& h) const { append(h, name); }
};

namespace detail {

/// One rank's DualPipeV list (see the file comment). Pure; O(M).
inline std::vector<action> dualpipev_rank(int pp, int rank, int m) {
  const int s0 = rank, s1 = 2 * pp - 1 - rank;
  std::vector<action> ops;
  ops.reserve(static_cast<std::size_t>(m) * 5);
  // Next micro-batch per stage for forwards and for backwards (B or I); the pending W, oldest first.
  std::vector<int> next_f(static_cast<std::size_t>(2 * pp), 0), next_b(static_cast<std::size_t>(2 * pp), 0);
  std::deque<std::pair<int, int>> pending_w;
  auto f = [&](int st) { return F(st, next_f[static_cast<std::size_t>(st)]++); };
  auto b = [&](int st) { return B(st, next_b[static_cast<std::size_t>(st)]++); };
  auto i = [&](int st) {
    const int mb = next_b[static_cast<std::size_t>(st)]++;
    pending_w.emplace_back(st, mb);
    return I(st, mb);
  };
  auto w = [&] {
    if (pending_w.empty()) return;
    ops.push_back(W(pending_w.front().first, pending_w.front().second));
    pending_w.pop_front();
  };
  auto overlap = [&](int fs, int bs) {
    const action fa = f(fs);
    ops.push_back(OVERLAP(fa, b(bs)));
  };
  const int near = pp - 1 - rank;  // ranks between this one and the V's tip
  for (int k = 0; k < 2 * near; ++k) ops.push_back(f(s0));
  for (int k = 0; k < rank + 1; ++k) {
    ops.push_back(f(s0));
    ops.push_back(f(s1));
  }
  for (int k = 0; k < near; ++k) {
    ops.push_back(i(s1));
    w();
    ops.push_back(f(s1));
  }
  for (int k = 0; k < m - 2 * pp + rank + 1; ++k) {
    if (k == 0 && rank == pp - 1) {  // the tip's first pair runs apart: a smaller bubble
      ops.push_back(f(s0));
      ops.push_back(b(s1));
    } else {
      overlap(s0, s1);
    }
    overlap(s1, s0);
  }
  for (int k = 0; k < near; ++k) {
    ops.push_back(b(s1));
    overlap(s1, s0);
  }
  bool split = false;
  const int tail = rank + 1;
  for (int k = 0; k < tail; ++k) {
    if (k == tail / 2 && rank % 2 == 1) split = true;
    ops.push_back(split ? i(s1) : b(s1));
    if (k == tail / 2 && rank % 2 == 0) split = true;
    ops.push_back(split ? i(s0) : b(s0));
  }
  for (int k = 0; k < near; ++k) {
    w();
    ops.push_back(split ? i(s0) : b(s0));
  }
  for (int k = 0; k < tail; ++k) w();
  return ops;
}

}  // namespace detail

/// PyTorch's ScheduleDualPipeV order for pp ranks (2*pp stages in a V) and `microbatches` micro-batches.
/// Preconditions, as PyTorch's: pp >= 1 and microbatches >= 2*pp (at least one micro-batch per stage);
/// the invalid_argument thrown otherwise names the rule. The result passes verify() and lowers with
/// add_send_recv. Pure; O(pp * M).
[[nodiscard]] inline schedule generate(const dualpipev&, int pp, int microbatches) {
  detail::check_basic("dualpipev", pp, microbatches);
  if (microbatches < 2 * pp)
    throw_error<invalid_argument>(
        "pipeline dualpipev: microbatches={} with pp={}; DualPipeV (as PyTorch's ScheduleDualPipeV) needs at "
        "least as many micro-batches as stages, expected microbatches >= 2 * pp = {}",
        microbatches, pp, 2 * pp);
  auto s = detail::make_empty("dualpipev", pp, 2 * pp, microbatches, stage_layout::v);
  for (int r = 0; r < pp; ++r)
    s.ranks[static_cast<std::size_t>(r)] = detail::dualpipev_rank(pp, r, microbatches);
  assert_deadlock_free(s, "pipeline::generate(dualpipev)");
  return s;
}

inline schedule dualpipev::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::dualpipev> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::dualpipev& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::pipeline::name_of(p));
  }
};

static_assert(hetmesh::pipeline::schedule_family<hetmesh::pipeline::dualpipev>);
