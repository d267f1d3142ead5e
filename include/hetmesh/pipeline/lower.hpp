// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: lowering passes that turn a compute-only schedule into one with explicit
// communication and gradient reduction.
//
// add_send_recv follows PyTorch's `_add_send_recv`: ranks take turns (in rank order, one compute
// action per turn); a rank may take its next compute action only when the data it consumes is already
// in its list (a RECV placed there by the producer, or the producing action itself when local). When it
// does, its SEND goes right after the action and the peer's RECV is appended to the peer's list at that
// moment. Because each SEND/RECV pair is appended back to back in one global sequence, every rank's list
// is a projection of that sequence, which makes the result free of deadlock even when send and receive
// both block (rendezvous); the verifier checks this independently.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "action.hpp"

namespace hetmesh::pipeline {

namespace detail {

/// Flat "has this action happened" flags over (type, stage or shard, micro-batch), O(1) lookups.
class action_flags {
 public:
  action_flags(int stages, int shards, int microbatches) : mbs_(microbatches) {
    std::size_t at = 0;
    for (int t = 0; t < action_type_count; ++t) {
      const int n = uses_shard(static_cast<action_type>(t)) ? shards : stages;
      limit_[static_cast<std::size_t>(t)] = n;
      base_[static_cast<std::size_t>(t)] = at;
      at += static_cast<std::size_t>(n) * static_cast<std::size_t>(microbatches);
    }
    bits_.assign((at + 63) / 64, 0);
  }

  [[nodiscard]] bool in_range(const action& a) const noexcept {
    return a.stage >= 0 && a.stage < limit_[static_cast<std::size_t>(a.type)] && a.microbatch >= 0 &&
           a.microbatch < mbs_;
  }
  [[nodiscard]] bool get(const action& a) const noexcept {
    if (!in_range(a)) return false;
    const std::size_t i = index(a);
    return ((bits_[i >> 6] >> (i & 63U)) & 1U) != 0;
  }
  void set(const action& a) noexcept {
    if (!in_range(a)) return;
    const std::size_t i = index(a);
    bits_[i >> 6] |= std::uint64_t{1} << (i & 63U);
  }

  static constexpr bool uses_shard(action_type t) noexcept {
    return t == action_type::encoder_forward || t == action_type::encoder_backward ||
           t == action_type::send_ef || t == action_type::recv_ef || t == action_type::send_eb ||
           t == action_type::recv_eb;
  }

 private:
  [[nodiscard]] std::size_t index(const action& a) const noexcept {
    return base_[static_cast<std::size_t>(a.type)] +
           static_cast<std::size_t>(a.stage) * static_cast<std::size_t>(mbs_) +
           static_cast<std::size_t>(a.microbatch);
  }
  int mbs_;
  std::array<int, action_type_count> limit_{};
  std::array<std::size_t, action_type_count> base_{};
  std::vector<std::uint64_t> bits_;  // one bit per possible action: small enough to stay in cache
};

/// comm_pairs of one action that is not OVERLAP_F_B, appended to `out`.
HETMESH_COMPILED void append_comm_pairs(const schedule& s, const action& a,
                                        std::vector<std::pair<action, action>>& out)
#if HETMESH_BODIES
{
  const int mb = a.microbatch;
  switch (a.type) {
    case action_type::forward:
      if (a.stage + 1 < s.num_stages && s.rank_of_stage(a.stage + 1) != s.rank_of_stage(a.stage))
        out.push_back({{a.stage, action_type::send_f, mb}, {a.stage + 1, action_type::recv_f, mb}});
      break;
    case action_type::backward:
    case action_type::backward_input:
      if (a.stage > 0 && s.rank_of_stage(a.stage - 1) != s.rank_of_stage(a.stage))
        out.push_back({{a.stage, action_type::send_b, mb}, {a.stage - 1, action_type::recv_b, mb}});
      if (a.stage == 0)
        for (int e = 0; e < s.num_encoder_shards(); ++e)
          if (s.encoder_shard_to_rank[static_cast<std::size_t>(e)] != s.rank_of_stage(0))
            out.push_back({{e, action_type::send_eb, mb}, {e, action_type::recv_eb, mb}});
      break;
    case action_type::encoder_forward:
      if (s.encoder_shard_to_rank[static_cast<std::size_t>(a.stage)] != s.rank_of_stage(0))
        out.push_back({{a.stage, action_type::send_ef, mb}, {a.stage, action_type::recv_ef, mb}});
      break;
    default:
      break;
  }
}
#else
    ;
#endif
}  // namespace detail

/// The (send, recv) pairs compute action `a` produces under schedule `s`, written to `out` (cleared
/// first): one pair per consumer of a's output (or gradient) on another rank; empty when the consumer is
/// on the same rank or there is none. Pre: `a` is an action of `s`. Pure; deterministic (pairs in
/// stage, then encoder-shard order); O(encoder shards). An OVERLAP_F_B action's pairs are its forward
/// half's, then its backward half's. Used by add_send_recv and by the executor
/// (run/pipeline_executor.hpp) to tell whether a schedule's data crosses ranks.
HETMESH_COMPILED void comm_pairs(const schedule& s, const action& a,
                                 std::vector<std::pair<action, action>>& out)
#if HETMESH_BODIES
{
  out.clear();
  for (const action& p : parts(a)) detail::append_comm_pairs(s, p, out);
}
#else
    ;
#endif

/// The schedule without its communication actions (compute and REDUCE_GRAD kept, order kept). Pure.
[[nodiscard]] HETMESH_COMPILED schedule strip_comm(const schedule& s)
#if HETMESH_BODIES
{
  schedule out = s;
  for (auto& row : out.ranks) std::erase_if(row, [](const action& a) { return is_comm(a.type); });
  return out;
}
#else
    ;
#endif

/// Lowers a schedule to compute + communication, PyTorch's `_add_send_recv` algorithm (see the file
/// comment), extended to the encoder transfers (EF outputs to stage 0's rank, embedding gradients back).
/// Existing communication actions are dropped first. Postcondition: every cross-rank data dependency
/// has one SEND on the producer's rank and one RECV on the consumer's rank; same-rank ones have none.
/// Throws invalid_argument naming each rank's stuck action when the compute order cannot run (a
/// dependency cycle). An OVERLAP_F_B action is taken when both its halves are ready; the SENDs of both
/// halves follow it, as in PyTorch. Pure; deterministic; O(rounds * ranks) with rounds ~ the longest
/// rank list.
[[nodiscard]] HETMESH_COMPILED schedule add_send_recv(const schedule& in)
#if HETMESH_BODIES
{
  const schedule s = strip_comm(in);
  const int nranks = s.total_ranks();
  const int shards = s.num_encoder_shards();
  detail::action_flags done(s.num_stages, shards, s.num_microbatches);
  schedule out = s;
  for (auto& row : out.ranks) {
    row.clear();
  }
  for (std::size_t r = 0; r < s.ranks.size(); ++r) out.ranks[r].reserve(s.ranks[r].size() * 2);
  std::vector<std::size_t> head(static_cast<std::size_t>(nranks), 0);
  std::vector<int> backward_count(static_cast<std::size_t>(s.num_stages), 0);
  auto local = [&](const action& dep, int rank) { return done.get(dep) && s.rank_of(dep) == rank; };
  auto ready = [&](const action& a, int rank) -> bool {
    const int mb = a.microbatch;
    switch (a.type) {
      case action_type::forward:
        if (a.stage == 0) {
          for (int e = 0; e < shards; ++e) {
            if (!done.get({e, action_type::recv_ef, mb}) &&
                !local({e, action_type::encoder_forward, mb}, rank))
              return false;
          }
          return true;
        }
        return done.get({a.stage, action_type::recv_f, mb}) || local(F(a.stage - 1, mb), rank);
      case action_type::backward:
      case action_type::backward_input:
        if (a.stage == s.num_stages - 1) return true;
        return done.get({a.stage, action_type::recv_b, mb}) || local(I(a.stage + 1, mb), rank) ||
               local(B(a.stage + 1, mb), rank);
      case action_type::encoder_backward:
        return done.get({a.stage, action_type::recv_eb, mb}) || local(I(0, mb), rank) ||
               local(B(0, mb), rank);
      case action_type::reduce_grad:
        return backward_count[static_cast<std::size_t>(a.stage)] == s.num_microbatches;
      default:
        return true;
    }
  };
  std::vector<std::pair<action, action>> pairs;
  std::size_t remaining = 0;
  for (const auto& row : s.ranks) remaining += row.size();
  while (remaining > 0) {
    bool progress = false;
    for (int r = 0; r < nranks; ++r) {
      auto& h = head[static_cast<std::size_t>(r)];
      const auto& row = s.ranks[static_cast<std::size_t>(r)];
      if (h == row.size()) continue;
      const action a = row[h];
      // An overlapped F+B runs when both halves can (PyTorch checks every sub-action first).
      const auto ps = parts(a);
      if (!std::all_of(ps.begin(), ps.end(), [&](const action& p) { return ready(p, r); })) continue;
      out.ranks[static_cast<std::size_t>(r)].push_back(a);
      for (const action& p : ps) {
        done.set(p);
        if (p.type == action_type::backward || p.type == action_type::backward_weight)
          ++backward_count[static_cast<std::size_t>(p.stage)];
      }
      comm_pairs(s, a, pairs);
      for (const auto& [snd, rcv] : pairs) {
        out.ranks[static_cast<std::size_t>(r)].push_back(snd);
        done.set(snd);
        out.ranks[static_cast<std::size_t>(s.rank_of(rcv))].push_back(rcv);
        done.set(rcv);
      }
      ++h;
      --remaining;
      progress = true;
    }
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < nranks; ++r) {
        const auto h = head[static_cast<std::size_t>(r)];
        if (h < s.ranks[static_cast<std::size_t>(r)].size())
          stuck +=
              hetmesh::format(" rank {} at #{} {};", r, h, to_text(s.ranks[static_cast<std::size_t>(r)][h]));
      }
      throw_error<invalid_argument>(
          "pipeline add_send_recv({}): the compute order cannot run, no rank can take its next action (a "
          "dependency cycle):{} expected every action's inputs to be produced earlier",
          s.name, stuck);
    }
  }
  return out;
}
#else
    ;
#endif

/// Appends `<stage>REDUCE_GRAD` on each stage's rank right after that stage's last backward (B or W, or
/// the OVERLAP_F_B whose backward half it is),
/// so data-parallel gradient reduction overlaps the rest of the rank's cool-down. Existing
/// REDUCE_GRAD actions are dropped first. Pure; O(actions).
[[nodiscard]] HETMESH_COMPILED schedule add_reduce_grad(const schedule& in)
#if HETMESH_BODIES
{
  schedule out = in;
  for (auto& row : out.ranks)
    std::erase_if(row, [](const action& a) { return a.type == action_type::reduce_grad; });
  for (auto& row : out.ranks) {
    std::vector<int> last(static_cast<std::size_t>(out.num_stages), -1);
    for (std::size_t i = 0; i < row.size(); ++i)
      for (const action& p : parts(row[i]))
        if (p.type == action_type::backward || p.type == action_type::backward_weight)
          last[static_cast<std::size_t>(p.stage)] = static_cast<int>(i);
    std::vector<action> next;
    next.reserve(row.size() + last.size());
    for (std::size_t i = 0; i < row.size(); ++i) {
      next.push_back(row[i]);
      for (int st = 0; st < out.num_stages; ++st)
        if (last[static_cast<std::size_t>(st)] == static_cast<int>(i))
          next.push_back({st, action_type::reduce_grad, -1});
    }
    row = std::move(next);
  }
  return out;
}
#else
    ;
#endif

}  // namespace hetmesh::pipeline
