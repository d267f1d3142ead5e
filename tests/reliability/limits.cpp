// SPDX-License-Identifier: Apache-2.0
// Limits and finite numbers in the library (issue 17): line readers stop at their bound, modelled times
// that would leave their fixed-point or int64 range are refused with the figure instead of wrapping into
// negative or zero values, and costs that are not finite never reach a printed step time.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/lines.hpp>
#include <hetmesh/cost/activation_memory.hpp>
#include <hetmesh/cost/compute.hpp>
#include <hetmesh/mesh/layout.hpp>
#include <hetmesh/mesh/search.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/simulate.hpp>

#include "../../tools/common/hetmesh_tools/args.hpp"

using namespace hetmesh;
using doctest::Contains;

TEST_CASE("read_line_bounded: lines as std::getline reads them, and a refusal past the bound") {
  std::istringstream in("ab\n\ncd");
  std::string line;
  std::vector<std::string> got;
  std::size_t no = 0;
  while (read_line_bounded(in, line, 4, "t.txt", ++no)) got.push_back(line);
  CHECK(got == std::vector<std::string>{"ab", "", "cd"});
  std::istringstream longer("abcd\nabcde\n");
  CHECK(read_line_bounded(longer, line, 4, "t.txt", 1));
  CHECK(line == "abcd");
  CHECK_THROWS_WITH_AS((void)read_line_bounded(longer, line, 4, "t.txt", 2),
                       Contains("t.txt:2: line longer than 4 bytes"), data_error);
  // /dev/zero is refused as a device before a byte is read (core/files.hpp); a regular file without
  // newlines is refused after one bound's worth of bytes.
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(std::filesystem::path("/dev/zero")),
                       Contains("'/dev/zero' is a character device"), data_error);
}

TEST_CASE("layout search: traffic the fixed-point time cannot hold is refused, not wrapped negative") {
  const auto m = mesh::make_mesh(mesh::tp(8), mesh::dp(2));
  const mesh::topology topo{.nodes = 2, .devices_per_node = 8, .intra_bw_gbps = 1e-6, .inter_bw_gbps = 1e-6};
  CHECK_THROWS_WITH_AS((void)mesh::search_layout(m, mesh::traffic{.tp = 1e30}, topo),
                       Contains("exceeds the model's bound of 1e18 ns"), invalid_argument);
  const auto ok = mesh::search_layout(m, mesh::traffic{.tp = 8e9, .dp = 1e9}, mesh::topology{.nodes = 2});
  CHECK(ok.best().time_ns > 0);
  CHECK(ok.speedup() >= 1.0);
}

TEST_CASE("pipeline simulate: infinite costs and activation sizes past int64 are refused") {
  const auto s = pipeline::one_f_one_b{}.generate(2, 4);
  pipeline::cost_model inf_costs = pipeline::uniform_costs{}.model();
  inf_costs.compute = [](const pipeline::action&) { return std::numeric_limits<double>::infinity(); };
  CHECK_THROWS_WITH_AS((void)pipeline::simulate(s, inf_costs),
                       Contains("expected a finite, non-negative number of seconds"), invalid_argument);

  const cost::llm_compute llm{cost::bytescale_fig6a_layer(), 32, 3.0};
  const auto link = mesh::topology{}.inter();
  const auto act = cost::activation_memory::from_dims(1 << 20, 8);
  // One sample of 2^63-1 tokens: was 0 activation bytes (a double past int64 cast back).
  const std::vector<std::vector<std::int64_t>> huge{{std::numeric_limits<std::int64_t>::max()}};
  CHECK_THROWS_WITH_AS((void)pipeline::micro_batch_costs::priced(huge, llm, 4.0, link, 4096, act),
                       Contains("activation bytes on a stage; expected fewer than 2^62"), overflow_error);
  // Lengths whose sum leaves int64.
  const std::vector<std::vector<std::int64_t>> two{{std::int64_t{1} << 62, std::int64_t{1} << 62}};
  CHECK_THROWS_WITH_AS((void)pipeline::micro_batch_costs::priced(two, llm, 4.0, link, 4096, act),
                       Contains("a micro-batch's tokens"), overflow_error);
  // Two live activations of 2^62 bytes each on one rank: the running sum is checked.
  pipeline::cost_model big = pipeline::uniform_costs{}.model();
  big.memory = [](const pipeline::action&) { return std::int64_t{1} << 62; };
  CHECK_THROWS_WITH_AS((void)pipeline::simulate(s, big), Contains("live activation memory of rank"),
                       overflow_error);
}

TEST_CASE("tools::parse_real: the whole text, finite") {
  CHECK(tools::parse_real("2e-3", "x") == doctest::Approx(2e-3));
  for (const char* bad : {"1.5x", "inf", "nan", "", " 1", "1e999", "0x10"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        (void)tools::parse_real(bad, "option --tflops"),
        Contains(("option --tflops '" + std::string(bad) + "': expected a finite number").c_str()),
        tools::usage_error);
  }
}
