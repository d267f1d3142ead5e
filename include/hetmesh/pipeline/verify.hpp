// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the schedule verifier. It checks structure (every stage runs F and a backward for
// every micro-batch exactly once, on the rank that owns the stage), communication (every SEND has its
// RECV on the peer, every cross-rank input arrives through one), and then runs the schedule as a
// token game under blocking send/receive to prove it finishes: dependencies satisfied in order, no
// deadlock. Along the way it records per-rank peak activation memory and in-flight micro-batches.
// An overlapped F+B (OVERLAP_F_B) is one step of the game: it runs once what both halves need is there,
// and then counts as both halves (each half exactly once, both on the rank of the list it sits in).
// Errors are invalid_argument naming the rank, the position and the offending action. The options and
// the report are in verify_report.hpp, the checks in detail/verify_checks.hpp, the game in
// detail/token_game.hpp.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "action.hpp"
#include "detail/token_game.hpp"
#include "detail/verify_checks.hpp"
#include "lower.hpp"
#include "verify_report.hpp"

namespace hetmesh::pipeline {

/// Verifies `s`; returns the report or throws invalid_argument naming the first problem (rank,
/// position, action, and what was expected). Schedules without communication actions are checked
/// with data dependencies directly; with them, every cross-rank input must arrive by RECV.
/// Not collective; pure; O(actions + sweeps * ranks).
[[nodiscard]] inline verify_report verify(const schedule& s, const verify_options& opt = {}) {
  const std::string where = hetmesh::format("pipeline verify({})", s.name);
  detail::check_maps(s, where);
  verify_report rep;
  detail::action_flags present(s.num_stages, s.num_encoder_shards(), s.num_microbatches);
  const bool explicit_comm = detail::check_structure(s, where, present, rep);
  detail::check_complete(s, where, present, opt.require_backward);
  detail::check_comm_pairs(s, where, present, rep);
  detail::token_game(s, opt, where, present, explicit_comm, rep).run();
  return rep;
}

/// Heavy level (HETMESH_ASSERTION_LEVEL 3): checks that `s` passes verify() as given and, when it has no
/// SEND/RECV actions, once lowered by add_send_recv (every dependency met, no rank waits forever), and
/// throws assertion_error naming `who` and the verifier's finding otherwise. Below heavy it does
/// nothing. The schedule generators call it on what they return. Pure; O(verify).
inline void assert_deadlock_free(const schedule& s, std::string_view who) {
  if constexpr (assertion_enabled(assertion_level::heavy)) {
    std::string finding;
    try {
      (void)verify(s);
      const bool lowered = std::any_of(s.ranks.begin(), s.ranks.end(), [](const std::vector<action>& row) {
        return std::any_of(row.begin(), row.end(), [](const action& a) { return is_comm(a.type); });
      });
      if (!lowered) (void)verify(add_send_recv(s));
    } catch (const error& e) {
      finding = e.what();
    }
    HETMESH_ASSERT_AT(heavy, finding.empty(), "{}: schedule {} fails verification: {}", who, s.name, finding);
  }
}

}  // namespace hetmesh::pipeline
