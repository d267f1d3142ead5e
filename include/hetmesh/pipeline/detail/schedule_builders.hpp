// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline::detail: what the schedule generators share: the precondition checks (pipeline size,
// micro-batch count, virtual stages, the PyTorch and Megatron-LM group-size rules), Megatron-LM's
// schedule table, the per-rank 1F1B order that 1F1B, interleaved 1F1B and the zero-bubble families
// differ in only by their parameters, and the empty schedule they fill.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../config.hpp"
#include "../../core/error.hpp"
#include "../../core/format.hpp"
#include "../action.hpp"

namespace hetmesh::pipeline::detail {

/// A pipeline size and a micro-batch count the generators accept (pp >= 1, M >= 1), else invalid_argument.
HETMESH_COMPILED void check_basic(std::string_view name, int pp, int m)
#if HETMESH_BODIES
{
  if (pp < 1)
    throw_error<invalid_argument>("pipeline {}: pp={} is not a pipeline size; expected pp >= 1", name, pp);
  if (m < 1)
    throw_error<invalid_argument>("pipeline {}: microbatches={}; expected at least one micro-batch", name, m);
}
#else
    ;
#endif

/// At least one stage per rank (virtual_stages >= 1), else invalid_argument naming the family.
inline void check_virtual(std::string_view name, int v) {
  if (v < 1)
    throw_error<invalid_argument>("pipeline {}: virtual_stages={}; expected at least one stage per rank",
                                  name, v);
}

/// PyTorch's group size for interleaved schedules: rounds = max(1, M / pp), and M % rounds must be 0.
inline int pytorch_group_size(std::string_view name, int pp, int m) {
  const int rounds = std::max(1, m / pp);
  if (m % rounds != 0)
    throw_error<invalid_argument>(
        "pipeline {}: PyTorch's rule needs microbatches to be a multiple of the number of rounds "
        "max(1, microbatches / pp) = {}, but microbatches={} (pp={}); expected e.g. {} or {}",
        name, rounds, m, pp, rounds * (m / rounds), rounds * (m / rounds + 1));
  return m / rounds;
}

/// Megatron-LM's checks for microbatch_group_size_per_vp_stage.
HETMESH_COMPILED int megatron_group_size(std::string_view name, int pp, int m, int g)
#if HETMESH_BODIES
{
  if (g == 0) g = pp;
  if (g < pp || g > m)
    throw_error<invalid_argument>(
        "pipeline {}: Megatron-LM's rule needs the micro-batch group size in [pp, microbatches] = [{}, {}], "
        "but it is {}{}",
        name, pp, m, g,
        g == pp && m < pp
            ? hetmesh::format(" (with the default group size pp, microbatches must be >= pp={})", pp)
            : std::string());
  const int rem = m % g;
  if (rem != 0 && rem < pp)
    throw_error<invalid_argument>(
        "pipeline {}: Megatron-LM's rule needs microbatches % group size to be 0 or >= pp, but {} % {} = {} "
        "< "
        "pp={}{}",
        name, m, g, rem, pp,
        g == pp
            ? hetmesh::format("; with the default group size, microbatches must be a multiple of pp={}", pp)
            : std::string());
  return g;
}
#else
    ;
#endif

/// Megatron-LM's schedule table: virtual micro-batch k -> (micro-batch, chunk). Micro-batches go in
/// groups of g; within a group all of chunk 0, then all of chunk 1, ...; the last group takes the rest.
HETMESH_COMPILED std::vector<std::pair<int, int>> schedule_table(int m, int v, int g)
#if HETMESH_BODIES
{
  std::vector<std::pair<int, int>> table;
  table.reserve(static_cast<std::size_t>(m) * static_cast<std::size_t>(v));
  for (int lo = 0; lo < m; lo += g) {
    const int hi = lo + g >= m ? m : lo + g;
    for (int c = 0; c < v; ++c)
      for (int mb = lo; mb < hi; ++mb) table.emplace_back(mb, c);
  }
  return table;
}
#else
    ;
#endif

/// The per-rank order shared by 1F1B, interleaved 1F1B and the zero-bubble family: `warmup` forwards,
/// then F/B pairs, then the remaining backwards. With `zb`, backwards are I and each W follows the
/// (k - n1f1b)-th I; the remaining W close the list.
HETMESH_COMPILED std::vector<action> one_f_one_b_rank(int pp, int v, int rank, int m,
                                                      const std::vector<std::pair<int, int>>& table,
                                                      int warmup, bool zb, int n1f1b)
#if HETMESH_BODIES
{
  const int total_f = m * v;
  std::vector<action> ops;
  ops.reserve(static_cast<std::size_t>(total_f) * (zb ? 3U : 2U));
  auto bwd_stage = [&](int k) { return (v - 1 - table[static_cast<std::size_t>(k)].second) * pp + rank; };
  int w_next = 0;
  for (int op = 0; op < total_f + warmup; ++op) {
    if (op < total_f) {
      const auto [mb, c] = table[static_cast<std::size_t>(op)];
      ops.push_back(F(c * pp + rank, mb));
    }
    if (op >= warmup) {
      const int k = op - warmup;
      const int mb = table[static_cast<std::size_t>(k)].first;
      ops.push_back(zb ? I(bwd_stage(k), mb) : B(bwd_stage(k), mb));
      if (zb && k >= n1f1b) {
        ops.push_back(W(bwd_stage(w_next), table[static_cast<std::size_t>(w_next)].first));
        ++w_next;
      }
    }
  }
  while (zb && w_next < total_f) {
    ops.push_back(W(bwd_stage(w_next), table[static_cast<std::size_t>(w_next)].first));
    ++w_next;
  }
  return ops;
}
#else
    ;
#endif

/// An empty schedule of `stages` stages over pp ranks in `layout`, M micro-batches, one list per rank.
HETMESH_COMPILED schedule make_empty(std::string name, int pp, int stages, int m, stage_layout layout)
#if HETMESH_BODIES
{
  schedule s;
  s.name = std::move(name);
  s.num_ranks = pp;
  s.num_stages = stages;
  s.num_microbatches = m;
  s.stage_to_rank = make_stage_to_rank(pp, stages, layout);
  s.ranks.resize(static_cast<std::size_t>(pp));
  return s;
}
#else
    ;
#endif

}  // namespace hetmesh::pipeline::detail
