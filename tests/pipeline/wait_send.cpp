// SPDX-License-Identifier: Apache-2.0
// Where to_compute_comms_csv (pipeline/io.hpp) retires each send, the rule of PyTorch's `_add_wait_send`:
// a forward send SEND_F(s, m) is waited for right after the first later action on its rank that runs the
// backward of (s, m) -- a B or an I, or the B half of an OVERLAP_F_B -- and every other send (SEND_B, or a
// SEND_F with no such backward on its rank) at the end of the row, in send order.
//
// The expectations are derived from that rule: by hand for small schedules, and by an independent checker
// (below, written over the CSV text) for DualPipeV's lowered schedules, whose overlaps hold backward halves.
// scripts/peers/dualpipev_vs_pytorch.py checks the same against torch's own `_add_wait_send`.
#include <doctest/doctest.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/pipeline/dualpipe.hpp>
#include <hetmesh/pipeline/io.hpp>
#include <hetmesh/pipeline/lower.hpp>

using namespace hetmesh::pipeline;

namespace {

/// The CSV's rows, each split into its fields.
std::vector<std::vector<std::string>> fields_of(std::string_view csv) {
  std::vector<std::vector<std::string>> rows;
  std::size_t pos = 0;
  while (pos < csv.size()) {
    std::size_t eol = csv.find("\r\n", pos);
    if (eol == std::string_view::npos) eol = csv.size();
    std::string_view line = csv.substr(pos, eol - pos);
    pos = eol + 2;
    std::vector<std::string> row;
    std::size_t f = 0;
    while (f <= line.size()) {
      std::size_t comma = line.find(',', f);
      if (comma == std::string_view::npos) comma = line.size();
      row.emplace_back(line.substr(f, comma - f));
      f = comma + 1;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

/// A WAIT_SEND_F/B field as the send it retires ("3WAIT_SEND_F2" -> 3SEND_F2); nullopt for other fields.
std::optional<action> waited_send(std::string_view field) {
  const auto at = field.find("WAIT_SEND_");
  if (at == std::string_view::npos) return std::nullopt;
  const char kind = field[at + 10];
  std::string text(field.substr(0, at));
  text += kind == 'F' ? "SEND_F" : "SEND_B";
  text += field.substr(at + 11);
  return parse_action(text);
}

/// True when compute action `a` runs the backward (B or I) of `send`'s stage and micro-batch.
bool retires(const action& a, const action& send) {
  for (const action& p : parts(a))
    if ((p.type == action_type::backward || p.type == action_type::backward_input) && p.stage == send.stage &&
        p.microbatch == send.microbatch)
      return true;
  return false;
}

/// Checks one row against the rule; returns the number of forward-send waits placed after an overlap.
int check_row(const std::vector<std::string>& row) {
  // The row without its waits, and for each remaining field the waits written right after it.
  std::vector<action> acts;
  std::vector<std::vector<action>> waits_after;
  std::vector<action> leading;  // waits before any action (never expected)
  for (const auto& f : row) {
    if (const auto w = waited_send(f)) {
      (acts.empty() ? leading : waits_after.back()).push_back(*w);
    } else if (f.find("WAIT_REDUCE_GRAD") == std::string::npos) {
      acts.push_back(parse_action(f));
      waits_after.emplace_back();
    }
  }
  CHECK(leading.empty());
  // The expected waits, derived from the rule over `acts` alone.
  std::vector<std::vector<action>> expected(acts.size());
  std::vector<action> at_end;
  int after_overlap = 0;
  for (std::size_t i = 0; i < acts.size(); ++i) {
    const action& s = acts[i];
    if (s.type != action_type::send_f && s.type != action_type::send_b) continue;
    std::size_t j = i + 1;
    while (s.type == action_type::send_f && j < acts.size() && !retires(acts[j], s)) ++j;
    if (s.type == action_type::send_f && j < acts.size()) {
      expected[j].push_back(s);
      after_overlap += acts[j].type == action_type::overlap_f_b ? 1 : 0;
    } else {
      at_end.push_back(s);
    }
  }
  // The trailing waits sit after the last action together with the retirements that action makes.
  if (!acts.empty()) expected.back().insert(expected.back().end(), at_end.begin(), at_end.end());
  for (std::size_t i = 0; i < acts.size(); ++i) {
    INFO("after field ", to_text(acts[i]));
    CHECK(waits_after[i] == expected[i]);
  }
  return after_overlap;
}

}  // namespace

TEST_CASE("pipeline to_compute_comms_csv: an overlap's backward half retires its forward send there") {
  // By the rule: 0WAIT_SEND_F0 follows the overlap that holds 0B0 (before the SEND it is followed by),
  // 0WAIT_SEND_F1 and 0WAIT_SEND_F2 follow 0B1 and 0B2; rank 1's backward sends wait at its row's end.
  const schedule s = from_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0RECV_B0,(0F3;0B0)OVERLAP_F_B,0RECV_B1,0B1,0RECV_B2,0B2,0RECV_"
      "B3,"
      "0B3\r\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F2,1F2,1B2,1SEND_B2,1F3,1B3,1SEND_B3\r\n");
  CHECK(to_compute_comms_csv(s) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0RECV_B0,(0F3;0B0)OVERLAP_F_B,0WAIT_SEND_F0,0RECV_B1,0B1,"
        "0WAIT_SEND_F1,0RECV_B2,0B2,0WAIT_SEND_F2,0RECV_B3,0B3\r\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F2,1F2,1B2,1SEND_B2,1F3,1B3,1SEND_B3,"
        "1WAIT_SEND_B0,1WAIT_SEND_B1,1WAIT_SEND_B2,1WAIT_SEND_B3\r\n");
}

TEST_CASE("pipeline to_compute_comms_csv: a send with no later backward on its rank waits at the row's end") {
  // 0F1's send has no 0B1/0I1 after it on rank 0: it waits at the end, after the reduction's wait; the
  // overlap's B half is of another stage (no send of its own to retire), and an I retires like a B.
  const schedule s = from_csv("0F0,0SEND_F0,(0F1;1B0)OVERLAP_F_B,0SEND_F1,0I0,0W0,0REDUCE_GRAD\r\n");
  CHECK(to_compute_comms_csv(s) ==
        "0F0,0SEND_F0,(0F1;1B0)OVERLAP_F_B,0SEND_F1,0I0,0WAIT_SEND_F0,0W0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,"
        "0WAIT_SEND_F1\r\n");
}

TEST_CASE("pipeline: dualpipev's lowered CSV places every send wait by _add_wait_send's rule") {
  int after_overlap = 0;
  for (int pp = 2; pp <= 4; ++pp) {
    for (int m = 2 * pp; m <= 2 * pp + 2; ++m) {
      INFO("pp=", pp, " M=", m);
      const std::string csv =
          to_compute_comms_csv(add_reduce_grad(add_send_recv(dualpipev{}.generate(pp, m))));
      for (const auto& row : fields_of(csv)) after_overlap += check_row(row);
      // Every send has exactly one wait: as many WAIT_SEND fields as SEND fields.
      std::size_t sends = 0, waits = 0;
      for (std::size_t at = csv.find("SEND_"); at != std::string::npos; at = csv.find("SEND_", at + 1))
        ++(at >= 5 && csv.compare(at - 5, 5, "WAIT_") == 0 ? waits : sends);
      CHECK(sends == waits);
    }
  }
  CHECK(after_overlap > 0);  // the grid exercises the overlap half of the rule
}
