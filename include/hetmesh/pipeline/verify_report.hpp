// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: what the schedule verifier takes and returns: its options (how sends complete, the
// in-flight bound, the activation sizes) and its report (counts, per-rank peaks), which prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "action.hpp"

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
