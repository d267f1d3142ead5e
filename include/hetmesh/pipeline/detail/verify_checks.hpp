// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline::detail: the verifier's static checks, one function each, in the order verify() runs
// them: the stage and shard maps, the structure of every rank's list (ranges, owning rank, duplicates),
// completeness (a forward and a backward of every micro-batch on every stage and shard), and the
// SEND/RECV pairs. Each throws invalid_argument naming the rank, the position and the offending action.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/format.hpp"
#include "../action.hpp"
#include "../lower.hpp"
#include "../verify_report.hpp"

namespace hetmesh::pipeline::detail {

/// The matching partner of a SEND or RECV.
inline action partner(const action& a) {
  switch (a.type) {
    case action_type::send_f:
      return {a.stage + 1, action_type::recv_f, a.microbatch};
    case action_type::recv_f:
      return {a.stage - 1, action_type::send_f, a.microbatch};
    case action_type::send_b:
      return {a.stage - 1, action_type::recv_b, a.microbatch};
    case action_type::recv_b:
      return {a.stage + 1, action_type::send_b, a.microbatch};
    case action_type::send_ef:
      return {a.stage, action_type::recv_ef, a.microbatch};
    case action_type::recv_ef:
      return {a.stage, action_type::send_ef, a.microbatch};
    case action_type::send_eb:
      return {a.stage, action_type::recv_eb, a.microbatch};
    case action_type::recv_eb:
      return {a.stage, action_type::send_eb, a.microbatch};
    default:
      return a;
  }
}

/// The schedule's shape: at least one stage and micro-batch, and every stage and encoder shard mapped to
/// a rank of the schedule.
inline void check_maps(const schedule& s, const std::string& where) {
  const int nranks = s.total_ranks();
  const int S = s.num_stages, M = s.num_microbatches, E = s.num_encoder_shards();
  if (S < 1 || M < 1 || static_cast<int>(s.stage_to_rank.size()) != S)
    throw_error<invalid_argument>(
        "{}: {} stages, {} micro-batches and a stage map of {} entries; expected at least one "
        "stage and micro-batch and one map entry per stage",
        where, S, M, s.stage_to_rank.size());
  for (int st = 0; st < S; ++st)
    if (s.stage_to_rank[static_cast<std::size_t>(st)] < 0 ||
        s.stage_to_rank[static_cast<std::size_t>(st)] >= nranks)
      throw_error<invalid_argument>("{}: stage {} maps to rank {}; expected a rank in [0, {})", where, st,
                                    s.stage_to_rank[static_cast<std::size_t>(st)], nranks);
  for (int e = 0; e < E; ++e)
    if (s.encoder_shard_to_rank[static_cast<std::size_t>(e)] < 0 ||
        s.encoder_shard_to_rank[static_cast<std::size_t>(e)] >= nranks)
      throw_error<invalid_argument>("{}: encoder shard {} maps to rank {}; expected a rank in [0, {})", where,
                                    e, s.encoder_shard_to_rank[static_cast<std::size_t>(e)], nranks);
}

/// Structure: every action in range, on the rank that owns its stage or shard, at most once (each half
/// of an overlapped F+B counts); REDUCE_GRAD once per stage. Marks each action in `present`, counts
/// actions and compute actions into `rep`, and returns whether the schedule has SEND/RECV actions.
inline bool check_structure(const schedule& s, const std::string& where, action_flags& present,
                            verify_report& rep) {
  const int nranks = s.total_ranks();
  const int S = s.num_stages, M = s.num_microbatches, E = s.num_encoder_shards();
  bool explicit_comm = false;
  std::vector<int> reduce_seen(static_cast<std::size_t>(S), 0);
  for (int r = 0; r < nranks; ++r) {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const action& a = row[i];
      ++rep.actions;
      if (is_compute(a.type)) ++rep.compute_actions;
      if (is_comm(a.type)) explicit_comm = true;
      auto fail = [&](const std::string& why) {
        throw_error<invalid_argument>("{}: rank {} action #{} `{}`: {}", where, r, i, to_text(a), why);
      };
      if (a.type == action_type::reduce_grad) {
        if (a.stage < 0 || a.stage >= S) fail(hetmesh::format("stage out of range; expected [0, {})", S));
        if (s.rank_of_stage(a.stage) != r)
          fail(hetmesh::format("stage {} lives on rank {}", a.stage, s.rank_of_stage(a.stage)));
        if (reduce_seen[static_cast<std::size_t>(a.stage)]++ != 0)
          fail("appears twice; expected once per stage");
        continue;
      }
      for (const action& p : parts(a)) {  // an overlapped F+B: each half, both on this rank
        const std::string half =
            a.type == action_type::overlap_f_b ? hetmesh::format("`{}`: ", to_text(p)) : "";
        if (!present.in_range(p))
          fail(hetmesh::format(
              "{}{} or micro-batch out of range; expected {} in [0, {}) and micro-batch in [0, {})", half,
              action_flags::uses_shard(p.type) ? "encoder shard" : "stage",
              action_flags::uses_shard(p.type) ? "shard" : "stage", action_flags::uses_shard(p.type) ? E : S,
              M));
        if (s.rank_of(p) != r)
          fail(hetmesh::format("{}belongs on rank {} (by the stage/shard map)", half, s.rank_of(p)));
        if (present.get(p))
          fail(hetmesh::format("{}appears a second time; expected each action exactly once", half));
        present.set(p);
      }
    }
  }
  return explicit_comm;
}

/// Completeness: a forward of every micro-batch on every stage, with a full backward or a split one (I
/// and W in pairs, never both kinds) unless `require_backward` is false; an encoder forward (and
/// backward) of every micro-batch on every encoder shard.
inline void check_complete(const schedule& s, const std::string& where, const action_flags& present,
                           bool require_backward) {
  const int S = s.num_stages, M = s.num_microbatches, E = s.num_encoder_shards();
  for (int st = 0; st < S; ++st)
    for (int mb = 0; mb < M; ++mb) {
      if (!present.get(F(st, mb)))
        throw_error<invalid_argument>(
            "{}: `{}` is missing; expected a forward of every micro-batch on every stage", where,
            to_text(F(st, mb)));
      const bool b = present.get(B(st, mb)), i = present.get(I(st, mb)), w = present.get(W(st, mb));
      if (b && (i || w))
        throw_error<invalid_argument>(
            "{}: stage {} micro-batch {} has both a full backward `{}` and a split one; "
            "expected B, or I and W",
            where, st, mb, to_text(B(st, mb)));
      if (i != w)
        throw_error<invalid_argument>("{}: `{}` is missing; expected I and W to come in pairs", where,
                                      to_text(i ? W(st, mb) : I(st, mb)));
      if (require_backward && !b && !i)
        throw_error<invalid_argument>(
            "{}: stage {} micro-batch {} has no backward; expected `{}` (or `{}` and `{}`)", where, st, mb,
            to_text(B(st, mb)), to_text(I(st, mb)), to_text(W(st, mb)));
    }
  for (int e = 0; e < E; ++e)
    for (int mb = 0; mb < M; ++mb) {
      const action ef{e, action_type::encoder_forward, mb}, eb{e, action_type::encoder_backward, mb};
      if (!present.get(ef))
        throw_error<invalid_argument>(
            "{}: `{}` is missing; expected every encoder shard to encode every micro-batch", where,
            to_text(ef));
      if (require_backward && !present.get(eb))
        throw_error<invalid_argument>("{}: `{}` is missing; expected an encoder backward per encoder forward",
                                      where, to_text(eb));
    }
}

/// Communication pairs: every SEND has its RECV on the peer and every RECV its SEND. Counts the matched
/// pairs into `rep`.
inline void check_comm_pairs(const schedule& s, const std::string& where, const action_flags& present,
                             verify_report& rep) {
  const int nranks = s.total_ranks();
  for (int r = 0; r < nranks; ++r) {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const action& a = row[i];
      if (!is_comm(a.type)) continue;
      const action p = partner(a);
      if (!present.get(p))
        throw_error<invalid_argument>(
            "{}: rank {} action #{} `{}` has no matching `{}` on rank {}; expected every {} "
            "matched by a {}",
            where, r, i, to_text(a), to_text(p), present.in_range(p) ? s.rank_of(p) : -1,
            is_send(a.type) ? "send" : "receive", is_send(a.type) ? "receive" : "send");
      if (is_send(a.type)) ++rep.comm_pairs;
    }
  }
}

}  // namespace hetmesh::pipeline::detail
