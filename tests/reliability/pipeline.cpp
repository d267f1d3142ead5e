// SPDX-License-Identifier: Apache-2.0
// The PyTorch CSV schedule reader (pipeline/io.hpp) on bad input found by fuzzing: names that would
// size tables by a huge number are refused with the figure, before any allocation (also inside an
// overlapped action's halves).
#include <doctest/doctest.h>

#include <hetmesh/pipeline/io.hpp>

using namespace hetmesh;
using doctest::Contains;

TEST_CASE("pipeline CSV: a stage number far beyond the actions is refused, not allocated") {
  CHECK_THROWS_WITH_AS((void)pipeline::from_csv("0F0,00000959319657F50"),
                       Contains("stage 959319657 named, but the CSV has only 2 action(s)"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)pipeline::from_csv("0F2147483647"), Contains("micro-batch 2147483647 named"),
                       invalid_argument);
  CHECK_THROWS_AS((void)pipeline::from_csv("0F99999999999999999999"), invalid_argument);
  CHECK(pipeline::from_csv("0F0,0F1,0B0,0B1\n").num_microbatches == 2);
}

TEST_CASE("pipeline CSV: an overlapped action's halves are held to the same bounds") {
  // the backward half names the huge stage: refused before any table is sized by it
  CHECK_THROWS_WITH_AS((void)pipeline::from_csv("0F0,(1F0;959319657B0)OVERLAP_F_B,1B0,0B0"),
                       Contains("stage 959319657 named"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)pipeline::from_csv("(0F2147483647;1B0)OVERLAP_F_B"),
                       Contains("micro-batch 2147483647 named"), invalid_argument);
  CHECK_THROWS_AS((void)pipeline::from_csv("(0F0;1B99999999999999999999)OVERLAP_F_B"), invalid_argument);
  CHECK_THROWS_AS((void)pipeline::from_csv("(0F0;1B0"), invalid_argument);
  CHECK_THROWS_AS((void)pipeline::from_csv("(0F0;1B0)OVERLAP_F_B,(((("), invalid_argument);
  CHECK(pipeline::from_csv("0F0,1F0,(0F1;1B0)OVERLAP_F_B,1F1,1B1,0B0,0B1").num_microbatches == 2);
}

TEST_CASE(
    "pipeline CSV: PyTorch's runtime markers are skipped whatever their numbers; near-misses are refused") {
  // The waits of a compute_comms CSV carry no dependency hetmesh reads: huge numbers size nothing.
  const auto s = pipeline::from_csv("0F0,0WAIT_SEND_F99999999999999999999,0B0,959319657WAIT_REDUCE_GRAD\n");
  CHECK(s.num_microbatches == 1);
  CHECK(s.ranks.at(0).size() == 2);
  // Anything else that only looks like a marker is parsed, and refused with the usual message.
  for (const char* bad :
       {"0F0,0WAIT_SEND_X0", "0F0,0WAIT_SEND_F", "0F0,0RESHARD1", "0F0,WAIT_SEND_F0", "0F0,0WAIT_SEND_F0x"})
    CHECK_THROWS_AS((void)pipeline::from_csv(bad), invalid_argument);
}
