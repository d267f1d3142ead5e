// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline::detail: the verifier's token game. It runs a structurally valid schedule under
// blocking (rendezvous) or buffered send/receive, one action at a time, to prove that it finishes: every
// action's inputs are there when it runs (in its rank's order), and no set of ranks waits on each other
// forever. Along the way it records per-rank peak activation memory and in-flight micro-batches. A
// worklist retries a rank only when something it may wait for has happened, so the game costs
// O(actions) rather than O(rounds * ranks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/format.hpp"
#include "../action.hpp"
#include "../lower.hpp"
#include "../verify_report.hpp"
#include "verify_checks.hpp"

namespace hetmesh::pipeline::detail {

/// The first unmet requirement of an action (`found` false: none). `same_rank` tells whether the
/// requirement is produced on the action's own rank.
struct need {
  bool found = false;
  action what{};
  bool same_rank = false;
};

/// One run of the token game over a schedule that passed the static checks (verify_checks.hpp).
class token_game {
 public:
  /// `present`: the actions of `s`; `explicit_comm`: whether `s` has SEND/RECV actions. Fills the peaks
  /// and sweeps of `rep` (whose action count must be set).
  token_game(const schedule& s, const verify_options& opt, const std::string& where,
             const action_flags& present, bool explicit_comm, verify_report& rep)
      : s_(s),
        opt_(opt),
        where_(where),
        present_(present),
        explicit_comm_(explicit_comm),
        rep_(rep),
        nranks_(s.total_ranks()),
        S_(s.num_stages),
        M_(s.num_microbatches),
        E_(s.num_encoder_shards()),
        done_(S_, E_, M_),
        backward_done_(static_cast<std::size_t>(S_), 0),
        pc_(static_cast<std::size_t>(nranks_), 0),
        mem_(static_cast<std::size_t>(nranks_), 0),
        inflight_(static_cast<std::size_t>(nranks_), 0),
        fast_(!explicit_comm && E_ == 0 && !opt.activation_bytes) {
    rep_.peak_memory.assign(static_cast<std::size_t>(nranks_), 0);
    rep_.peak_in_flight.assign(static_cast<std::size_t>(nranks_), 0);
  }

  /// Plays the game to its end; throws invalid_argument naming the blocked ranks on a deadlock, and the
  /// rank, position and action on an order error or a broken in-flight bound.
  void run() {
    auto& queue = queue_;
    queued_.assign(static_cast<std::size_t>(nranks_), 1);
    queue.reserve(static_cast<std::size_t>(nranks_) * 2);
    for (int r = nranks_ - 1; r >= 0; --r) queue.push_back(r);
    while (!queue.empty()) {
      const int r = queue.back();
      queue.pop_back();
      queued_[static_cast<std::size_t>(r)] = 0;
      ++rep_.sweeps;
      while (true) {
        const std::size_t before = pc_[static_cast<std::size_t>(r)];
        if (!step(r)) break;
        wake_consumers(s_.ranks[static_cast<std::size_t>(r)][before]);
      }
    }
    if (executed_ != rep_.actions) deadlock();
    if (fast_)  // one unit per activation: memory is the in-flight count
      for (int r = 0; r < nranks_; ++r)
        rep_.peak_memory[static_cast<std::size_t>(r)] =
            std::max(rep_.peak_memory[static_cast<std::size_t>(r)],
                     static_cast<std::int64_t>(rep_.peak_in_flight[static_cast<std::size_t>(r)]));
  }

 private:
  std::int64_t bytes(const action& a) const { return opt_.activation_bytes ? opt_.activation_bytes(a) : 1; }
  bool bwd_done(int st, int mb) const { return done_.get(B(st, mb)) || done_.get(I(st, mb)); }

  // An input made by `producer_b` (or its split form `producer_i`) on some rank, which reaches rank r
  // by `via_recv` when the schedule has explicit communication.
  need input(int r, const action& producer_b, const action& producer_i, action via_recv) const {
    const int pr = s_.rank_of(producer_b);
    const bool ok = done_.get(producer_b) || (producer_i.type != producer_b.type && done_.get(producer_i));
    if (pr == r || !explicit_comm_) return ok ? need{} : need{true, producer_b, pr == r};
    return done_.get(via_recv) ? need{} : need{true, via_recv, true};
  }

  // The first unmet requirement of compute/REDUCE_GRAD/SEND action `a` on rank r.
  need requirement_of(const action& a, int r) const {
    const int mb = a.microbatch;
    switch (a.type) {
      case action_type::forward:
        if (a.stage > 0)
          return input(r, F(a.stage - 1, mb), F(a.stage - 1, mb), {a.stage, action_type::recv_f, mb});
        for (int e = 0; e < E_; ++e) {
          const action ef{e, action_type::encoder_forward, mb};
          need n = input(r, ef, ef, {e, action_type::recv_ef, mb});
          if (n.found) return n;
        }
        return {};
      case action_type::backward:
      case action_type::backward_input:
        if (!done_.get(F(a.stage, mb))) return {true, F(a.stage, mb), true};
        if (a.stage + 1 < S_)
          return input(r, B(a.stage + 1, mb), I(a.stage + 1, mb), {a.stage, action_type::recv_b, mb});
        return {};
      case action_type::backward_weight:
        return done_.get(I(a.stage, mb)) ? need{} : need{true, I(a.stage, mb), true};
      case action_type::encoder_forward:
        return {};
      case action_type::encoder_backward:
        if (!done_.get({a.stage, action_type::encoder_forward, mb}))
          return {true, {a.stage, action_type::encoder_forward, mb}, true};
        return input(r, B(0, mb), I(0, mb), {a.stage, action_type::recv_eb, mb});
      case action_type::reduce_grad:
        return backward_done_[static_cast<std::size_t>(a.stage)] == M_ ? need{}
                                                                       : need{true, B(a.stage, M_ - 1), true};
      case action_type::send_f:
        return done_.get(F(a.stage, mb)) ? need{} : need{true, F(a.stage, mb), true};
      case action_type::send_b:
        return bwd_done(a.stage, mb) ? need{} : need{true, I(a.stage, mb), true};
      case action_type::send_ef:
        return done_.get({a.stage, action_type::encoder_forward, mb})
                   ? need{}
                   : need{true, {a.stage, action_type::encoder_forward, mb}, true};
      case action_type::send_eb:
        return bwd_done(0, mb) ? need{} : need{true, B(0, mb), true};
      default:
        return {};
    }
  }

  // An overlapped F+B needs what both halves need before either runs (PyTorch checks every sub-action).
  need requirement(const action& a, int r) const {
    for (const action& p : parts(a)) {
      need n = requirement_of(p, r);
      if (n.found) return n;
    }
    return {};
  }

  void order_error(int r, std::size_t i, const action& a, const action& dep) const {
    throw_error<invalid_argument>(
        "{}: rank {} action #{} `{}` needs `{}` first, which rank {} runs later or never; expected `{}` "
        "before it in "
        "rank {}'s list",
        where_, r, i, to_text(a), to_text(dep), r, to_text(dep), r);
  }

  // Runs `whole` on rank r: marks it done, advances r, tracks memory and in-flight activations.
  void execute(int r, const action& whole) {
    ++executed_;
    ++pc_[static_cast<std::size_t>(r)];
    auto& m = mem_[static_cast<std::size_t>(r)];
    auto& f = inflight_[static_cast<std::size_t>(r)];
    for (const action& a : parts(whole)) {
      done_.set(a);
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
          ++backward_done_[static_cast<std::size_t>(a.stage)];
          break;
        case action_type::encoder_backward:
          m -= bytes({a.stage, action_type::encoder_forward, a.microbatch});
          break;
        default:
          break;
      }
      // After each half: an overlap's forward activation and the one its backward frees coexist.
      auto& pm = rep_.peak_memory[static_cast<std::size_t>(r)];
      auto& pf = rep_.peak_in_flight[static_cast<std::size_t>(r)];
      pm = std::max(pm, m);
      pf = std::max(pf, f);
      if (opt_.max_in_flight > 0 && f > opt_.max_in_flight)
        throw_error<invalid_argument>(
            "{}: rank {} holds {} activations after `{}` (#{}), above the bound max_in_flight={}; expected "
            "at most {}",
            where_, r, f, to_text(whole), pc_[static_cast<std::size_t>(r)] - 1, opt_.max_in_flight,
            opt_.max_in_flight);
    }
  }

  // Fast path for the common case (no explicit communication, no encoder, no memory callable): plain bit
  // tests; true when `a`, rank r's next action, ran. Anything unusual, and every failure, is left to the
  // general path of step().
  bool step_fast(int r, const action& a) {
    const int st = a.stage, mb = a.microbatch;
    bool ok = false;
    switch (a.type) {
      case action_type::forward:
        ok = st == 0 || done_.get(F(st - 1, mb));
        break;
      case action_type::backward:
      case action_type::backward_input:
        ok = done_.get(F(st, mb)) && (st + 1 == S_ || done_.get(B(st + 1, mb)) || done_.get(I(st + 1, mb)));
        break;
      case action_type::backward_weight:
        ok = done_.get(I(st, mb));
        break;
      default:
        break;
    }
    if (!ok) return false;
    ++executed_;
    done_.set(a);
    ++pc_[static_cast<std::size_t>(r)];
    auto& f = inflight_[static_cast<std::size_t>(r)];
    if (a.type == action_type::forward) {
      ++f;
      auto& pf = rep_.peak_in_flight[static_cast<std::size_t>(r)];
      if (f > pf) {
        pf = f;
        if (opt_.max_in_flight > 0 && f > opt_.max_in_flight) {
          --executed_;
          --pc_[static_cast<std::size_t>(r)];
          --f;
          execute(r, a);  // reports the bound
        }
      }
    } else if (a.type != action_type::backward_input) {
      --f;
      ++backward_done_[static_cast<std::size_t>(st)];
    }
    return true;
  }

  // Tries to run rank r's next action; true when something ran.
  bool step(int r) {
    const auto& row = s_.ranks[static_cast<std::size_t>(r)];
    const std::size_t i = pc_[static_cast<std::size_t>(r)];
    if (i >= row.size()) return false;
    const action a = row[i];
    if (fast_ && step_fast(r, a)) return true;
    const need n = requirement(a, r);
    if (n.found) {
      if (n.same_rank && !is_recv(n.what.type)) order_error(r, i, a, n.what);
      if (n.same_rank && is_recv(n.what.type) && present_.get(n.what)) {
        // The RECV exists on this rank but was not reached: it sits after its consumer.
        order_error(r, i, a, n.what);
      }
      if (n.same_rank && is_recv(n.what.type))
        throw_error<invalid_argument>(
            "{}: rank {} action #{} `{}` consumes data from another rank but the schedule has no `{}`; "
            "expected a "
            "RECV before it (lower with add_send_recv)",
            where_, r, i, to_text(a), to_text(n.what));
      return false;
    }
    if (!is_comm(a.type)) {
      execute(r, a);
      return true;
    }
    const action p = partner(a);
    if (opt_.mode == send_mode::buffered) {
      if (is_send(a.type) || done_.get(p)) {
        execute(r, a);
        return true;
      }
      return false;
    }
    const int q = s_.rank_of(p);
    const auto& qrow = s_.ranks[static_cast<std::size_t>(q)];
    const std::size_t qi = pc_[static_cast<std::size_t>(q)];
    if (qi >= qrow.size() || !(qrow[qi] == p)) return false;
    if (is_recv(a.type) && requirement(p, q).found) return false;  // the sender's data is not ready yet
    execute(r, a);
    execute(q, p);
    return true;
  }

  void wake(int q) {
    if (!queued_[static_cast<std::size_t>(q)]) {
      queued_[static_cast<std::size_t>(q)] = 1;
      queue_.push_back(q);
    }
  }

  // Whether rank q's next action is (or, overlapped, holds) `want` (a B also stands for its I).
  bool at(int q, const action& want) const {
    const auto& row = s_.ranks[static_cast<std::size_t>(q)];
    const std::size_t i = pc_[static_cast<std::size_t>(q)];
    if (i >= row.size()) return false;
    for (const action& p : parts(row[i]))
      if (p.stage == want.stage && p.microbatch == want.microbatch &&
          (p.type == want.type ||
           (want.type == action_type::backward && p.type == action_type::backward_input)))
        return true;
    return false;
  }

  // Wakes the ranks that may be waiting for `a`, which just ran.
  void wake_consumers_of(const action& a) {
    if (fast_) {  // wake a consumer only when it sits at the action that waits for `a`
      if (a.type == action_type::forward && a.stage + 1 < S_) {
        const int q = s_.rank_of_stage(a.stage + 1);
        if (at(q, F(a.stage + 1, a.microbatch))) wake(q);
      } else if ((a.type == action_type::backward || a.type == action_type::backward_input) && a.stage > 0) {
        const int q = s_.rank_of_stage(a.stage - 1);
        if (at(q, B(a.stage - 1, a.microbatch))) wake(q);
      }
      return;
    }
    switch (a.type) {
      case action_type::forward:
        if (a.stage + 1 < S_) wake(s_.rank_of_stage(a.stage + 1));
        break;
      case action_type::backward:
      case action_type::backward_input:
        if (a.stage > 0) wake(s_.rank_of_stage(a.stage - 1));
        if (a.stage == 0)
          for (int e = 0; e < E_; ++e) wake(s_.encoder_shard_to_rank[static_cast<std::size_t>(e)]);
        break;
      case action_type::encoder_forward:
        wake(s_.rank_of_stage(0));
        break;
      default:
        if (is_comm(a.type)) wake(s_.rank_of(partner(a)));
        break;
    }
  }

  void wake_consumers(const action& a) {
    for (const action& p : parts(a)) wake_consumers_of(p);
  }

  // Throws the deadlock error: where each unfinished rank is blocked and what it waits for.
  void deadlock() const {
    std::string msg;
    for (int r = 0; r < nranks_; ++r) {
      const auto& row = s_.ranks[static_cast<std::size_t>(r)];
      const std::size_t i = pc_[static_cast<std::size_t>(r)];
      if (i >= row.size()) continue;
      const action a = row[i];
      const need n = requirement(a, r);
      const action waits = n.found ? n.what : (is_comm(a.type) ? partner(a) : a);
      const int q = s_.rank_of(waits);
      const std::size_t qi = pc_[static_cast<std::size_t>(q)];
      msg += hetmesh::format(
          "\n  rank {} blocked at #{} `{}`, waiting for `{}` on rank {} (which is at {})", r, i, to_text(a),
          to_text(waits), q,
          qi < s_.ranks[static_cast<std::size_t>(q)].size()
              ? hetmesh::format("#{} `{}`", qi, to_text(s_.ranks[static_cast<std::size_t>(q)][qi]))
              : std::string("its end"));
    }
    throw_error<invalid_argument>("{}: deadlock under {} send/receive; no rank can make progress:{}", where_,
                                  opt_.mode == send_mode::rendezvous ? "blocking (rendezvous)" : "buffered",
                                  msg);
  }

  const schedule& s_;
  const verify_options& opt_;
  const std::string& where_;
  const action_flags& present_;
  bool explicit_comm_;
  verify_report& rep_;
  int nranks_, S_, M_, E_;
  action_flags done_;                 // the actions that have run
  std::vector<int> backward_done_;    // per stage: micro-batches whose backward ran
  std::vector<std::size_t> pc_;       // per rank: the next action's index
  std::vector<std::int64_t> mem_;     // per rank: activation bytes held
  std::vector<int> inflight_;         // per rank: LLM activations held
  std::size_t executed_ = 0;          // actions run so far
  bool fast_;                         // no SEND/RECV, no encoder, no memory callable
  std::vector<std::uint8_t> queued_;  // per rank: in the worklist
  std::vector<int> queue_;            // the worklist: ranks to retry
};

}  // namespace hetmesh::pipeline::detail
