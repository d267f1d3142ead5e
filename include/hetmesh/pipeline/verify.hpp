// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the schedule verifier. It checks structure (every stage runs F and a backward for
// every micro-batch exactly once, on the rank that owns the stage), communication (every SEND has its
// RECV on the peer, every cross-rank input arrives through one), and then runs the schedule as a
// token game under blocking send/receive to prove it finishes: dependencies satisfied in order, no
// deadlock. Along the way it records per-rank peak activation memory and in-flight micro-batches.
// An overlapped F+B (OVERLAP_F_B) is one step of the game: it runs once what both halves need is there,
// and then counts as both halves (each half exactly once, both on the rank of the list it sits in).
// Errors are invalid_argument naming the rank, the position and the offending action.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "action.hpp"
#include "lower.hpp"

namespace hetmesh::pipeline {

/// How the verifier's token game treats a SEND.
enum class send_mode : std::uint8_t {
  rendezvous,  ///< a SEND completes only together with its RECV (blocking both ways: the strict case).
  buffered,    ///< a SEND completes at once; its RECV completes once the SEND has (eager/isend).
};

/// Options of verify(): how sends complete.
struct verify_options {
  send_mode mode = send_mode::rendezvous;  ///< rendezvous or buffered sends
  int max_in_flight = 0;  ///< 0: no bound; else the most (stage, micro-batch) activations a rank may hold.
  bool require_backward = true;  ///< false for forward-only (inference) schedules.
  /// Bytes an F or EF action allocates (freed by its B / W / EB). Empty: 1 per action (counts).
  std::function<std::int64_t(const action&)> activation_bytes{};
};

/// What the verifier found (only returned when the schedule is valid).
struct verify_report {
  std::size_t actions = 0;                ///< all actions
  std::size_t compute_actions = 0;        ///< F, B, I, W, EF, EB
  std::size_t comm_pairs = 0;             ///< matched SEND/RECV pairs
  std::size_t sweeps = 0;                 ///< rank wake-ups in the token game (a cost measure)
  std::vector<int> peak_in_flight;        ///< per rank: most LLM activations held at once
  std::vector<std::int64_t> peak_memory;  ///< per rank: peak of activation_bytes held (LLM + encoder)
  friend bool operator==(const verify_report&, const verify_report&) = default;
  void hash_append(hasher& h) const {
    append_all(h, actions, compute_actions, comm_pairs, peak_in_flight, peak_memory);
  }
};

namespace detail {

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

}  // namespace detail

/// Verifies `s`; returns the report or throws invalid_argument naming the first problem (rank,
/// position, action, and what was expected). Schedules without communication actions are checked
/// with data dependencies directly; with them, every cross-rank input must arrive by RECV.
/// Not collective; pure; O(actions + sweeps * ranks).
[[nodiscard]] inline verify_report verify(const schedule& s, const verify_options& opt = {}) {
  const int nranks = s.total_ranks();
  const int S = s.num_stages, M = s.num_microbatches, E = s.num_encoder_shards();
  const std::string where = hetmesh::format("pipeline verify({})", s.name);
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

  verify_report rep;
  detail::action_flags present(S, E, M);
  bool explicit_comm = false;
  std::vector<int> reduce_seen(static_cast<std::size_t>(S), 0);
  // --- structure: ranges, owning rank, duplicates ---------------------------------------------------
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
              detail::action_flags::uses_shard(p.type) ? "encoder shard" : "stage",
              detail::action_flags::uses_shard(p.type) ? "shard" : "stage",
              detail::action_flags::uses_shard(p.type) ? E : S, M));
        if (s.rank_of(p) != r)
          fail(hetmesh::format("{}belongs on rank {} (by the stage/shard map)", half, s.rank_of(p)));
        if (present.get(p))
          fail(hetmesh::format("{}appears a second time; expected each action exactly once", half));
        present.set(p);
      }
    }
  }
  // --- completeness ---------------------------------------------------------------------------------
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
      if (opt.require_backward && !b && !i)
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
      if (opt.require_backward && !present.get(eb))
        throw_error<invalid_argument>("{}: `{}` is missing; expected an encoder backward per encoder forward",
                                      where, to_text(eb));
    }
  // --- communication pairs --------------------------------------------------------------------------
  for (int r = 0; r < nranks; ++r) {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const action& a = row[i];
      if (!is_comm(a.type)) continue;
      const action p = detail::partner(a);
      if (!present.get(p))
        throw_error<invalid_argument>(
            "{}: rank {} action #{} `{}` has no matching `{}` on rank {}; expected every {} "
            "matched by a {}",
            where, r, i, to_text(a), to_text(p), present.in_range(p) ? s.rank_of(p) : -1,
            is_send(a.type) ? "send" : "receive", is_send(a.type) ? "receive" : "send");
      if (is_send(a.type)) ++rep.comm_pairs;
    }
  }
  // --- token game -----------------------------------------------------------------------------------
  detail::action_flags done(S, E, M);
  std::vector<int> backward_done(static_cast<std::size_t>(S), 0);
  std::vector<std::size_t> pc(static_cast<std::size_t>(nranks), 0);
  std::vector<std::int64_t> mem(static_cast<std::size_t>(nranks), 0);
  std::vector<int> inflight(static_cast<std::size_t>(nranks), 0);
  rep.peak_memory.assign(static_cast<std::size_t>(nranks), 0);
  rep.peak_in_flight.assign(static_cast<std::size_t>(nranks), 0);
  auto bytes = [&](const action& a) -> std::int64_t {
    return opt.activation_bytes ? opt.activation_bytes(a) : 1;
  };
  auto bwd_done = [&](int st, int mb) { return done.get(B(st, mb)) || done.get(I(st, mb)); };

  // The first unmet requirement of compute/REDUCE_GRAD action `a` on rank r, or nullopt-equivalent
  // (`found` false). `same_rank` tells whether the requirement is produced on r itself.
  struct need {
    bool found = false;
    action what{};
    bool same_rank = false;
  };
  auto requirement_of = [&](const action& a, int r) -> need {
    auto input = [&](const action& producer_b, const action& producer_i, action via_recv) -> need {
      const int pr = s.rank_of(producer_b);
      const bool ok = done.get(producer_b) || (producer_i.type != producer_b.type && done.get(producer_i));
      if (pr == r || !explicit_comm) return ok ? need{} : need{true, producer_b, pr == r};
      return done.get(via_recv) ? need{} : need{true, via_recv, true};
    };
    const int mb = a.microbatch;
    switch (a.type) {
      case action_type::forward:
        if (a.stage > 0)
          return input(F(a.stage - 1, mb), F(a.stage - 1, mb), {a.stage, action_type::recv_f, mb});
        for (int e = 0; e < E; ++e) {
          const action ef{e, action_type::encoder_forward, mb};
          need n = input(ef, ef, {e, action_type::recv_ef, mb});
          if (n.found) return n;
        }
        return {};
      case action_type::backward:
      case action_type::backward_input:
        if (!done.get(F(a.stage, mb))) return {true, F(a.stage, mb), true};
        if (a.stage + 1 < S)
          return input(B(a.stage + 1, mb), I(a.stage + 1, mb), {a.stage, action_type::recv_b, mb});
        return {};
      case action_type::backward_weight:
        return done.get(I(a.stage, mb)) ? need{} : need{true, I(a.stage, mb), true};
      case action_type::encoder_forward:
        return {};
      case action_type::encoder_backward:
        if (!done.get({a.stage, action_type::encoder_forward, mb}))
          return {true, {a.stage, action_type::encoder_forward, mb}, true};
        return input(B(0, mb), I(0, mb), {a.stage, action_type::recv_eb, mb});
      case action_type::reduce_grad:
        return backward_done[static_cast<std::size_t>(a.stage)] == M ? need{}
                                                                     : need{true, B(a.stage, M - 1), true};
      case action_type::send_f:
        return done.get(F(a.stage, mb)) ? need{} : need{true, F(a.stage, mb), true};
      case action_type::send_b:
        return bwd_done(a.stage, mb) ? need{} : need{true, I(a.stage, mb), true};
      case action_type::send_ef:
        return done.get({a.stage, action_type::encoder_forward, mb})
                   ? need{}
                   : need{true, {a.stage, action_type::encoder_forward, mb}, true};
      case action_type::send_eb:
        return bwd_done(0, mb) ? need{} : need{true, B(0, mb), true};
      default:
        return {};
    }
  };
  // An overlapped F+B needs what both halves need before either runs (PyTorch checks every sub-action).
  auto requirement = [&](const action& a, int r) -> need {
    for (const action& p : parts(a)) {
      need n = requirement_of(p, r);
      if (n.found) return n;
    }
    return {};
  };
  auto order_error = [&](int r, std::size_t i, const action& a, const action& dep) {
    throw_error<invalid_argument>(
        "{}: rank {} action #{} `{}` needs `{}` first, which rank {} runs later or never; expected `{}` "
        "before it in "
        "rank {}'s list",
        where, r, i, to_text(a), to_text(dep), r, to_text(dep), r);
  };
  std::size_t executed = 0;
  auto execute = [&](int r, const action& whole) {
    ++executed;
    ++pc[static_cast<std::size_t>(r)];
    auto& m = mem[static_cast<std::size_t>(r)];
    auto& f = inflight[static_cast<std::size_t>(r)];
    for (const action& a : parts(whole)) {
      done.set(a);
      switch (a.type) {
        case action_type::forward:
          m += bytes(a);
          ++f;
          break;
        case action_type::encoder_forward:
          m += bytes(a);
          break;
        case action_type::backward:
        case action_type::backward_weight:
          m -= bytes(F(a.stage, a.microbatch));
          --f;
          ++backward_done[static_cast<std::size_t>(a.stage)];
          break;
        case action_type::encoder_backward:
          m -= bytes({a.stage, action_type::encoder_forward, a.microbatch});
          break;
        default:
          break;
      }
      // After each half: an overlap's forward activation and the one its backward frees coexist.
      auto& pm = rep.peak_memory[static_cast<std::size_t>(r)];
      auto& pf = rep.peak_in_flight[static_cast<std::size_t>(r)];
      pm = std::max(pm, m);
      pf = std::max(pf, f);
      if (opt.max_in_flight > 0 && f > opt.max_in_flight)
        throw_error<invalid_argument>(
            "{}: rank {} holds {} activations after `{}` (#{}), above the bound max_in_flight={}; expected "
            "at most {}",
            where, r, f, to_text(whole), pc[static_cast<std::size_t>(r)] - 1, opt.max_in_flight,
            opt.max_in_flight);
    }
  };
  const bool fast = !explicit_comm && E == 0 && !opt.activation_bytes;
  // Tries to run rank r's next action; true when something ran.
  auto step = [&](int r) -> bool {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    const std::size_t i = pc[static_cast<std::size_t>(r)];
    if (i >= row.size()) return false;
    const action a = row[i];
    // Fast path for the common case (no explicit communication, no encoder, no memory callable):
    // plain bit tests; anything unusual, and every failure, goes through the general path below.
    if (fast) {
      const int st = a.stage, mb = a.microbatch;
      bool ok = false;
      switch (a.type) {
        case action_type::forward:
          ok = st == 0 || done.get(F(st - 1, mb));
          break;
        case action_type::backward:
        case action_type::backward_input:
          ok = done.get(F(st, mb)) && (st + 1 == S || done.get(B(st + 1, mb)) || done.get(I(st + 1, mb)));
          break;
        case action_type::backward_weight:
          ok = done.get(I(st, mb));
          break;
        default:
          break;
      }
      if (ok) {
        ++executed;
        done.set(a);
        ++pc[static_cast<std::size_t>(r)];
        auto& f = inflight[static_cast<std::size_t>(r)];
        if (a.type == action_type::forward) {
          ++f;
          auto& pf = rep.peak_in_flight[static_cast<std::size_t>(r)];
          if (f > pf) {
            pf = f;
            if (opt.max_in_flight > 0 && f > opt.max_in_flight) {
              --executed;
              --pc[static_cast<std::size_t>(r)];
              --f;
              execute(r, a);  // reports the bound
            }
          }
        } else if (a.type != action_type::backward_input) {
          --f;
          ++backward_done[static_cast<std::size_t>(st)];
        }
        return true;
      }
    }
    const need n = requirement(a, r);
    if (n.found) {
      if (n.same_rank && !is_recv(n.what.type)) order_error(r, i, a, n.what);
      if (n.same_rank && is_recv(n.what.type) && present.get(n.what)) {
        // The RECV exists on this rank but was not reached: it sits after its consumer.
        order_error(r, i, a, n.what);
      }
      if (n.same_rank && is_recv(n.what.type))
        throw_error<invalid_argument>(
            "{}: rank {} action #{} `{}` consumes data from another rank but the schedule has no `{}`; "
            "expected a "
            "RECV before it (lower with add_send_recv)",
            where, r, i, to_text(a), to_text(n.what));
      return false;
    }
    if (!is_comm(a.type)) {
      execute(r, a);
      return true;
    }
    const action p = detail::partner(a);
    if (opt.mode == send_mode::buffered) {
      if (is_send(a.type) || done.get(p)) {
        execute(r, a);
        return true;
      }
      return false;
    }
    const int q = s.rank_of(p);
    const auto& qrow = s.ranks[static_cast<std::size_t>(q)];
    const std::size_t qi = pc[static_cast<std::size_t>(q)];
    if (qi >= qrow.size() || !(qrow[qi] == p)) return false;
    if (is_recv(a.type) && requirement(p, q).found) return false;  // the sender's data is not ready yet
    execute(r, a);
    execute(q, p);
    return true;
  };
  // Worklist token game: a rank is retried only when something it may wait for has happened, so the
  // game costs O(actions) rather than O(rounds * ranks).
  std::vector<int> queue;
  std::vector<std::uint8_t> queued(static_cast<std::size_t>(nranks), 1);
  queue.reserve(static_cast<std::size_t>(nranks) * 2);
  for (int r = nranks - 1; r >= 0; --r) queue.push_back(r);
  auto wake = [&](int q) {
    if (!queued[static_cast<std::size_t>(q)]) {
      queued[static_cast<std::size_t>(q)] = 1;
      queue.push_back(q);
    }
  };
  // Ranks that may be waiting for `a`, which just ran.
  auto at = [&](int q, const action& want) {
    const auto& row = s.ranks[static_cast<std::size_t>(q)];
    const std::size_t i = pc[static_cast<std::size_t>(q)];
    if (i >= row.size()) return false;
    for (const action& p : parts(row[i]))
      if (p.stage == want.stage && p.microbatch == want.microbatch &&
          (p.type == want.type ||
           (want.type == action_type::backward && p.type == action_type::backward_input)))
        return true;
    return false;
  };
  auto wake_consumers_of = [&](const action& a) {
    if (fast) {  // wake a consumer only when it sits at the action that waits for `a`
      if (a.type == action_type::forward && a.stage + 1 < S) {
        const int q = s.rank_of_stage(a.stage + 1);
        if (at(q, F(a.stage + 1, a.microbatch))) wake(q);
      } else if ((a.type == action_type::backward || a.type == action_type::backward_input) && a.stage > 0) {
        const int q = s.rank_of_stage(a.stage - 1);
        if (at(q, B(a.stage - 1, a.microbatch))) wake(q);
      }
      return;
    }
    switch (a.type) {
      case action_type::forward:
        if (a.stage + 1 < S) wake(s.rank_of_stage(a.stage + 1));
        break;
      case action_type::backward:
      case action_type::backward_input:
        if (a.stage > 0) wake(s.rank_of_stage(a.stage - 1));
        if (a.stage == 0)
          for (int e = 0; e < E; ++e) wake(s.encoder_shard_to_rank[static_cast<std::size_t>(e)]);
        break;
      case action_type::encoder_forward:
        wake(s.rank_of_stage(0));
        break;
      default:
        if (is_comm(a.type)) wake(s.rank_of(detail::partner(a)));
        break;
    }
  };
  auto wake_consumers = [&](const action& a) {
    for (const action& p : parts(a)) wake_consumers_of(p);
  };
  {
    while (!queue.empty()) {
      const int r = queue.back();
      queue.pop_back();
      queued[static_cast<std::size_t>(r)] = 0;
      ++rep.sweeps;
      while (true) {
        const std::size_t before = pc[static_cast<std::size_t>(r)];
        if (!step(r)) break;
        wake_consumers(s.ranks[static_cast<std::size_t>(r)][before]);
      }
    }
    if (executed != rep.actions) {
      std::string msg;
      for (int r = 0; r < nranks; ++r) {
        const auto& row = s.ranks[static_cast<std::size_t>(r)];
        const std::size_t i = pc[static_cast<std::size_t>(r)];
        if (i >= row.size()) continue;
        const action a = row[i];
        const need n = requirement(a, r);
        const action waits = n.found ? n.what : (is_comm(a.type) ? detail::partner(a) : a);
        const int q = s.rank_of(waits);
        const std::size_t qi = pc[static_cast<std::size_t>(q)];
        msg += hetmesh::format(
            "\n  rank {} blocked at #{} `{}`, waiting for `{}` on rank {} (which is at {})", r, i, to_text(a),
            to_text(waits), q,
            qi < s.ranks[static_cast<std::size_t>(q)].size()
                ? hetmesh::format("#{} `{}`", qi, to_text(s.ranks[static_cast<std::size_t>(q)][qi]))
                : std::string("its end"));
      }
      throw_error<invalid_argument>("{}: deadlock under {} send/receive; no rank can make progress:{}", where,
                                    opt.mode == send_mode::rendezvous ? "blocking (rendezvous)" : "buffered",
                                    msg);
    }
  }
  if (fast)  // one unit per activation: memory is the in-flight count
    for (int r = 0; r < nranks; ++r)
      rep.peak_memory[static_cast<std::size_t>(r)] =
          std::max(rep.peak_memory[static_cast<std::size_t>(r)],
                   static_cast<std::int64_t>(rep.peak_in_flight[static_cast<std::size_t>(r)]));
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

template <>
struct fmt::formatter<hetmesh::pipeline::verify_report> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::verify_report& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(
        ctx.out(),
        "verified: {} actions ({} compute, {} send/recv pairs); peak in-flight per rank:", r.actions,
        r.compute_actions, r.comm_pairs);
    for (int v : r.peak_in_flight) out = hetmesh::format_to(out, " {}", v);
    out = hetmesh::format_to(out, "; peak memory per rank:");
    for (auto v : r.peak_memory) out = hetmesh::format_to(out, " {}", v);
    return out;
  }
};
