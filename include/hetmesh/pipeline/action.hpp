// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the action IR. A schedule is, per rank, an ordered list of actions. The text form
// of an action is PyTorch's `torch.distributed.pipelining` notation `<stage><TYPE><microbatch>` (`2F0`,
// `1SEND_F3`, `0B7`), with global stage indices as PyTorch numbers them, so schedules round-trip
// through PyTorch's CSV files. Encoder actions (`EF`, `EB`, `SEND_EF`, ...) and `REDUCE_GRAD` extend
// the notation for the joint encoder-LLM pipeline; for them the leading number is the encoder shard
// (EF/EB and their transfers) or the stage (REDUCE_GRAD). An overlapped forward-backward (DualPipeV's
// `OVERLAP_F_B`) writes as PyTorch writes it: its two halves in parentheses, `(0F3;3B1)OVERLAP_F_B`.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::pipeline {

/// What an action does. The first four are PyTorch's compute types, the next four its P2P types.
enum class action_type : std::uint8_t {
  forward,           ///< F: forward of one micro-batch through one stage.
  backward,          ///< B: full backward (input and weight gradients).
  backward_input,    ///< I: backward for the input gradient only (zero-bubble split).
  backward_weight,   ///< W: backward for the weight gradient only (zero-bubble split).
  send_f,            ///< SEND_F: send stage `stage`'s output activation to stage+1.
  recv_f,            ///< RECV_F: receive stage `stage`'s input activation from stage-1.
  send_b,            ///< SEND_B: send stage `stage`'s input gradient to stage-1.
  recv_b,            ///< RECV_B: receive stage `stage`'s output gradient from stage+1.
  reduce_grad,       ///< REDUCE_GRAD: reduce stage `stage`'s weight gradients over data parallel.
  encoder_forward,   ///< EF: encoder shard `stage` encodes its share of micro-batch `mb`.
  encoder_backward,  ///< EB: encoder shard `stage` back-propagates its share of micro-batch `mb`.
  send_ef,           ///< SEND_EF: encoder shard `stage` sends its output to stage 0's rank.
  recv_ef,           ///< RECV_EF: stage 0's rank receives encoder shard `stage`'s output.
  send_eb,           ///< SEND_EB: stage 0's rank sends shard `stage` its embedding gradient.
  recv_eb,           ///< RECV_EB: encoder shard `stage` receives its embedding gradient.
  overlap_f_b,       ///< OVERLAP_F_B: F(stage, microbatch) and B(backward_stage, backward_microbatch) as
                     ///< one compute action (DualPipeV), both halves on one rank; F runs, then B.
};

/// Number of action types, for tables indexed by action_type.
inline constexpr int action_type_count = 16;

namespace detail {
constexpr std::string_view type_name(action_type t) noexcept {
  switch (t) {
    case action_type::forward:
      return "F";
    case action_type::backward:
      return "B";
    case action_type::backward_input:
      return "I";
    case action_type::backward_weight:
      return "W";
    case action_type::send_f:
      return "SEND_F";
    case action_type::recv_f:
      return "RECV_F";
    case action_type::send_b:
      return "SEND_B";
    case action_type::recv_b:
      return "RECV_B";
    case action_type::reduce_grad:
      return "REDUCE_GRAD";
    case action_type::encoder_forward:
      return "EF";
    case action_type::encoder_backward:
      return "EB";
    case action_type::send_ef:
      return "SEND_EF";
    case action_type::recv_ef:
      return "RECV_EF";
    case action_type::send_eb:
      return "SEND_EB";
    case action_type::recv_eb:
      return "RECV_EB";
    case action_type::overlap_f_b:
      return "OVERLAP_F_B";
  }
  return "?";
}
}  // namespace detail

/// The PyTorch/hetmesh name of a type: "F", "SEND_B", "EF", ...
[[nodiscard]] constexpr std::string_view name_of(action_type t) noexcept { return detail::type_name(t); }

/// True for the types that run a kernel on the rank's compute stream (F, B, I, W, EF, EB, and
/// OVERLAP_F_B, as PyTorch's `is_compute_op` counts it).
[[nodiscard]] constexpr bool is_compute(action_type t) noexcept {
  return t == action_type::forward || t == action_type::backward || t == action_type::backward_input ||
         t == action_type::backward_weight || t == action_type::encoder_forward ||
         t == action_type::encoder_backward || t == action_type::overlap_f_b;
}
/// True for the point-to-point types.
[[nodiscard]] constexpr bool is_send(action_type t) noexcept {
  return t == action_type::send_f || t == action_type::send_b || t == action_type::send_ef ||
         t == action_type::send_eb;
}
/// Whether `t` receives (activation or gradient).
[[nodiscard]] constexpr bool is_recv(action_type t) noexcept {
  return t == action_type::recv_f || t == action_type::recv_b || t == action_type::recv_ef ||
         t == action_type::recv_eb;
}
/// Whether `t` sends or receives.
[[nodiscard]] constexpr bool is_comm(action_type t) noexcept { return is_send(t) || is_recv(t); }

/// One action. `microbatch` is -1 for actions without one (REDUCE_GRAD). An OVERLAP_F_B action is its
/// forward half F(stage, microbatch) and its backward half B(backward_stage, backward_microbatch); the
/// two backward fields are -1 on every other action.
struct action {
  int stage = 0;                            ///< pipeline stage (virtual stage for interleaved schedules)
  action_type type = action_type::forward;  ///< what the action does
  int microbatch = -1;                      ///< micro-batch; -1 for actions without one
  int backward_stage = -1;                  ///< OVERLAP_F_B only: the stage of its backward half
  int backward_microbatch = -1;             ///< OVERLAP_F_B only: the micro-batch of its backward half

  friend constexpr bool operator==(const action&, const action&) = default;
  void hash_append(hasher& h) const {
    append_all(h, stage, type, microbatch);
    if (type == action_type::overlap_f_b) append_all(h, backward_stage, backward_microbatch);
  }
};

/// Shorthands for tests and hand-written schedules: `F(2, 0)` is `2F0`.
[[nodiscard]] constexpr action F(int stage, int mb) noexcept { return {stage, action_type::forward, mb}; }
/// `B(2, 0)` is `2B0`: full backward.
[[nodiscard]] constexpr action B(int stage, int mb) noexcept { return {stage, action_type::backward, mb}; }
/// `I(2, 0)` is `2I0`: backward for inputs.
[[nodiscard]] constexpr action I(int stage, int mb) noexcept {
  return {stage, action_type::backward_input, mb};
}
/// `W(2, 0)` is `2W0`: backward for weights.
[[nodiscard]] constexpr action W(int stage, int mb) noexcept {
  return {stage, action_type::backward_weight, mb};
}

/// `OVERLAP(F(0, 3), B(3, 1))` is `(0F3;3B1)OVERLAP_F_B`: forward `f` and full backward `b` overlapped
/// (DualPipeV). Precondition: f is an F and b a B (only the stages and micro-batches are taken).
[[nodiscard]] constexpr action OVERLAP(const action& f, const action& b) noexcept {
  return {f.stage, action_type::overlap_f_b, f.microbatch, b.stage, b.microbatch};
}

/// The parts of an action: its two halves (F, then B) for OVERLAP_F_B, the action itself otherwise.
/// Iterable: `for (const action& p : parts(a))`.
struct action_parts {
  action part[2];  ///< the parts; only the first `count` are meaningful
  int count = 1;   ///< 2 for OVERLAP_F_B, else 1
  /// First part.
  [[nodiscard]] constexpr const action* begin() const noexcept { return part; }
  /// One past the last part.
  [[nodiscard]] constexpr const action* end() const noexcept { return part + count; }
};

/// The parts of `a` (see action_parts). Pure; O(1).
[[nodiscard]] constexpr action_parts parts(const action& a) noexcept {
  if (a.type == action_type::overlap_f_b)
    return {{F(a.stage, a.microbatch), B(a.backward_stage, a.backward_microbatch)}, 2};
  return {{a, action{}}, 1};
}

/// The text of an action, as PyTorch's `_Action.__repr__` writes it: "2F0", "1SEND_B3", "0REDUCE_GRAD",
/// "(0F3;3B1)OVERLAP_F_B".
[[nodiscard]] HETMESH_COMPILED std::string to_text(const action& a)
#if HETMESH_BODIES
{
  if (a.type == action_type::overlap_f_b)
    return hetmesh::format("({}F{};{}B{})OVERLAP_F_B", a.stage, a.microbatch, a.backward_stage,
                           a.backward_microbatch);
  if (a.microbatch < 0) return hetmesh::format("{}{}", a.stage, name_of(a.type));
  return hetmesh::format("{}{}{}", a.stage, name_of(a.type), a.microbatch);
}
#else
    ;
#endif

[[nodiscard]] inline action parse_action(std::string_view text);

namespace detail {
/// The overlapped form "(<F action>;<B action>)OVERLAP_F_B" of parse_action; `s` is `text` trimmed.
[[nodiscard]] inline action parse_overlap(std::string_view text, std::string_view s) {
  auto bad = [&](std::string_view why) {
    throw_error<invalid_argument>(
        "pipeline: cannot parse overlapped action \"{}\": {}; expected (<stage>F<microbatch>;<stage>B"
        "<microbatch>)OVERLAP_F_B such as (0F3;3B1)OVERLAP_F_B: a forward and a full backward on one rank",
        text, why);
  };
  const std::size_t close = s.find(')');
  if (close == std::string_view::npos) bad("no closing parenthesis");
  if (s.substr(close + 1) != "OVERLAP_F_B")
    bad(hetmesh::format("the type after the parentheses is \"{}\"", s.substr(close + 1)));
  const std::string_view inner = s.substr(1, close - 1);
  const std::size_t semi = inner.find(';');
  if (semi == std::string_view::npos || inner.find(';', semi + 1) != std::string_view::npos)
    bad("expected exactly two sub-actions separated by ';'");
  const std::string_view ftext = inner.substr(0, semi), btext = inner.substr(semi + 1);
  if (ftext.find('(') != std::string_view::npos || btext.find('(') != std::string_view::npos)
    bad("sub-actions cannot nest");
  const action f = parse_action(ftext), b = parse_action(btext);
  if (f.type != action_type::forward) bad(hetmesh::format("the first sub-action {} is not an F", to_text(f)));
  if (b.type != action_type::backward)
    bad(hetmesh::format("the second sub-action {} is not a full backward B", to_text(b)));
  return OVERLAP(f, b);
}
}  // namespace detail

/// Parses one action ("2F0", " 1SEND_F3 ", "(0F3;3B1)OVERLAP_F_B"). Leading/trailing spaces are ignored.
/// Throws invalid_argument naming the text and the expected form. Pure; O(length).
[[nodiscard]] inline action parse_action(std::string_view text) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  };
  const std::string_view s = trim(text);
  if (!s.empty() && s.front() == '(') return detail::parse_overlap(text, s);
  auto bad = [&](std::string_view why) {
    throw_error<invalid_argument>(
        "pipeline: cannot parse action \"{}\": {}; expected [stage][type][microbatch] such as 2F0, 1SEND_F3 "
        "or 0REDUCE_GRAD, with type one of F I B W SEND_F RECV_F SEND_B RECV_B REDUCE_GRAD EF EB SEND_EF "
        "RECV_EF SEND_EB RECV_EB",
        text, why);
  };
  std::size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0) bad("it does not start with a stage number");
  std::size_t j = i;
  while (j < s.size() && ((s[j] >= 'A' && s[j] <= 'Z') || s[j] == '_')) ++j;
  const std::string_view type_text = s.substr(i, j - i);
  std::size_t k = j;
  while (k < s.size() && s[k] >= '0' && s[k] <= '9') ++k;
  if (k != s.size()) bad("unexpected characters after the microbatch number");
  action a;
  if (std::from_chars(s.data(), s.data() + i, a.stage).ec != std::errc{}) bad("stage number out of range");
  bool found = false;
  if (type_text == name_of(action_type::overlap_f_b)) bad("OVERLAP_F_B is written (F;B)OVERLAP_F_B");
  for (int t = 0; t < action_type_count; ++t) {
    if (name_of(static_cast<action_type>(t)) == type_text) {
      a.type = static_cast<action_type>(t);
      found = true;
    }
  }
  if (!found) bad(hetmesh::format("unknown type \"{}\"", type_text));
  if (k > j) {
    if (std::from_chars(s.data() + j, s.data() + k, a.microbatch).ec != std::errc{})
      bad("microbatch number out of range");
  } else {
    a.microbatch = -1;
  }
  const bool needs_mb = a.type != action_type::reduce_grad;
  if (needs_mb && a.microbatch < 0) bad("this type needs a microbatch number");
  if (!needs_mb && a.microbatch >= 0) bad("REDUCE_GRAD takes no microbatch number");
  return a;
}

/// How global stages map to ranks: PyTorch's "loop" (stage s on rank s % pp) or "v" (rank r holds
/// stages r and 2*pp-1-r, ZBV's layout).
enum class stage_layout : std::uint8_t { loop, v };

/// A pipeline schedule: per rank an ordered list of actions, plus the facts needed to interpret it.
/// Plain data; equal on every rank that computed it; hashable with plan_hash.
struct schedule {
  std::string name;                        ///< the generator's name ("1f1b", "interleaved-1f1b", ...).
  int num_ranks = 0;                       ///< pipeline ranks that run LLM stages.
  int num_stages = 0;                      ///< global stages (pp * virtual stages).
  int num_microbatches = 0;                ///< micro-batches per step.
  std::vector<int> stage_to_rank;          ///< size num_stages.
  std::vector<int> encoder_shard_to_rank;  ///< size = number of encoder shards (0 without encoders).
  std::vector<std::vector<action>> ranks;  ///< size = total ranks (LLM ranks, then encoder-pool ranks).

  /// Precondition: 0 <= stage < num_stages.
  [[nodiscard]] int rank_of_stage(int stage) const noexcept {
    return stage_to_rank[static_cast<std::size_t>(stage)];
  }
  /// Ranks of the schedule.
  [[nodiscard]] int total_ranks() const noexcept { return static_cast<int>(ranks.size()); }
  /// Number of encoder shards (ranks that run encoder actions).
  [[nodiscard]] int num_encoder_shards() const noexcept {
    return static_cast<int>(encoder_shard_to_rank.size());
  }
  /// The rank an action runs on, from its stage (or encoder shard) and type.
  /// Precondition: the stage or shard is in range.
  [[nodiscard]] int rank_of(const action& a) const noexcept {
    switch (a.type) {
      case action_type::encoder_forward:
      case action_type::encoder_backward:
      case action_type::send_ef:
      case action_type::recv_eb:
        return encoder_shard_to_rank[static_cast<std::size_t>(a.stage)];
      case action_type::recv_ef:
      case action_type::send_eb:
        return rank_of_stage(0);
      default:
        return rank_of_stage(a.stage);
    }
  }
  /// The number of actions over all ranks.
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 0;
    for (const auto& r : ranks) n += r.size();
    return n;
  }

  friend bool operator==(const schedule&, const schedule&) = default;
  void hash_append(hasher& h) const {
    append_all(h, name, num_ranks, num_stages, num_microbatches, stage_to_rank, encoder_shard_to_rank, ranks);
  }
};

/// The stage-to-rank map of a layout. Preconditions: pp >= 1, stages a multiple of pp (2*pp for v).
[[nodiscard]] inline std::vector<int> make_stage_to_rank(int pp, int stages, stage_layout layout) {
  std::vector<int> out(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    if (layout == stage_layout::loop) {
      out[static_cast<std::size_t>(s)] = s % pp;
    } else {
      const int chunk = s / pp, off = s % pp;
      out[static_cast<std::size_t>(s)] = chunk % 2 == 0 ? off : pp - 1 - off;
    }
  }
  return out;
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::action_type> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::pipeline::action_type t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::pipeline::name_of(t));
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::action> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::action& a, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::pipeline::to_text(a));
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::schedule> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::schedule& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out =
        hetmesh::format_to(ctx.out(), "schedule {} (ranks={}, stages={}, microbatches={}, encoder shards={})",
                           s.name, s.total_ranks(), s.num_stages, s.num_microbatches, s.num_encoder_shards());
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      out = hetmesh::format_to(out, "\n  rank {}:", r);
      for (const auto& a : s.ranks[r]) out = hetmesh::format_to(out, " {}", hetmesh::pipeline::to_text(a));
    }
    return out;
  }
};
