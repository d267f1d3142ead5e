// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: adaptive resharding, the executor. Moves encoder-output rows by a balance::reshard_plan
// (balance/reshard.hpp) with one all_to_all_v; the same call moves gradients back by plan.transposed().
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "../balance/reshard.hpp"
#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "agreement.hpp"

namespace hetmesh::run {

/// Collective over `c` (the ranks of the plan, group-local): moves rows by `plan` from `src` (this
/// rank's buffer, rows of `width` elements) into `dst`. Use plan for the forward pass (encoder outputs
/// into the LLM input) and plan.transposed() for the backward pass (gradients back).
/// Pre: c.size() == plan.ranks; buffers large enough for every run naming this rank (invalid_argument).
/// Post: each run's rows copied; rows of `dst` no run names are untouched. Cost: packing and
/// unpacking O(rows * width) plus one all_to_all_v.
template <comm::communicator C, class T>
void reshard(C& c, const balance::reshard_plan& plan, std::span<const T> src, std::span<T> dst,
             std::int64_t width) {
  if (c.size() != plan.ranks || width < 1)
    throw_error<invalid_argument>(
        "run::reshard: group of {} ranks, plan for {}, width {}; expected equal sizes "
        "and width >= 1",
        c.size(), plan.ranks, width);
  assert_plan_agreement(c, plan, "reshard plan");  // collective level: every rank moves rows by the same plan
  const auto n = static_cast<std::size_t>(plan.ranks);
  const auto me = static_cast<std::size_t>(c.rank());
  const auto w = static_cast<std::size_t>(width);
  std::vector<std::int64_t> sc(n), rc(n);
  for (std::size_t j = 0; j < n; ++j) {
    sc[j] = plan.counts[me * n + j] * width;
    rc[j] = plan.counts[j * n + me] * width;
  }
  std::vector<T> send;
  send.reserve(static_cast<std::size_t>(std::accumulate(sc.begin(), sc.end(), std::int64_t{0})));
  for (const auto& r : plan.runs) {
    if (static_cast<std::size_t>(r.src) != me) continue;
    const auto b = static_cast<std::size_t>(r.src_offset) * w, len = static_cast<std::size_t>(r.rows) * w;
    if (b + len > src.size())
      throw_error<invalid_argument>("run::reshard: rank {} reads rows [{}, {}) of a buffer of {} rows", me,
                                    r.src_offset, r.src_offset + r.rows, src.size() / w);
    send.insert(send.end(), src.begin() + static_cast<std::ptrdiff_t>(b),
                src.begin() + static_cast<std::ptrdiff_t>(b + len));
  }
  std::vector<T> recv(static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), std::int64_t{0})));
  std::vector<std::int64_t> sd(n, 0), rd(n, 0);
  for (std::size_t j = 1; j < n; ++j) {
    sd[j] = sd[j - 1] + sc[j - 1];
    rd[j] = rd[j - 1] + rc[j - 1];
  }
  comm::all_to_all_v(c, std::span<const T>(send), std::span<const std::int64_t>(sc),
                     std::span<const std::int64_t>(sd), std::span<T>(recv), std::span<const std::int64_t>(rc),
                     std::span<const std::int64_t>(rd));
  // Runs into this rank, in the sender's packing order: (src, dst, src_offset) restricted to dst == me.
  std::vector<std::int64_t> cursor(rd);
  for (const auto& r : plan.runs) {
    if (static_cast<std::size_t>(r.dst) != me) continue;
    const auto b = static_cast<std::size_t>(r.dst_offset) * w, len = static_cast<std::size_t>(r.rows) * w;
    if (b + len > dst.size())
      throw_error<invalid_argument>("run::reshard: rank {} writes rows [{}, {}) of a buffer of {} rows", me,
                                    r.dst_offset, r.dst_offset + r.rows, dst.size() / w);
    auto& at = cursor[static_cast<std::size_t>(r.src)];
    std::copy_n(recv.begin() + at, len, dst.begin() + static_cast<std::ptrdiff_t>(b));
    at += static_cast<std::int64_t>(len);
  }
}

}  // namespace hetmesh::run
