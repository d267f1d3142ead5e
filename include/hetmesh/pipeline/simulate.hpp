// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: a discrete-event simulator of one training step. Each rank has one compute stream
// that runs its compute actions in list order; each ordered pair of ranks has one link that carries
// transfers first-come first-served. Costs are per action (so per micro-batch: variable lengths just
// give different numbers), supplied as callables; the cost room's models plug in there. Send/receive
// actions in the list are not simulated one by one: every cross-rank input travels over its link when
// the producer finishes, which is what the lowered SEND/RECV pairs do on real hardware. An overlapped
// forward-backward (OVERLAP_F_B) starts when both halves' inputs are there, lasts cost_model::overlap of
// its halves' costs (their sum by default), and hands both halves' outputs on when it ends.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../cost/activation_memory.hpp"
#include "../cost/comm.hpp"
#include "../cost/compute.hpp"
#include "action.hpp"

namespace hetmesh::pipeline {

/// Per-action costs. `compute` is required; the others default to 0 seconds and 1 unit.
struct cost_model {
  /// Seconds a compute action (F, B, I, W, EF, EB, REDUCE_GRAD) occupies its rank's stream.
  std::function<double(const action&)> compute{};
  /// Seconds to move the output of producing action `a` (F: activation; B/I: input gradient; EF: encoder
  /// output; B/I on stage 0: embedding gradient) to a consumer on another rank.
  std::function<double(const action&)> transfer{};
  /// Bytes an F or EF keeps alive until its B / W / EB.
  std::function<std::int64_t(const action&)> memory{};
  /// Seconds an overlapped forward-backward (OVERLAP_F_B) occupies its rank's stream, from its halves'
  /// `compute` seconds (forward, backward). Empty: their sum, because both halves run on the one
  /// compute stream (what DualPipe overlaps is a half's communication, which no action here models);
  /// e.g. `[](double f, double b) { return std::max(f, b); }` for perfect overlap.
  std::function<double(double, double)> overlap{};
};

/// Equal costs for every micro-batch: F = forward, B = backward, I = backward - weight, W = weight,
/// EF = encoder_forward, EB = encoder_backward, each transfer = transfer, memory 1 per activation.
struct uniform_costs {
  double forward = 1.0;           ///< F
  double backward = 2.0;          ///< full B
  double weight = 1.0;            ///< the W part of a split backward (I takes backward - weight)
  double encoder_forward = 0.0;   ///< EF
  double encoder_backward = 0.0;  ///< EB
  double transfer = 0.0;          ///< each send/recv

  /// The cost model of these costs, for simulate().
  [[nodiscard]] cost_model model() const {
    const uniform_costs c = *this;
    cost_model m;
    m.compute = [c](const action& a) {
      switch (a.type) {
        case action_type::forward:
          return c.forward;
        case action_type::backward:
          return c.backward;
        case action_type::backward_input:
          return c.backward - c.weight;
        case action_type::backward_weight:
          return c.weight;
        case action_type::encoder_forward:
          return c.encoder_forward;
        case action_type::encoder_backward:
          return c.encoder_backward;
        default:
          return 0.0;
      }
    };
    m.transfer = [c](const action&) { return c.transfer; };
    return m;
  }
};

/// Per-action costs of variable micro-batches, in seconds: a stage's forward of micro-batch k costs
/// forward_s[k], the full backward twice that (I and W one forward each); transfer_s[k] moves its
/// activation (or gradient) between stages; an F keeps memory_bytes[k] alive. Built from cost/'s
/// models by `priced`, or filled by hand.
struct micro_batch_costs {
  std::vector<double> forward_s;           ///< per micro-batch: forward time
  std::vector<double> transfer_s;          ///< per micro-batch: stage-to-stage transfer time
  std::vector<std::int64_t> memory_bytes;  ///< per micro-batch: activation memory of an F

  /// Prices micro-batch k (its documents `docs[k]`, packed in one row) with cost/ models: the
  /// backbone `llm` (llm.layers layers, in ms) cut into `stage_shards` equal parts (pipeline stages x
  /// tensor-parallel ranks), so a stage's forward is llm.packed_row / (train_factor x stage_shards);
  /// the activation handed on is tokens x hidden bf16 values over `stage_link`; a stage keeps
  /// act.bytes(tokens). Pre: stage_shards > 0, hidden >= 0. O(documents).
  [[nodiscard]] static micro_batch_costs priced(std::span<const std::vector<std::int64_t>> docs,
                                                const cost::llm_compute& llm, double stage_shards,
                                                const cost::link& stage_link, std::int64_t hidden,
                                                const cost::activation_memory& act) {
    if (!(stage_shards > 0.0) || hidden < 0)
      throw_error<invalid_argument>(
          "pipeline::micro_batch_costs::priced: stage_shards = {}, hidden = {}; expected > 0 and >= 0",
          stage_shards, hidden);
    micro_batch_costs c;
    for (const auto& d : docs) {
      const std::int64_t tokens =
          checked_sum(d, "pipeline::micro_batch_costs::priced: a micro-batch's tokens");
      // Activation bytes are int64 in the simulator; 2^62 leaves room for the live ones' sum to be checked.
      if (!(act.bytes(tokens) < 0x1p62))
        throw_error<overflow_error>(
            "pipeline::micro_batch_costs::priced: a micro-batch of {} tokens keeps {:.3g} activation bytes "
            "on a "
            "stage; expected fewer than 2^62",
            tokens, act.bytes(tokens));
      // Model units are ms; the simulator's are seconds.
      c.forward_s.push_back(llm.packed_row(d) / (llm.train_factor * stage_shards) / 1000.0);
      c.transfer_s.push_back(
          stage_link.time(2.0 * static_cast<double>(hidden) * static_cast<double>(tokens)) / 1000.0);
      c.memory_bytes.push_back(static_cast<std::int64_t>(act.bytes(tokens)));
    }
    return c;
  }

  /// The cost model of these costs, for simulate().
  [[nodiscard]] cost_model model() const {
    const auto f = forward_s;
    const auto t = transfer_s;
    const auto m = memory_bytes;
    cost_model c;
    c.compute = [f](const action& a) {
      const double x = f.at(static_cast<std::size_t>(a.microbatch));
      switch (a.type) {
        case action_type::forward:
          return x;
        case action_type::backward:
          return 2.0 * x;
        case action_type::backward_input:
        case action_type::backward_weight:
          return x;
        default:
          return 0.0;
      }
    };
    c.transfer = [t](const action& a) {
      return a.microbatch >= 0 ? t.at(static_cast<std::size_t>(a.microbatch)) : 0.0;
    };
    c.memory = [m](const action& a) {
      return a.microbatch >= 0 ? m.at(static_cast<std::size_t>(a.microbatch)) : std::int64_t{0};
    };
    return c;
  }
};

/// One action placed in time.
struct timed_action {
  int rank = 0;  ///< rank that runs it
  action what;   ///< the action
  ///@{
  /// Start and end time of the action.
  double start = 0, end = 0;
  ///@}
  friend bool operator==(const timed_action&, const timed_action&) = default;
};

/// The outcome of a simulated step.
struct simulation {
  double step_time = 0;                   ///< last finish time
  double bubble_ratio = 0;                ///< 1 - busy / (ranks * step_time), over all ranks
  std::vector<double> busy;               ///< per rank: seconds of compute
  std::vector<std::int64_t> peak_memory;  ///< per rank: peak activation memory (cost_model::memory units)
  std::vector<timed_action> timeline;     ///< compute actions in start order (when recorded)
  std::size_t events = 0;                 ///< events processed (finishes and arrivals)
};

namespace detail {

/// The event engine shared by the simulator and the joint encoder planner. `Source` picks each rank's
/// next compute action: `std::optional<action> pick(engine&, int rank)` (nullopt: wait for an event) and
/// `void started(engine&, int rank, const action&)`, `bool finished(int rank)`.
template <class Source>
class engine {
 public:
  engine(const schedule& s, const cost_model& c, Source& src, bool record)
      : s_(s),
        c_(c),
        src_(src),
        record_(record),
        R_(s.total_ranks()),
        S_(s.num_stages),
        M_(s.num_microbatches),
        E_(s.num_encoder_shards()) {
    if (!c.compute)
      throw_error<invalid_argument>(
          "pipeline simulate({}): the cost model has no compute callable; expected one", s.name);
    const auto sm = static_cast<std::size_t>(S_) * static_cast<std::size_t>(M_);
    const auto em = static_cast<std::size_t>(E_) * static_cast<std::size_t>(M_);
    f_in_.assign(sm, 0);
    b_in_.assign(sm, 0);
    f_done_.assign(sm, 0);
    i_done_.assign(sm, 0);
    ef_done_.assign(em, 0);
    eb_in_.assign(em, 0);
    ef_in_count_.assign(static_cast<std::size_t>(M_), 0);
    bwd_count_.assign(static_cast<std::size_t>(S_), 0);
    link_free_.assign(static_cast<std::size_t>(R_) * static_cast<std::size_t>(R_), 0.0);
    mem_.assign(static_cast<std::size_t>(R_), 0);
    out_.busy.assign(static_cast<std::size_t>(R_), 0.0);
    out_.peak_memory.assign(static_cast<std::size_t>(R_), 0);
    running_.assign(static_cast<std::size_t>(R_), action{});
    is_running_.assign(static_cast<std::size_t>(R_), 0);
  }

  [[nodiscard]] double now() const noexcept { return now_; }
  [[nodiscard]] const schedule& sched() const noexcept { return s_; }
  [[nodiscard]] bool idle(int r) const noexcept { return !is_running_[static_cast<std::size_t>(r)]; }

  /// Whether action a's inputs are on its rank now.
  [[nodiscard]] bool ready(const action& a) const noexcept {
    if (a.type == action_type::overlap_f_b) {  // both halves' inputs, as PyTorch's runtime needs
      const auto p = parts(a);
      return ready(p.part[0]) && ready(p.part[1]);
    }
    const std::size_t k = sm(a.stage, a.microbatch);
    switch (a.type) {
      case action_type::forward:
        return a.stage == 0 ? ef_in_count_[static_cast<std::size_t>(a.microbatch)] == E_ : f_in_[k] != 0;
      case action_type::backward:
      case action_type::backward_input:
        return f_done_[k] != 0 && (a.stage == S_ - 1 || b_in_[k] != 0);
      case action_type::backward_weight:
        return i_done_[k] != 0;
      case action_type::encoder_forward:
        return true;
      case action_type::encoder_backward:
        return ef_done_[em(a.stage, a.microbatch)] != 0 && eb_in_[em(a.stage, a.microbatch)] != 0;
      case action_type::reduce_grad:
        return bwd_count_[static_cast<std::size_t>(a.stage)] == M_;
      default:
        return true;
    }
  }

  void wake_all() {
    for (int r = 0; r < R_; ++r) try_start(r);
  }

  simulation run() {
    for (int r = 0; r < R_; ++r) try_start(r);
    while (!events_.empty()) {
      const event e = events_.top();
      events_.pop();
      now_ = e.time;
      ++out_.events;
      if (e.kind == event_kind::finish) {
        finish(e.rank);
      } else {
        arrive(e);
        try_start(e.rank);
      }
    }
    for (int r = 0; r < R_; ++r) {
      if (!src_.finished(r)) {
        auto next = src_.pick(*this, r);
        throw_error<invalid_argument>(
            "pipeline simulate({}): rank {} cannot finish: its next action {} never becomes ready (inputs "
            "missing or "
            "a dependency cycle); expected a schedule that passes verify()",
            s_.name, r, next ? to_text(*next) : std::string("(none ready)"));
      }
    }
    double busy = 0;
    for (double b : out_.busy) busy += b;
    out_.bubble_ratio = out_.step_time > 0 ? 1.0 - busy / (static_cast<double>(R_) * out_.step_time) : 0.0;
    return std::move(out_);
  }

 private:
  enum class event_kind : std::uint8_t { finish, arrive_f, arrive_b, arrive_ef, arrive_eb };
  struct event {
    double time;
    std::uint64_t seq;
    event_kind kind;
    int rank;
    int a, b;  // (stage|shard, micro-batch) of the arriving input
    friend bool operator>(const event& x, const event& y) {
      return x.time != y.time ? x.time > y.time : x.seq > y.seq;
    }
  };

  [[nodiscard]] std::size_t sm(int st, int mb) const noexcept {
    return static_cast<std::size_t>(st) * static_cast<std::size_t>(M_) + static_cast<std::size_t>(mb);
  }
  [[nodiscard]] std::size_t em(int e, int mb) const noexcept { return sm(e, mb); }

  void push(double t, event_kind k, int rank, int a, int b) { events_.push(event{t, seq_++, k, rank, a, b}); }

  void try_start(int r) {
    if (!idle(r)) return;
    auto a = src_.pick(*this, r);
    if (!a) return;
    double d = 0;
    if (a->type == action_type::overlap_f_b) {
      const auto p = parts(*a);
      const double f = c_.compute(p.part[0]), b = c_.compute(p.part[1]);
      d = c_.overlap ? c_.overlap(f, b) : f + b;
    } else {
      d = c_.compute(*a);
    }
    if (!(d >= 0) || !std::isfinite(d))
      throw_error<invalid_argument>(
          "pipeline simulate({}): cost of {} is {}; expected a finite, non-negative number of seconds",
          s_.name, to_text(*a), d);
    running_[static_cast<std::size_t>(r)] = *a;
    is_running_[static_cast<std::size_t>(r)] = 1;
    if (a->type == action_type::forward || a->type == action_type::encoder_forward ||
        a->type == action_type::overlap_f_b) {
      auto& m = mem_[static_cast<std::size_t>(r)];
      const action f = parts(*a).part[0];
      m = checked_add(
          m, c_.memory ? c_.memory(f) : 1,
          hetmesh::format("pipeline simulate({}): live activation memory of rank {}", s_.name, r));
      out_.peak_memory[static_cast<std::size_t>(r)] =
          std::max(out_.peak_memory[static_cast<std::size_t>(r)], m);
    }
    out_.busy[static_cast<std::size_t>(r)] += d;
    if (record_) out_.timeline.push_back(timed_action{r, *a, now_, now_ + d});
    push(now_ + d, event_kind::finish, r, 0, 0);
    src_.started(*this, r, *a);
  }

  void send(int from, int to, const action& producer, event_kind k, int a, int b) {
    const double d = c_.transfer ? c_.transfer(producer) : 0.0;
    double& free = link_free_[static_cast<std::size_t>(from) * static_cast<std::size_t>(R_) +
                              static_cast<std::size_t>(to)];
    const double start = std::max(now_, free);
    free = start + d;
    push(free, k, to, a, b);
  }

  void arrive(const event& e) {
    switch (e.kind) {
      case event_kind::arrive_f:
        f_in_[sm(e.a, e.b)] = 1;
        break;
      case event_kind::arrive_b:
        b_in_[sm(e.a, e.b)] = 1;
        break;
      case event_kind::arrive_ef:
        ++ef_in_count_[static_cast<std::size_t>(e.b)];
        break;
      case event_kind::arrive_eb:
        eb_in_[em(e.a, e.b)] = 1;
        break;
      default:
        break;
    }
  }

  void finish(int r) {
    const action whole = running_[static_cast<std::size_t>(r)];
    is_running_[static_cast<std::size_t>(r)] = 0;
    out_.step_time = std::max(out_.step_time, now_);
    for (const action& a : parts(whole)) finish_part(r, a);  // an OVERLAP_F_B delivers both at its end
    try_start(r);
  }

  void finish_part(int r, const action& a) {
    const int mb = a.microbatch;
    auto free_mem = [&](const action& producer) {
      mem_[static_cast<std::size_t>(r)] -= c_.memory ? c_.memory(producer) : 1;
    };
    auto deliver = [&](int to, event_kind k, int x, int y, std::vector<std::uint8_t>* local_flag) {
      if (to == r) {
        if (local_flag != nullptr) (*local_flag)[sm(x, y)] = 1;
        if (k == event_kind::arrive_ef) ++ef_in_count_[static_cast<std::size_t>(y)];
      } else {
        send(r, to, a, k, x, y);
      }
    };
    switch (a.type) {
      case action_type::forward:
        f_done_[sm(a.stage, mb)] = 1;
        if (a.stage + 1 < S_)
          deliver(s_.rank_of_stage(a.stage + 1), event_kind::arrive_f, a.stage + 1, mb, &f_in_);
        break;
      case action_type::backward:
      case action_type::backward_input:
        if (a.type == action_type::backward) {
          free_mem(F(a.stage, mb));
          ++bwd_count_[static_cast<std::size_t>(a.stage)];
        } else {
          i_done_[sm(a.stage, mb)] = 1;
        }
        if (a.stage > 0)
          deliver(s_.rank_of_stage(a.stage - 1), event_kind::arrive_b, a.stage - 1, mb, &b_in_);
        if (a.stage == 0)
          for (int e = 0; e < E_; ++e)
            deliver(s_.encoder_shard_to_rank[static_cast<std::size_t>(e)], event_kind::arrive_eb, e, mb,
                    &eb_in_);
        break;
      case action_type::backward_weight:
        free_mem(F(a.stage, mb));
        ++bwd_count_[static_cast<std::size_t>(a.stage)];
        break;
      case action_type::encoder_forward:
        ef_done_[em(a.stage, mb)] = 1;
        deliver(s_.rank_of_stage(0), event_kind::arrive_ef, a.stage, mb, nullptr);
        break;
      case action_type::encoder_backward:
        free_mem({a.stage, action_type::encoder_forward, mb});
        break;
      default:
        break;
    }
  }

  const schedule& s_;
  const cost_model& c_;
  Source& src_;
  bool record_;
  int R_, S_, M_, E_;
  double now_ = 0;
  std::uint64_t seq_ = 0;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::vector<std::uint8_t> f_in_, b_in_, f_done_, i_done_, ef_done_, eb_in_;
  std::vector<int> ef_in_count_, bwd_count_;
  std::vector<double> link_free_;
  std::vector<std::int64_t> mem_;
  std::vector<action> running_;
  std::vector<std::uint8_t> is_running_;
  simulation out_;
};

/// Source that replays a schedule's lists (communication actions skipped).
struct list_source {
  const schedule& s;
  std::vector<std::size_t> pc;
  explicit list_source(const schedule& sched) : s(sched), pc(sched.ranks.size(), 0) { skip_all(); }
  void skip(int r) {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    auto& i = pc[static_cast<std::size_t>(r)];
    while (i < row.size() && is_comm(row[i].type)) ++i;
  }
  void skip_all() {
    for (int r = 0; r < s.total_ranks(); ++r) skip(r);
  }
  template <class Engine>
  std::optional<action> pick(const Engine& eng, int r) const {
    const auto& row = s.ranks[static_cast<std::size_t>(r)];
    const auto i = pc[static_cast<std::size_t>(r)];
    if (i >= row.size() || !eng.ready(row[i])) return std::nullopt;
    return row[i];
  }
  template <class Engine>
  void started(Engine&, int r, const action&) {
    ++pc[static_cast<std::size_t>(r)];
    skip(r);
  }
  [[nodiscard]] bool finished(int r) const {
    return pc[static_cast<std::size_t>(r)] >= s.ranks[static_cast<std::size_t>(r)].size();
  }
};

}  // namespace detail

/// Simulates one step of `s` under `costs`. Preconditions: the schedule passes verify() (a schedule
/// that cannot finish raises invalid_argument naming the stuck rank and action); costs >= 0.
/// Postconditions: step_time is the last finish; busy[r] sums rank r's compute; timeline (when
/// `record_timeline`) holds every compute action with its start and end. Deterministic (ties broken by
/// event order); O(actions log actions). Not collective.
[[nodiscard]] inline simulation simulate(const schedule& s, const cost_model& costs,
                                         bool record_timeline = true) {
  detail::list_source src(s);
  detail::engine<detail::list_source> eng(s, costs, src, record_timeline);
  return eng.run();
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::timed_action> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::timed_action& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "rank {} {} [{:.6g}, {:.6g})", t.rank,
                              hetmesh::pipeline::to_text(t.what), t.start, t.end);
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::simulation> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::simulation& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "simulated step {:.6g} s, bubble {:.4f}, peak memory per rank:",
                                  s.step_time, s.bubble_ratio);
    for (auto m : s.peak_memory) out = hetmesh::format_to(out, " {}", m);
    return out;
  }
};
