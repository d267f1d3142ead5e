// SPDX-License-Identifier: Apache-2.0
// DualPipeV (pipeline/dualpipe.hpp) and the overlapped forward-backward action it brings to the IR.
//
// The golden orders below are PyTorch's: torch 2.15.0's ScheduleDualPipeV.pipeline_order (compute only)
// and, for the lowered one, torch's `_add_send_recv` applied to that order, printed with str(_Action)
// (scripts/peers/dualpipev_vs_pytorch.py compares a larger grid when torch is installed).
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/pipeline/dualpipe.hpp>
#include <hetmesh/pipeline/io.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/pipeline/trace_json.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh_tools/schedule_names.hpp>  // names -> schedules: the tools' mapping

using namespace hetmesh::pipeline;
using doctest::Contains;

namespace {

std::string row_text(const std::vector<action>& row) {
  std::string out;
  for (const auto& a : row) {
    if (!out.empty()) out += ' ';
    out += to_text(a);
  }
  return out;
}

struct golden_case {
  int pp, m;
  std::vector<std::string> ranks;
};

const std::vector<golden_case>& goldens() {
  static const std::vector<golden_case> g{
      {2,
       4,
       {
           "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B "
           "3B3 0I2 0W2 0I3 0W3",
           "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2B2 1B2 "
           "2I3 1I3 2W3 1W3",
       }},
      {2,
       5,
       {
           "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B (0F4;3B2)OVERLAP_F_B "
           "(3F3;0B1)OVERLAP_F_B 3B3 (3F4;0B2)OVERLAP_F_B 3B4 0I3 0W3 0I4 0W4",
           "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B "
           "(1F4;2B2)OVERLAP_F_B (2F4;1B2)OVERLAP_F_B 2B3 1B3 2I4 1I4 2W4 1W4",
       }},
      {2,
       7,
       {
           "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B (0F4;3B2)OVERLAP_F_B "
           "(3F3;0B1)OVERLAP_F_B (0F5;3B3)OVERLAP_F_B (3F4;0B2)OVERLAP_F_B (0F6;3B4)OVERLAP_F_B "
           "(3F5;0B3)OVERLAP_F_B 3B5 (3F6;0B4)OVERLAP_F_B 3B6 0I5 0W5 0I6 0W6",
           "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B "
           "(1F4;2B2)OVERLAP_F_B (2F4;1B2)OVERLAP_F_B (1F5;2B3)OVERLAP_F_B (2F5;1B3)OVERLAP_F_B "
           "(1F6;2B4)OVERLAP_F_B (2F6;1B4)OVERLAP_F_B 2B5 1B5 2I6 1I6 2W6 1W6",
       }},
      {3,
       6,
       {
           "0F0 0F1 0F2 0F3 0F4 5F0 5I0 5W0 5F1 5I1 5W1 5F2 (0F5;5B2)OVERLAP_F_B (5F3;0B0)OVERLAP_F_B 5B3 "
           "(5F4;0B1)OVERLAP_F_B 5B4 (5F5;0B2)OVERLAP_F_B 5B5 0I3 0W3 0I4 0W4 0I5 0W5",
           "1F0 1F1 1F2 4F0 1F3 4F1 4I0 4W0 4F2 (1F4;4B1)OVERLAP_F_B (4F3;1B0)OVERLAP_F_B "
           "(1F5;4B2)OVERLAP_F_B (4F4;1B1)OVERLAP_F_B 4B3 (4F5;1B2)OVERLAP_F_B 4B4 1B3 4I5 1I4 4W5 1I5 1W4 "
           "1W5",
           "2F0 3F0 2F1 3F1 2F2 3F2 2F3 3B0 (3F3;2B0)OVERLAP_F_B (2F4;3B1)OVERLAP_F_B (3F4;2B1)OVERLAP_F_B "
           "(2F5;3B2)OVERLAP_F_B (3F5;2B2)OVERLAP_F_B 3B3 2B3 3B4 2I4 3I5 2I5 2W4 3W5 2W5",
       }},
      {4,
       8,
       {
           "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3)OVERLAP_F_B "
           "(7F4;0B0)OVERLAP_F_B 7B4 (7F5;0B1)OVERLAP_F_B 7B5 (7F6;0B2)OVERLAP_F_B 7B6 (7F7;0B3)OVERLAP_F_B "
           "7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7",
           "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B "
           "(6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B 6B4 (6F6;1B2)OVERLAP_F_B 6B5 "
           "(6F7;1B3)OVERLAP_F_B 6B6 1B4 6I7 1I5 6W7 1I6 1W5 1I7 1W6 1W7",
           "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B (5F4;2B0)OVERLAP_F_B "
           "(2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B (2F7;5B3)OVERLAP_F_B (5F6;2B2)OVERLAP_F_B 5B4 "
           "(5F7;2B3)OVERLAP_F_B 5B5 2B4 5B6 2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7",
           "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B (3F5;4B1)OVERLAP_F_B "
           "(4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B "
           "(4F7;3B3)OVERLAP_F_B 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7",
       }},
      {4,
       11,
       {
           "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3)OVERLAP_F_B "
           "(7F4;0B0)OVERLAP_F_B (0F8;7B4)OVERLAP_F_B (7F5;0B1)OVERLAP_F_B (0F9;7B5)OVERLAP_F_B "
           "(7F6;0B2)OVERLAP_F_B (0F10;7B6)OVERLAP_F_B (7F7;0B3)OVERLAP_F_B 7B7 (7F8;0B4)OVERLAP_F_B 7B8 "
           "(7F9;0B5)OVERLAP_F_B 7B9 (7F10;0B6)OVERLAP_F_B 7B10 0I7 0W7 0I8 0W8 0I9 0W9 0I10 0W10",
           "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B "
           "(6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B (1F8;6B4)OVERLAP_F_B "
           "(6F6;1B2)OVERLAP_F_B (1F9;6B5)OVERLAP_F_B (6F7;1B3)OVERLAP_F_B (1F10;6B6)OVERLAP_F_B "
           "(6F8;1B4)OVERLAP_F_B 6B7 (6F9;1B5)OVERLAP_F_B 6B8 (6F10;1B6)OVERLAP_F_B 6B9 1B7 6I10 1I8 6W10 "
           "1I9 1W8 1I10 1W9 1W10",
           "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B (5F4;2B0)OVERLAP_F_B "
           "(2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B (2F7;5B3)OVERLAP_F_B (5F6;2B2)OVERLAP_F_B "
           "(2F8;5B4)OVERLAP_F_B (5F7;2B3)OVERLAP_F_B (2F9;5B5)OVERLAP_F_B (5F8;2B4)OVERLAP_F_B "
           "(2F10;5B6)OVERLAP_F_B (5F9;2B5)OVERLAP_F_B 5B7 (5F10;2B6)OVERLAP_F_B 5B8 2B7 5B9 2I8 5I10 2I9 "
           "2W8 2I10 5W10 2W9 2W10",
           "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B (3F5;4B1)OVERLAP_F_B "
           "(4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B "
           "(4F7;3B3)OVERLAP_F_B (3F8;4B4)OVERLAP_F_B (4F8;3B4)OVERLAP_F_B (3F9;4B5)OVERLAP_F_B "
           "(4F9;3B5)OVERLAP_F_B (3F10;4B6)OVERLAP_F_B (4F10;3B6)OVERLAP_F_B 4B7 3B7 4B8 3B8 4I9 3I9 4I10 "
           "3I10 4W9 3W9 4W10 3W10",
       }},
  };
  return g;
}

}  // namespace

TEST_CASE("pipeline: OVERLAP_F_B writes and parses as PyTorch's (F;B)OVERLAP_F_B") {
  const action o = OVERLAP(F(0, 3), B(3, 1));
  CHECK(o.type == action_type::overlap_f_b);
  CHECK(to_text(o) == "(0F3;3B1)OVERLAP_F_B");
  CHECK(fmt::format("{}", o) == "(0F3;3B1)OVERLAP_F_B");
  CHECK(parse_action("(0F3;3B1)OVERLAP_F_B") == o);
  CHECK(parse_action("  (12F40;3B7)OVERLAP_F_B\r") == OVERLAP(F(12, 40), B(3, 7)));
  CHECK(is_compute(o.type));
  CHECK(!is_comm(o.type));
  const auto p = parts(o);
  REQUIRE(p.count == 2);
  CHECK(p.part[0] == F(0, 3));
  CHECK(p.part[1] == B(3, 1));
  CHECK(parts(F(2, 5)).count == 1);
  CHECK(*parts(F(2, 5)).begin() == F(2, 5));
  // The backward half is part of the action's identity and of its hash.
  CHECK(OVERLAP(F(0, 3), B(3, 1)) != OVERLAP(F(0, 3), B(3, 2)));
  CHECK(hetmesh::plan_hash(OVERLAP(F(0, 3), B(3, 1))) != hetmesh::plan_hash(OVERLAP(F(0, 3), B(3, 2))));
  CHECK(hetmesh::plan_hash(F(0, 3)) == hetmesh::plan_hash(action{0, action_type::forward, 3}));
  for (const char* bad : {"(0F3;3I1)OVERLAP_F_B", "(3B1;0F3)OVERLAP_F_B", "(0F3)OVERLAP_F_B",
                          "(0F3;3B1;1F0)OVERLAP_F_B", "(0F3;3B1)OVERLAP_X", "(0F3;3B1", "(0F3;3B1)",
                          "0OVERLAP_F_B3", "((0F3;3B1)OVERLAP_F_B;3B1)OVERLAP_F_B"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_action(bad), hetmesh::invalid_argument);
  }
  CHECK_THROWS_WITH_AS((void)parse_action("(0F3;3I1)OVERLAP_F_B"), Contains("not a full backward B"),
                       hetmesh::invalid_argument);
}

TEST_CASE("pipeline: an overlapped action survives PyTorch CSV export and import") {
  const schedule s = dualpipev{}.generate(2, 4);
  const std::string csv = to_csv(s);
  CHECK(csv.find(",(0F3;3B1)OVERLAP_F_B,") != std::string::npos);
  const schedule back = from_csv(csv, "dualpipev");
  CHECK(back.ranks == s.ranks);
  CHECK(back.stage_to_rank == s.stage_to_rank);  // inferred from both halves of each overlap
  CHECK(back.num_microbatches == 4);
  // A stage whose only actions are halves of overlaps still maps to its rank.
  const schedule tiny = from_csv("0F0,(1F0;1B0)OVERLAP_F_B,0B0\r\n");
  CHECK(tiny.num_stages == 2);
  CHECK(tiny.stage_to_rank == std::vector<int>{0, 0});
  // An overlap whose halves sit on two ranks' rows is refused by name.
  CHECK_THROWS_WITH_AS((void)from_csv("0F0,(1F0;0B0)OVERLAP_F_B\r\n1F1\r\n"), Contains("stage 1"),
                       hetmesh::invalid_argument);
}

TEST_CASE("pipeline: dualpipev's orders are PyTorch ScheduleDualPipeV's") {
  for (const auto& g : goldens()) {
    CAPTURE(g.pp);
    CAPTURE(g.m);
    const schedule s = dualpipev{}.generate(g.pp, g.m);
    CHECK(s.name == "dualpipev");
    CHECK(s.num_stages == 2 * g.pp);
    CHECK(s.stage_to_rank == make_stage_to_rank(g.pp, 2 * g.pp, stage_layout::v));
    REQUIRE(s.ranks.size() == g.ranks.size());
    for (int r = 0; r < g.pp; ++r) {
      CAPTURE(r);
      CHECK(compute_text(s, r) == g.ranks[static_cast<std::size_t>(r)]);
      // and the text reads back into the same actions
      std::vector<action> parsed;
      std::istringstream in(g.ranks[static_cast<std::size_t>(r)]);
      for (std::string w; in >> w;) parsed.push_back(parse_action(w));
      CHECK(parsed == s.ranks[static_cast<std::size_t>(r)]);
    }
  }
}

TEST_CASE("pipeline: dualpipev lowers as PyTorch's _add_send_recv lowers it, SENDs after the overlap") {
  const std::vector<std::string> torch_lowered{
      "0F0 0SEND_F0 0F1 0SEND_F1 3RECV_F0 0F2 0SEND_F2 3F0 3RECV_F1 3I0 3SEND_B0 3W0 3F1 3RECV_F2 0RECV_B0 "
      "(0F3;3B1)OVERLAP_F_B 0SEND_F3 3SEND_B1 (3F2;0B0)OVERLAP_F_B 3RECV_F3 0RECV_B1 3B2 3SEND_B2 "
      "(3F3;0B1)OVERLAP_F_B 0RECV_B2 3B3 3SEND_B3 0I2 0RECV_B3 0W2 0I3 0W3",
      "1RECV_F0 1F0 1RECV_F1 2F0 2SEND_F0 1RECV_F2 1F1 2F1 2SEND_F1 2RECV_B0 1F2 2B0 (2F2;1B0)OVERLAP_F_B "
      "2SEND_F2 1SEND_B0 1RECV_F3 2RECV_B1 (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2SEND_F3 1SEND_B1 "
      "2RECV_B2 2B2 1B2 1SEND_B2 2RECV_B3 2I3 1I3 1SEND_B3 2W3 1W3",
  };
  const schedule low = add_send_recv(dualpipev{}.generate(2, 4));
  for (int r = 0; r < 2; ++r)
    CHECK(row_text(low.ranks[static_cast<std::size_t>(r)]) == torch_lowered[static_cast<std::size_t>(r)]);
  (void)verify(low);
  CHECK(strip_comm(low).ranks == dualpipev{}.generate(2, 4).ranks);
}

TEST_CASE("pipeline: dualpipev over a grid passes the verifier, compute-only and lowered, exactly once") {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 2 * pp; m <= 2 * pp + 6; ++m) {
      CAPTURE(pp);
      CAPTURE(m);
      const schedule s = dualpipev{}.generate(pp, m);
      const auto rep = verify(s);
      // each (stage, micro-batch): one F and one B or one I and one W, an overlap counting as F + B
      std::size_t halves = 0, overlaps = 0, weights = 0;
      for (const auto& row : s.ranks)
        for (const auto& a : row) {
          halves += static_cast<std::size_t>(parts(a).count);
          overlaps += a.type == action_type::overlap_f_b ? 1U : 0U;
          weights += a.type == action_type::backward_weight ? 1U : 0U;
        }
      CHECK(halves == 2U * static_cast<std::size_t>(2 * pp * m) + weights);
      CHECK(rep.compute_actions == halves - overlaps);
      // the steady state is overlapped: every rank runs 2(M - 2pp + r + 1) + (pp - r - 1) overlaps,
      // less one on the last rank
      std::size_t expect = 0;
      for (int r = 0; r < pp; ++r)
        expect += static_cast<std::size_t>(2 * (m - 2 * pp + r + 1) + (pp - r - 1));
      CHECK(overlaps == expect - 1);
      const schedule low = add_send_recv(s);
      const auto lrep = verify(low);  // blocking (rendezvous) send/receive
      (void)verify(low, {.mode = send_mode::buffered});
      CHECK(lrep.peak_in_flight == rep.peak_in_flight);
      std::size_t cross = 0;
      for (int st = 0; st + 1 < s.num_stages; ++st)
        if (s.rank_of_stage(st) != s.rank_of_stage(st + 1)) cross += 2 * static_cast<std::size_t>(m);
      CHECK(lrep.comm_pairs == cross);
      CHECK(add_reduce_grad(low).size() == low.size() + static_cast<std::size_t>(2 * pp));
      (void)verify(add_reduce_grad(low));
      CHECK(simulate(s, uniform_costs{}.model()).step_time > 0);
    }
}

TEST_CASE("pipeline: dualpipev refuses what PyTorch refuses, naming the rule") {
  CHECK_THROWS_WITH_AS((void)dualpipev{}.generate(2, 3), Contains("microbatches >= 2 * pp = 4"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)dualpipev{}.generate(4, 7), Contains("microbatches=7 with pp=4"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)dualpipev{}.generate(0, 4), hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)dualpipev{}.generate(1, 0), hetmesh::invalid_argument);
  CHECK(dualpipev{}.generate(1, 2).ranks.size() == 1);  // PyTorch accepts pp = 1 (two stages, one rank)
  // the tools' names: two stages per rank, like zbv
  CHECK(hetmesh::tools::make_schedule("dualpipev", 2, 4).ranks == dualpipev{}.generate(2, 4).ranks);
  CHECK(hetmesh::tools::make_schedule("dualpipev", 2, 4, 2).num_stages == 4);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::make_schedule("dualpipev", 2, 4, 3), Contains("--virtual 3"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::make_schedule("dualpipev", 2, 4, 0, 2), Contains("--group-size"),
                       hetmesh::invalid_argument);
}

TEST_CASE("pipeline: dualpipev is a split-backward schedule family") {
  static_assert(schedule_family<dualpipev>);
  static_assert(dualpipev::requires_split_backward);
  static_assert(!schedule_accepts<dualpipev, false> && schedule_accepts<dualpipev, true>);
  CHECK(fmt::format("{}", dualpipev{}) == "dualpipev");
  CHECK(fmt::format("{}", hetmesh::tools::schedule_policy{dualpipev{}}) == "dualpipev");
  CHECK(hetmesh::tools::requires_split_backward(hetmesh::tools::policy_from_name("dualpipev")));
  CHECK(hetmesh::plan_hash(dualpipev{}) != hetmesh::plan_hash(zbv{}));
}

TEST_CASE("pipeline verify: an overlapped action is one step whose halves are checked each") {
  schedule s;
  s.name = "hand";
  s.num_ranks = 1;
  s.num_stages = 2;
  s.num_microbatches = 1;
  s.stage_to_rank = {0, 0};
  // apart, the backward can follow the forward; inside one overlap it cannot (PyTorch readies both
  // halves before either runs)
  s.ranks = {{F(0, 0), F(1, 0), B(1, 0), B(0, 0)}};
  (void)verify(s);
  s.ranks = {{F(0, 0), OVERLAP(F(1, 0), B(1, 0)), B(0, 0)}};
  CHECK_THROWS_WITH_AS((void)verify(s), Contains("needs `1F0` first"), hetmesh::invalid_argument);
  s.ranks = {{F(0, 0), F(1, 0), OVERLAP(F(1, 0), B(1, 0)), B(0, 0)}};
  CHECK_THROWS_WITH_AS((void)verify(s), Contains("`1F0`: appears a second time"), hetmesh::invalid_argument);
  // a half on another rank's stage
  schedule v = dualpipev{}.generate(2, 4);
  v.ranks[0][7] = OVERLAP(F(0, 3), B(2, 1));
  CHECK_THROWS_WITH_AS((void)verify(v), Contains("`2B1`: belongs on rank 1"), hetmesh::invalid_argument);
  // rank 0's first overlap moved before 3F1: its backward half 3B1 would run before its forward
  schedule d = dualpipev{}.generate(2, 4);
  (void)verify(d);
  std::swap(d.ranks[0][6], d.ranks[0][7]);
  CHECK_THROWS_WITH_AS((void)verify(d), Contains("needs `3F1` first"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline simulate: an overlapped action costs the sum of its halves unless told otherwise") {
  // pp = 1: one rank, never idle, so the step is the rank's busy time
  const schedule s = dualpipev{}.generate(1, 2);
  REQUIRE(compute_text(s, 0) == "0F0 1F0 0F1 1B0 (1F1;0B0)OVERLAP_F_B 1B1 0I1 0W1");
  const uniform_costs c{.forward = 1.0, .backward = 2.0, .weight = 0.5};
  const auto sum = simulate(s, c.model());
  CHECK(sum.step_time == doctest::Approx(1 + 1 + 1 + 2 + 3 + 2 + 1.5 + 0.5));
  bool seen = false;
  for (const auto& t : sum.timeline)
    if (t.what.type == action_type::overlap_f_b) {
      seen = true;
      CHECK(t.end - t.start == doctest::Approx(3.0));
    }
  CHECK(seen);
  auto overlapped = c.model();
  overlapped.overlap = [](double f, double b) { return std::max(f, b); };
  CHECK(simulate(s, overlapped).step_time == doctest::Approx(sum.step_time - 1.0));
  // both halves' outputs leave at the end: a 2-rank schedule simulates to the same step time whether
  // lowered or not, and the lowered form is what the simulator replays
  const schedule two = dualpipev{}.generate(2, 6);
  CHECK(simulate(two, c.model()).step_time ==
        doctest::Approx(simulate(add_send_recv(two), c.model()).step_time));
  CHECK(simulate(two, c.model()).bubble_ratio < 0.5);
  // memory: an overlap's forward half holds its activation before its backward half frees one; the
  // verifier and the simulator count that alike
  const auto rep = verify(two);
  const auto sim = simulate(two, c.model());
  CHECK(sim.peak_memory == rep.peak_memory);
}

TEST_CASE("pipeline trace: overlapped actions show in the SVG, the ASCII timeline and the Chrome trace") {
  const schedule s = dualpipev{}.generate(2, 4);
  const auto sim = simulate(s, uniform_costs{}.model());
  const std::string svg = svg_timeline(sim.timeline, "dualpipev");
  CHECK(svg.find("overlapped F+B") != std::string::npos);
  CHECK(svg.find("(0F3;3B1)OVERLAP_F_B rank 0") != std::string::npos);
  CHECK(ascii_timeline(sim.timeline, 60).find('X') != std::string::npos);
  const auto j = chrome_trace(sim.timeline);
  bool found = false;
  for (const auto& e : j.at("traceEvents"))
    if (e.value("name", std::string()) == "(0F3;3B1)OVERLAP_F_B") {
      found = true;
      CHECK(e.at("args").at("backward_stage") == 3);
      CHECK(e.at("args").at("backward_microbatch") == 1);
    }
  CHECK(found);
  CHECK(render(s, "csv-comms").find("(0F3;3B1)OVERLAP_F_B,0SEND_F3,3SEND_B1") != std::string::npos);
}

TEST_CASE("pipeline: encoders join dualpipev around the overlaps that hold stage 0's halves") {
  const schedule llm = dualpipev{}.generate(2, 5);
  encoder_work w{.forward = [](int) { return 0.5; }, .backward = [](int) { return 1.0; }};
  const schedule first = add_encoder(llm, encoder_on_first_stage{}, uniform_costs{}.model(), w);
  (void)verify(first);
  (void)verify(add_send_recv(first));
  // EF of m right before the action holding 0F m; EB right after the one holding 0B m
  const auto& row = first.ranks[0];
  for (std::size_t i = 0; i < row.size(); ++i)
    for (const action& p : parts(row[i])) {
      if (p.stage == 0 && p.type == action_type::forward) {
        REQUIRE(i > 0);
        CHECK(row[i - 1] == action{0, action_type::encoder_forward, p.microbatch});
      }
      if (p.stage == 0 && p.type == action_type::backward) {
        REQUIRE(i + 1 < row.size());
        CHECK(row[i + 1] == action{0, action_type::encoder_backward, p.microbatch});
      }
    }
  const schedule joint = add_encoder(llm, colocated_encoder{}, uniform_costs{}.model(), w);
  (void)verify(joint);
  (void)verify(add_send_recv(joint));
}
