// SPDX-License-Identifier: Apache-2.0
// Tests of the action IR, its text forms and the schedule generators.
//
// Golden orders below were derived by hand from the peers' published algorithms, not from our output:
//  - 1F1B: Megatron-LM forward_backward_pipelining_without_interleaving (warm-up pp-rank-1 forwards,
//    then (F, B) pairs, then the remaining B), which is also PyTorch Schedule1F1B's pipeline order.
//  - Interleaved 1F1B: Megatron-LM's schedule table (its "PP2 N3M5 with VP2" docstring example) and
//    warm-up (pp-rank-1)*2 + (vp-1)*N; forward k uses table[k], backward k uses the reversed chunk.
//  - PyTorch ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble (_get_1f1b_rank_ops with
//    microbatches_per_round) and ScheduleZBVZeroBubble (_calculate_single_rank_operations).
// The cases marked "torch 2.15.0" were printed by PyTorch itself (the schedules' pipeline_order, built over
// stand-in stages by scripts/peers/pipeline_vs_pytorch.py), so these tests need no Python.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/io.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/schedule_family.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh_tools/schedule_names.hpp>  // names -> schedules: the tools' mapping

using namespace hetmesh::pipeline;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> texts(const schedule& s, int rank) { return split(compute_text(s, rank)); }

}  // namespace

TEST_CASE("pipeline: action text round-trips in PyTorch's notation") {
  CHECK(to_text(F(2, 0)) == "2F0");
  CHECK(to_text(action{1, action_type::send_f, 3}) == "1SEND_F3");
  CHECK(to_text(action{0, action_type::reduce_grad, -1}) == "0REDUCE_GRAD");
  CHECK(to_text(action{3, action_type::encoder_backward, 12}) == "3EB12");
  for (int t = 0; t < action_type_count; ++t) {
    if (static_cast<action_type>(t) == action_type::overlap_f_b) continue;  // two halves: dualpipe.cpp
    const action a{7, static_cast<action_type>(t),
                   static_cast<action_type>(t) == action_type::reduce_grad ? -1 : 11};
    CHECK(parse_action(to_text(a)) == a);
  }
  CHECK(parse_action(" 12RECV_B4 ") == action{12, action_type::recv_b, 4});
  CHECK_THROWS_AS((void)parse_action("F0"), hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)parse_action("1X0"), hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)parse_action("1F"), hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)parse_action("1F0x"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)parse_action("1Q0"), doctest::Contains("unknown type \"Q\""),
                       hetmesh::invalid_argument);
  CHECK(fmt::format("{}", W(3, 1)) == "3W1");
}

TEST_CASE("pipeline: PyTorch CSV import and export") {
  // A hand-written file in PyTorch's _dump_csv layout: one row per rank, empty fields are idle steps.
  const std::string text = "0F0,0SEND_F0,,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n";
  const schedule s = from_csv(text);
  REQUIRE(s.ranks.size() == 2);
  CHECK(s.num_stages == 2);
  CHECK(s.num_microbatches == 1);
  CHECK(s.stage_to_rank == std::vector<int>{0, 1});
  CHECK(s.ranks[0] ==
        std::vector<action>{F(0, 0), {0, action_type::send_f, 0}, {0, action_type::recv_b, 0}, B(0, 0)});
  CHECK(to_csv(s) == "0F0,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n");
  (void)verify(s);
  // Round trip of every generator through CSV, lowered.
  for (const char* name :
       {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "interleaved-zero-bubble", "zbv", "looped-bfs"}) {
    const schedule g = add_send_recv(hetmesh::tools::make_schedule(name, 3, 6));
    const schedule back = from_csv(to_csv(g), g.name);
    CHECK(back.ranks == g.ranks);
    CHECK(back.stage_to_rank == g.stage_to_rank);
  }
  CHECK_THROWS_WITH_AS((void)from_csv("0F0\r\n0B0\r\n"), doctest::Contains("stage 0 appears on rank 1"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)from_csv("0F0,zz\r\n"), doctest::Contains("row 0"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline: PyTorch's table formatter layout") {
  const schedule s = from_csv("0F0,0F1\r\n1F0\r\n");
  // Columns are as wide as the longest of the rank's actions and the step label ("Step 0").
  CHECK(format_pipeline_order(s) == "        Rank 0 Rank 1\nStep 0: 0F0    1F0   \nStep 1: 0F1          \n");
}

TEST_CASE("pipeline: golden 1F1B and GPipe orders (Megatron-LM / PyTorch)") {
  const schedule s = one_f_one_b{}.generate(4, 6);
  CHECK(texts(s, 0) == split("0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"));
  CHECK(texts(s, 2) == split("2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5"));
  CHECK(texts(s, 3) == split("3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"));
  // Fewer micro-batches than stages: the warm-up is capped at M.
  CHECK(texts(one_f_one_b{}.generate(4, 2), 0) == split("0F0 0F1 0B0 0B1"));
  CHECK(texts(gpipe{}.generate(2, 3), 1) == split("1F0 1F1 1F2 1B0 1B1 1B2"));
}

TEST_CASE("pipeline: golden interleaved 1F1B (Megatron-LM schedule table, PP2 N3 M5 VP2)") {
  const auto table = detail::schedule_table(5, 2, 3);
  // Megatron's docstring: microbatch_id 0 1 2 0 1 2 3 4 3 4 / model_chunk_id 0 0 0 1 1 1 0 0 1 1
  std::vector<std::pair<int, int>> expected{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                            {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  CHECK(table == expected);
  const schedule s =
      generate(interleaved_1f1b{.virtual_stages = 2, .group_size = 3, .rule = group_rule::megatron}, 2, 5);
  CHECK(s.stage_to_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(texts(s, 0) ==
        split("0F0 0F1 0F2 2F0 2F1 2F2 2B0 0F3 2B1 0F4 2B2 2F3 0B0 2F4 0B1 0B2 2B3 2B4 0B3 0B4"));
  CHECK(texts(s, 1) ==
        split("1F0 1F1 1F2 3F0 3B0 3F1 3B1 3F2 3B2 1F3 1B0 1F4 1B1 3F3 1B2 3F4 3B3 3B4 1B3 1B4"));
  (void)verify(add_send_recv(s));
}

TEST_CASE(
    "pipeline: golden PyTorch ScheduleInterleaved1F1B, and agreement with Megatron when group sizes agree") {
  // pp=2, M=2, two stages per rank: one round of 2 micro-batches.
  const schedule s = generate(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::pytorch}, 2, 2);
  CHECK(texts(s, 0) == split("0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1"));
  CHECK(texts(s, 1) == split("1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1"));
  // PyTorch's docstring example pp=4, M=10: 2 rounds of 5 = Megatron with group size 5.
  CHECK(generate(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::pytorch}, 4, 10).ranks ==
        generate(interleaved_1f1b{.virtual_stages = 2, .group_size = 5, .rule = group_rule::megatron}, 4, 10)
            .ranks);
  // M a multiple of pp: PyTorch's group size is pp, Megatron's default.
  for (int v : {2, 3, 4})
    CHECK(generate(interleaved_1f1b{.virtual_stages = v}, 4, 12).ranks ==
          generate(interleaved_1f1b{.virtual_stages = v, .rule = group_rule::megatron}, 4, 12).ranks);
  // PyTorch's rule is the default.
  CHECK(interleaved_1f1b{}.rule == group_rule::pytorch);
}

TEST_CASE("pipeline: golden ScheduleInterleaved1F1B with fewer micro-batches than ranks (torch 2.15.0)") {
  // pp=4, M=2, v=2: one round of 2 micro-batches; Megatron-LM's rule refuses M < pp.
  const schedule s = interleaved_1f1b{.virtual_stages = 2}.generate(4, 2);
  CHECK(texts(s, 0) == split("0F0 0F1 4F0 4F1 4B0 4B1 0B0 0B1"));
  CHECK(texts(s, 1) == split("1F0 1F1 5F0 5F1 5B0 5B1 1B0 1B1"));
  CHECK(texts(s, 2) == split("2F0 2F1 6F0 6F1 6B0 6B1 2B0 2B1"));
  CHECK(texts(s, 3) == split("3F0 3F1 7F0 7B0 7F1 7B1 3B0 3B1"));
  // pp=3, M=2, v=3.
  const schedule t = interleaved_1f1b{.virtual_stages = 3}.generate(3, 2);
  CHECK(texts(t, 0) == split("0F0 0F1 3F0 3F1 6F0 6F1 6B0 6B1 3B0 3B1 0B0 0B1"));
  CHECK(texts(t, 2) == split("2F0 2F1 5F0 5F1 8F0 8B0 8F1 8B1 5B0 5B1 2B0 2B1"));
  // pp=4, M=6: one round of 6 (Megatron's default group size pp refuses 6 % 4 = 2 < pp).
  const schedule u = interleaved_1f1b{.virtual_stages = 2}.generate(4, 6);
  CHECK(texts(u, 1) == split("1F0 1F1 1F2 1F3 1F4 1F5 5F0 5F1 5F2 5F3 5F4 5B0 5F5 5B1 5B2 5B3 5B4 5B5 1B0 "
                             "1B1 1B2 1B3 1B4 1B5"));
  CHECK(texts(u, 2) == split("2F0 2F1 2F2 2F3 2F4 2F5 6F0 6F1 6F2 6B0 6F3 6B1 6F4 6B2 6F5 6B3 6B4 6B5 2B0 "
                             "2B1 2B2 2B3 2B4 2B5"));
  CHECK_THROWS_WITH_AS(
      (void)(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::megatron}.generate(4, 6)),
      doctest::Contains("multiple of pp=4"), hetmesh::invalid_argument);
  for (const auto* x : {&s, &t, &u}) (void)verify(add_send_recv(*x));
}

TEST_CASE("pipeline: golden ScheduleLoopedBFS (torch 2.15.0)") {
  const schedule s = looped_bfs{}.generate(2, 3);
  CHECK(s.name == "looped-bfs");
  CHECK(s.stage_to_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(texts(s, 0) == split("0F0 0F1 0F2 2F0 2F1 2F2 2B2 2B1 2B0 0B2 0B1 0B0"));
  CHECK(texts(s, 1) == split("1F0 1F1 1F2 3F0 3F1 3F2 3B2 3B1 3B0 1B2 1B1 1B0"));
  const schedule t = looped_bfs{.virtual_stages = 3}.generate(3, 2);
  CHECK(texts(t, 0) == split("0F0 0F1 3F0 3F1 6F0 6F1 6B1 6B0 3B1 3B0 0B1 0B0"));
  CHECK(texts(t, 2) == split("2F0 2F1 5F0 5F1 8F0 8F1 8B1 8B0 5B1 5B0 2B1 2B0"));
  (void)verify(add_send_recv(t));
  // The simulator runs it: every compute action once; here (equal costs) no faster than depth-first
  // interleaving of the same stages.
  const auto costs = uniform_costs{.forward = 1.0 / 3, .backward = 2.0 / 3}.model();
  const auto sim = simulate(t, costs);
  std::size_t computes = 0;
  for (const auto& e : sim.timeline) computes += is_compute(e.what.type) ? 1 : 0;
  CHECK(computes == 2U * 9U * 2U);
  CHECK(sim.step_time >= simulate(interleaved_1f1b{.virtual_stages = 3}.generate(3, 2), costs).step_time);
  CHECK(fmt::format("{}", looped_bfs{.virtual_stages = 3}) == "looped-bfs(virtual_stages=3)");
  CHECK(hetmesh::plan_hash(looped_bfs{.virtual_stages = 3}) != hetmesh::plan_hash(looped_bfs{}));
  CHECK_THROWS_WITH_AS((void)looped_bfs{.virtual_stages = 0}.generate(2, 2),
                       doctest::Contains("virtual_stages=0"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline: zero-bubble = interleaved-zero-bubble with one stage per rank (torch 2.15.0)") {
  // Same order and same refusals over a grid: PyTorch's ScheduleInterleavedZeroBubble with one stage per
  // rank refuses M that is not a multiple of max(1, M / pp), e.g. pp=2, M=5.
  int both = 0, refused = 0;
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 14; ++m) {
      INFO("pp=", pp, " m=", m);
      const bool pytorch_accepts = m % std::max(1, m / pp) == 0;
      schedule a, b;
      bool a_ok = true, b_ok = true;
      try {
        a = zero_bubble{}.generate(pp, m);
      } catch (const hetmesh::invalid_argument&) {
        a_ok = false;
      }
      try {
        b = interleaved_zero_bubble{.virtual_stages = 1}.generate(pp, m);
      } catch (const hetmesh::invalid_argument&) {
        b_ok = false;
      }
      CHECK(a_ok == pytorch_accepts);
      CHECK(b_ok == pytorch_accepts);
      if (a_ok && b_ok) {
        CHECK(a.ranks == b.ranks);
        CHECK(a.stage_to_rank == b.stage_to_rank);
        ++both;
      } else {
        ++refused;
      }
    }
  CHECK(both > 60);
  CHECK(refused > 10);
  CHECK_THROWS_WITH_AS((void)zero_bubble{}.generate(2, 5),
                       doctest::Contains("multiple of the number of rounds"), hetmesh::invalid_argument);
  // pp=3, M=5: one round of 5, PyTorch's order.
  const schedule z = zero_bubble{}.generate(3, 5);
  CHECK(texts(z, 0) == split("0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0F4 0I2 0W2 0I3 0W3 0I4 0W4"));
  CHECK(texts(z, 1) == split("1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1F4 1I3 1W2 1I4 1W3 1W4"));
  CHECK(texts(z, 2) == split("2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2F4 2I4 2W2 2W3 2W4"));
  // Interleaved zero bubble with M < pp: pp=4, M=3, v=2.
  const schedule i = interleaved_zero_bubble{.virtual_stages = 2}.generate(4, 3);
  CHECK(texts(i, 1) == split("1F0 1F1 1F2 5F0 5F1 5F2 5I0 5I1 5W0 5I2 5W1 1I0 5W2 1I1 1W0 1I2 1W1 1W2"));
  CHECK(texts(i, 3) == split("3F0 3F1 3F2 7F0 7I0 7F1 7I1 7F2 7I2 3I0 7W0 3I1 7W1 3I2 7W2 3W0 3W1 3W2"));
}

TEST_CASE("pipeline: the compute_comms CSV PyTorch's runtime loads (torch 2.15.0's lowering passes)") {
  // 1F1B pp=2, M=3 through PyTorch's _add_reduce_grad, _add_send_recv and _add_wait_send.
  const schedule low = add_send_recv(add_reduce_grad(one_f_one_b{}.generate(2, 3)));
  CHECK(
      to_compute_comms_csv(low) ==
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0F2,0SEND_F2,0RECV_B1,0B1,0WAIT_SEND_F1,0RECV_B2,"
      "0B2,0WAIT_SEND_F2,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\r\n"
      "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1RECV_F2,1B1,1SEND_B1,1F2,1B2,1SEND_B2,1REDUCE_GRAD,"
      "1WAIT_REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_SEND_B1,1WAIT_SEND_B2\r\n");
  // It reads back (the waits, and PyTorch's FSDP markers, are skipped) as the lowered schedule.
  const schedule back = from_csv(to_compute_comms_csv(low), low.name);
  CHECK(back.ranks == low.ranks);
  CHECK(from_csv("0UNSHARD,0F0,0B0,0RESHARD,0WAIT_SEND_F3\r\n").ranks ==
        std::vector<std::vector<action>>{{F(0, 0), B(0, 0)}});
  CHECK_THROWS_AS((void)from_csv("0F0,0WAIT_SEND_F\r\n"), hetmesh::invalid_argument);  // a wait needs its mb
  CHECK_THROWS_AS((void)from_csv("0F0,0UNSHARD3\r\n"), hetmesh::invalid_argument);
  // Encoder actions have no PyTorch form.
  const schedule joint = add_send_recv(
      add_encoder(one_f_one_b{}.generate(2, 2), encoder_on_first_stage{}, uniform_costs{}.model(),
                  encoder_work{.forward = [](int) { return 1.0; }, .backward = [](int) { return 2.0; }}));
  CHECK_THROWS_WITH_AS((void)to_compute_comms_csv(joint), doctest::Contains("encoder action"),
                       hetmesh::invalid_argument);
}

TEST_CASE("pipeline: golden PyTorch ScheduleInterleavedZeroBubble and ZB-H1") {
  const schedule s = interleaved_zero_bubble{.virtual_stages = 2}.generate(2, 2);
  CHECK(texts(s, 0) == split("0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1"));
  CHECK(texts(s, 1) == split("1F0 1F1 3F0 3I0 3F1 3I1 3W0 1I0 3W1 1I1 1W0 1W1"));
  // ZB-H1, pp=3, M=4: rank r warms up with pp-1-r forwards and defers each W by r backwards.
  const schedule z = zero_bubble{}.generate(3, 4);
  CHECK(texts(z, 0) == split("0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3"));
  CHECK(texts(z, 2) == split("2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3"));
}

TEST_CASE("pipeline: golden PyTorch ScheduleZBVZeroBubble") {
  const schedule s = zbv{}.generate(2, 4);
  CHECK(s.stage_to_rank == std::vector<int>{0, 1, 1, 0});
  CHECK(
      texts(s, 0) ==
      split(
          "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3"));
  CHECK(
      texts(s, 1) ==
      split(
          "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3"));
}

TEST_CASE("pipeline: impossible configurations name the rule they break") {
  CHECK_THROWS_WITH_AS(
      (void)(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::megatron}.generate(4, 6)),
      doctest::Contains("multiple of pp=4"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::megatron}.generate(4, 2)),
      doctest::Contains("[pp, microbatches]"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)(interleaved_1f1b{.virtual_stages = 2, .group_size = 3}.generate(4, 8)),
                       doctest::Contains("rule = group_rule::megatron"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)generate(interleaved_1f1b{.virtual_stages = 2, .rule = group_rule::pytorch}, 4, 9),
      doctest::Contains("multiple of the number of rounds"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)one_f_one_b{}.generate(0, 4), doctest::Contains("pp >= 1"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)one_f_one_b{}.generate(2, 0), doctest::Contains("at least one micro-batch"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::make_schedule("dualpipe", 2, 4),
                       doctest::Contains("unknown schedule"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::make_schedule("1f1b", 2, 4, 3),
                       doctest::Contains("does not apply"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::make_schedule("gpipe", 2, 4, 0, 2),
                       doctest::Contains("--group-size"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)interleaved_1f1b{.virtual_stages = -1}.generate(2, 4),
                       doctest::Contains("virtual_stages=-1"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline: every generator over a grid passes the verifier, compute-only and lowered") {
  int generated = 0;
  for (const char* name :
       {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "interleaved-zero-bubble", "zbv", "looped-bfs"}) {
    const bool interleaved =
        std::string(name).starts_with("interleaved") || std::string(name) == "looped-bfs";
    for (int pp = 1; pp <= 5; ++pp)
      for (int m = 1; m <= 11; ++m)
        for (int v : interleaved ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{0}) {
          schedule s;
          try {
            s = hetmesh::tools::make_schedule(name, pp, m, v);
          } catch (const hetmesh::invalid_argument&) {
            // Only the documented rule may refuse: PyTorch's rounds (M a multiple of max(1, M / pp)) for
            // interleaved-1f1b, interleaved-zero-bubble and zero-bubble.
            CHECK((std::string(name).starts_with("interleaved") || std::string(name) == "zero-bubble"));
            CHECK(m % std::max(1, m / pp) != 0);
            continue;
          }
          ++generated;
          INFO(name, " pp=", pp, " m=", m, " v=", v);
          CHECK(s.num_stages == pp * (interleaved ? v : (std::string(name) == "zbv" ? 2 : 1)));
          const auto rep = verify(s);
          const bool split_backward =
              std::string(name).find("zero") != std::string::npos || std::string(name) == "zbv";
          CHECK(rep.compute_actions ==
                static_cast<std::size_t>(s.num_stages * m) * (split_backward ? 3U : 2U));
          const schedule low = add_send_recv(s);
          const auto lrep = verify(low);  // blocking (rendezvous) send/receive
          CHECK(lrep.peak_in_flight == rep.peak_in_flight);
          if (std::string(name) == "1f1b")
            for (int r = 0; r < pp; ++r)
              CHECK(rep.peak_in_flight[static_cast<std::size_t>(r)] == std::min(pp - r, m));
          if (std::string(name) == "gpipe")
            for (int r = 0; r < pp; ++r) CHECK(rep.peak_in_flight[static_cast<std::size_t>(r)] == m);
          // Lowering adds exactly one pair per cross-rank edge.
          std::size_t cross = 0;
          for (int st = 0; st + 1 < s.num_stages; ++st)
            if (s.rank_of_stage(st) != s.rank_of_stage(st + 1)) cross += 2 * static_cast<std::size_t>(m);
          CHECK(lrep.comm_pairs == cross);
        }
  }
  CHECK(generated > 450);
}

TEST_CASE("pipeline: plans are deterministic and hashable") {
  const auto a = interleaved_zero_bubble{.virtual_stages = 2}.generate(4, 8);
  const auto b = interleaved_zero_bubble{.virtual_stages = 2}.generate(4, 8);
  CHECK(hetmesh::plan_hash(a) == hetmesh::plan_hash(b));
  CHECK(hetmesh::plan_hash(a) !=
        hetmesh::plan_hash(interleaved_zero_bubble{.virtual_stages = 3}.generate(4, 8)));
  CHECK(hetmesh::plan_hash(add_send_recv(a)) == hetmesh::plan_hash(add_send_recv(b)));
  CHECK(fmt::format("{}", interleaved_1f1b{}) ==
        "interleaved-1f1b(virtual_stages=2, group_size=0, rule=pytorch)");
  CHECK(fmt::format("{}", zbv{}) == "zbv");
  // The tools' variant prints as the family it holds.
  CHECK(fmt::format("{}", hetmesh::tools::schedule_policy{interleaved_1f1b{}}) ==
        "interleaved-1f1b(virtual_stages=2, group_size=0, rule=pytorch)");
  CHECK(fmt::format("{}", hetmesh::tools::policy_from_name("interleaved-1f1b", 2, 4)) ==
        "interleaved-1f1b(virtual_stages=2, group_size=4, rule=megatron)");
  CHECK(fmt::format("{}", hetmesh::tools::schedule_policy{zbv{}}) == "zbv");
  CHECK(fmt::format("{}", a).starts_with(
      "schedule interleaved-zero-bubble (ranks=4, stages=8, microbatches=8"));
}

TEST_CASE("pipeline: REDUCE_GRAD follows each stage's last backward") {
  const schedule s = add_reduce_grad(interleaved_zero_bubble{.virtual_stages = 2}.generate(2, 4));
  for (const auto& row : s.ranks) {
    std::set<int> reduced;
    for (const auto& a : row) {
      if (a.type == action_type::reduce_grad) reduced.insert(a.stage);
      if (a.type == action_type::backward_weight) CHECK(reduced.count(a.stage) == 0);
    }
    CHECK(reduced.size() == 2);
  }
  (void)verify(add_send_recv(s));
}

TEST_CASE("pipeline: schedule families are types; the split-backward rule is a compile-time trait") {
  static_assert(schedule_family<gpipe> && schedule_family<zbv>);
  static_assert(!schedule_family<schedule>);
  static_assert(!gpipe::requires_split_backward && !one_f_one_b::requires_split_backward &&
                !interleaved_1f1b::requires_split_backward && !looped_bfs::requires_split_backward);
  static_assert(schedule_family<looped_bfs> && schedule_accepts<looped_bfs, false>);
  static_assert(zero_bubble::requires_split_backward && interleaved_zero_bubble::requires_split_backward &&
                zbv::requires_split_backward);
  static_assert(schedule_accepts<one_f_one_b, false> && !schedule_accepts<zbv, false> &&
                schedule_accepts<zbv, true>);
  static_assert(check_schedule_accepts<interleaved_1f1b, false>());
  CHECK(name_of(zbv{}) == "zbv");
  CHECK(zbv::name == "zbv");
  CHECK(zbv{}.generate(2, 4).ranks == generate(zbv{}, 2, 4).ranks);
  CHECK(interleaved_1f1b{.virtual_stages = 3}.generate(2, 4).num_stages == 6);
  // The trait agrees with the actions each family emits, and with the tools' view of the same names.
  for (const auto name : hetmesh::tools::schedule_names) {
    const auto policy = hetmesh::tools::policy_from_name(name);
    const schedule s = hetmesh::tools::generate(policy, 2, 4);
    bool split = false;
    for (const auto& row : s.ranks)
      for (const auto& a : row) split = split || a.type == action_type::backward_weight;
    CHECK(split == hetmesh::tools::requires_split_backward(policy));
    CHECK(fmt::format("{}", policy).starts_with(name));
  }
  CHECK(hetmesh::plan_hash(interleaved_1f1b{}) != hetmesh::plan_hash(interleaved_zero_bubble{}));
}
