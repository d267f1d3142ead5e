// SPDX-License-Identifier: Apache-2.0
// Tests of the verifier's error reports, the simulator, the joint encoder-LLM pipeline and the traces.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/io.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/pipeline/trace_json.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh_tools/schedule_names.hpp>  // names -> schedules: the tools' mapping

using namespace hetmesh::pipeline;

TEST_CASE("pipeline verify: errors name the offending action") {
  // Both ranks receive first: a deadlock under any send semantics.
  const schedule dead = from_csv("0F0,0RECV_B0,0SEND_F0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n", "dead");
  CHECK_THROWS_WITH_AS((void)verify(dead), doctest::Contains("rank 0 blocked at #1 `0RECV_B0`"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)verify(dead, {.mode = send_mode::buffered}), doctest::Contains("deadlock"),
                       hetmesh::invalid_argument);
  // Fine with buffered sends, a deadlock when sends block until received (both ranks sit in a send).
  const schedule eager = from_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\r\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\r\n",
      "eager");
  CHECK_NOTHROW((void)verify(eager, {.mode = send_mode::buffered}));
  CHECK_THROWS_WITH_AS((void)verify(eager), doctest::Contains("0SEND_F1"), hetmesh::invalid_argument);
  // A send without its receive.
  CHECK_THROWS_WITH_AS((void)verify(from_csv("0F0,0SEND_F0,0B0\r\n1F0,1B0\r\n")),
                       doctest::Contains("`0SEND_F0` has no matching `1RECV_F0` on rank 1"),
                       hetmesh::invalid_argument);
  // Backward before forward on one rank.
  CHECK_THROWS_WITH_AS((void)verify(from_csv("0B0,0F0\r\n")), doctest::Contains("`0B0` needs `0F0` first"),
                       hetmesh::invalid_argument);
  // A missing backward and a duplicate forward.
  CHECK_THROWS_WITH_AS((void)verify(from_csv("0F0,0F1,0B0\r\n")),
                       doctest::Contains("micro-batch 1 has no backward"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)verify(from_csv("0F0,0F0,0B0\r\n")), doctest::Contains("appears a second time"),
                       hetmesh::invalid_argument);
  // Data crossing ranks in a lowered schedule needs its RECV.
  schedule low = add_send_recv(one_f_one_b{}.generate(2, 2));
  std::erase_if(low.ranks[1],
                [](const action& a) { return a.type == action_type::recv_f && a.microbatch == 1; });
  CHECK_THROWS_AS((void)verify(low), hetmesh::invalid_argument);
  // The in-flight bound.
  CHECK_THROWS_WITH_AS((void)verify(gpipe{}.generate(2, 4), {.max_in_flight = 3}),
                       doctest::Contains("above the bound max_in_flight=3"), hetmesh::invalid_argument);
  CHECK_NOTHROW((void)verify(one_f_one_b{}.generate(2, 4), {.max_in_flight = 2}));
  // Peak memory with per-micro-batch sizes.
  const auto rep =
      verify(gpipe{}.generate(2, 3),
             {.activation_bytes = [](const action& a) -> std::int64_t { return 10 * (a.microbatch + 1); }});
  CHECK(rep.peak_memory == std::vector<std::int64_t>{60, 60});
}

TEST_CASE("pipeline simulate: equal costs reproduce the bubble formulas") {
  for (int p = 1; p <= 6; ++p)
    for (int m : {1, 2, 3, 4, 8, 13}) {
      INFO("p=", p, " m=", m);
      const double expected = static_cast<double>(p - 1) / (m + p - 1);
      for (const char* name : {"gpipe", "1f1b"}) {
        const auto sim = simulate(hetmesh::tools::make_schedule(name, p, m),
                                  uniform_costs{.forward = 1, .backward = 2}.model());
        CHECK(sim.bubble_ratio == doctest::Approx(expected).epsilon(1e-12));
        CHECK(sim.step_time == doctest::Approx(3.0 * (m + p - 1)));
      }
      if (m % p == 0 && p > 1)
        for (int v : {2, 3}) {
          // Interleaving divides the warm-up and cool-down by v: (p-1)/(v*m + p-1) at per-chunk costs 1/v.
          const auto sim = simulate(interleaved_1f1b{.virtual_stages = v}.generate(p, m),
                                    uniform_costs{.forward = 1.0 / v, .backward = 2.0 / v}.model());
          CHECK(sim.bubble_ratio ==
                doctest::Approx(static_cast<double>(p - 1) / (v * m + p - 1)).epsilon(1e-9));
        }
    }
}

TEST_CASE("pipeline simulate: zero-bubble schedules beat 1F1B; transfers and variable lengths count") {
  const auto costs = uniform_costs{.forward = 1, .backward = 2, .weight = 1}.model();
  const double t1 = simulate(one_f_one_b{}.generate(4, 8), costs).step_time;
  const double zb = simulate(zero_bubble{}.generate(4, 8), costs).step_time;
  CHECK(zb < t1);
  // ZB-V at F = I = W reaches the ideal per-rank work plus a short ramp.
  const auto half = uniform_costs{.forward = 0.5, .backward = 1, .weight = 0.5}.model();
  const auto zbv_sim = simulate(zbv{}.generate(4, 8), half);
  CHECK(zbv_sim.step_time < t1);
  // A link delay lengthens the step by at least (stages-1) transfers each way.
  const auto slow = uniform_costs{.forward = 1, .backward = 2, .transfer = 0.25}.model();
  CHECK(simulate(one_f_one_b{}.generate(4, 8), slow).step_time >= t1 + 2 * 3 * 0.25 - 1e-12);
  // Variable micro-batch lengths: the step is at least each rank's own work, and equals it plus the
  // pipeline ramp for GPipe on one rank.
  hetmesh::rng g(7);
  std::vector<double> len(8);
  for (auto& l : len) l = 0.5 + g.unit();
  cost_model var;
  var.compute = [&](const action& a) {
    return (a.type == action_type::forward ? 1.0 : 2.0) * len[static_cast<std::size_t>(a.microbatch)];
  };
  double total = 0;
  for (double l : len) total += 3 * l;
  CHECK(simulate(gpipe{}.generate(1, 8), var).step_time == doctest::Approx(total));
  const auto vs = simulate(one_f_one_b{}.generate(3, 8), var);
  for (double b : vs.busy) CHECK(b == doctest::Approx(total));
  CHECK(vs.step_time > total);
  CHECK(vs.timeline.size() == 3 * 8 * 2);
  // Each action starts after its inputs: stage s+1's forward after stage s's.
  std::map<std::pair<int, int>, timed_action> fwd;
  for (const auto& t : vs.timeline)
    if (t.what.type == action_type::forward) fwd[{t.what.stage, t.what.microbatch}] = t;
  for (int s = 1; s < 3; ++s)
    for (int mb = 0; mb < 8; ++mb) CHECK(fwd[{s, mb}].start >= fwd[{s - 1, mb}].end);
  CHECK_THROWS_AS((void)simulate(one_f_one_b{}.generate(2, 2), cost_model{}), hetmesh::invalid_argument);
}

TEST_CASE("pipeline joint encoder: dependencies hold and it beats encoder-on-first-stage") {
  hetmesh::rng g(11);
  int compared = 0;
  for (const char* name : {"1f1b", "interleaved-1f1b", "zero-bubble", "zbv"})
    for (int p : {2, 3, 4})
      for (int m : {4, 8, 12}) {
        schedule llm;
        try {
          llm = hetmesh::tools::make_schedule(name, p, m);
        } catch (const hetmesh::invalid_argument&) {
          continue;
        }
        const double v = static_cast<double>(llm.num_stages) / p;
        const auto costs = uniform_costs{.forward = 1 / v, .backward = 2 / v, .weight = 1 / v}.model();
        std::vector<double> enc(static_cast<std::size_t>(m));
        for (auto& e : enc) e = 0.05 + 1.5 * g.unit();  // variable image load per micro-batch
        encoder_work w{.forward = [&](int mb) { return enc[static_cast<std::size_t>(mb)]; },
                       .backward = [&](int mb) { return 2 * enc[static_cast<std::size_t>(mb)]; }};
        INFO(name, " p=", p, " m=", m);
        const schedule joint = add_encoder(llm, colocated_encoder{.lookahead = 2}, costs, w);
        const schedule first = add_encoder(llm, encoder_on_first_stage{}, costs, w);
        const schedule pool = add_encoder(llm, encoder_pool{.ranks = 1}, costs, w);
        CHECK(joint.num_encoder_shards() == p);
        for (const auto* s : {&joint, &first, &pool}) {
          (void)verify(*s);
          (void)verify(add_send_recv(*s));
        }
        const auto sj = simulate(joint, with_encoder(costs, w, joint.num_encoder_shards()));
        const auto sf = simulate(first, with_encoder(costs, w, first.num_encoder_shards()));
        CHECK(sj.step_time < sf.step_time);
        ++compared;
        // In time: every shard's EF of mb ends before stage 0's F of mb starts; EB starts after B/I(0, mb).
        std::map<int, double> f0_start, b0_end, ef_end, eb_start;
        for (const auto& t : sj.timeline) {
          const int mb = t.what.microbatch;
          if (t.what.type == action_type::forward && t.what.stage == 0) f0_start[mb] = t.start;
          if ((t.what.type == action_type::backward || t.what.type == action_type::backward_input) &&
              t.what.stage == 0)
            b0_end[mb] = t.end;
          if (t.what.type == action_type::encoder_forward) ef_end[mb] = std::max(ef_end[mb], t.end);
          if (t.what.type == action_type::encoder_backward)
            eb_start[mb] = eb_start.count(mb) ? std::min(eb_start[mb], t.start) : t.start;
        }
        for (int mb = 0; mb < m; ++mb) {
          CHECK(ef_end[mb] <= f0_start[mb]);
          CHECK(eb_start[mb] >= b0_end[mb]);
        }
      }
  CHECK(compared > 20);
  CHECK_THROWS_AS(
      (void)add_encoder(one_f_one_b{}.generate(2, 2), encoder_pool{.ranks = 0}, uniform_costs{}.model(), {}),
      hetmesh::invalid_argument);
  CHECK(fmt::format("{}", colocated_encoder{.lookahead = 3}) == "colocated(lookahead=3)");
  CHECK(fmt::format("{}", encoder_pool{.ranks = 2}) == "pool(ranks=2, lookahead=-1)");
  CHECK(fmt::format("{}", encoder_on_first_stage{}) == "first-stage");
}

TEST_CASE("pipeline trace: Chrome trace JSON and ASCII timeline") {
  const auto sim = simulate(one_f_one_b{}.generate(2, 3), uniform_costs{.forward = 1, .backward = 2}.model());
  const auto j = chrome_trace(sim.timeline);
  const auto& ev = j.at("traceEvents");
  int complete = 0;
  for (const auto& e : ev) {
    if (e.at("ph") == "X") {
      ++complete;
      CHECK(e.at("dur").get<double>() > 0);
      CHECK(parse_action(e.at("name").get<std::string>()).stage == e.at("args").at("stage").get<int>());
    }
  }
  CHECK(complete == 12);
  // 1F1B pp=2 M=3 at F=1, B=2 (one column per second), worked out by hand:
  // rank 0: F0 F1, idle until rank 1's B0 returns at 4, B0, F2, B1, idle, B2.
  const std::string art = ascii_timeline(sim.timeline, 12);
  CHECK(art.find("rank 0 |FF..BBFBB.BB|") != std::string::npos);
  CHECK(art.find("rank 1 |.FBBFBBFBB..|") != std::string::npos);
  CHECK(ascii_timeline(sim.timeline, 12, true).find("rank 1 |.00B11B22B..|") != std::string::npos);
}

TEST_CASE("pipeline render: the CLI's formats") {
  const schedule s = one_f_one_b{}.generate(2, 2);
  CHECK(render(s, "actions") == "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n");
  CHECK(render(s, "csv") == "0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n");
  CHECK(from_csv(render(s, "csv-comms")).ranks == add_send_recv(s).ranks);
  CHECK(render(s, "table").starts_with("        Rank 0   Rank 1  \nStep 0: 0F0      1RECV_F0"));
  CHECK(render(s, "ascii", 18).find("rank 1 |..0F0BBB1F1BBB....|") != std::string::npos);
  CHECK_THROWS_WITH_AS((void)render(s, "yaml"), doctest::Contains("unknown format"),
                       hetmesh::invalid_argument);
}
