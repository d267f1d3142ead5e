// SPDX-License-Identifier: Apache-2.0
// Pipeline schedules as data: build an interleaved 1F1B schedule, verify it, weave an encoder into its
// bubbles (MegaScale-Omni's joint pipeline), compare simulated step times with the encoder on the first
// stage, and write a Perfetto trace. Usage: example_pipeline [trace.json]
#include <fstream>
#include <string>

#include <fmt/format.h>

#include <hetmesh/pipeline/pipeline.hpp>
#include <hetmesh/pipeline/trace_json.hpp>
#include <hetmesh_tools/args.hpp>

namespace hp = hetmesh::pipeline;

int main(int argc, char** argv) {
  std::string trace;  // where the Perfetto trace goes; none when empty
  if (!hetmesh::tools::parse_command_line(argc, argv, "example_pipeline",
                                          {{"TRACE.json", "", "the Perfetto trace", &trace}},
                                          "usage: example_pipeline [trace.json]"))
    return 2;
  const hp::schedule llm = hp::interleaved_1f1b{.virtual_stages = 2}.generate(/*pp=*/4, /*microbatches=*/8);
  fmt::print("{}\n\n{}\n", llm, hp::verify(hp::add_send_recv(llm)));

  const auto costs = hp::uniform_costs{.forward = 0.5, .backward = 1.0}.model();
  // Micro-batches with more images cost the encoder more: variable encoder work per micro-batch.
  hp::encoder_work enc{.forward = [](int mb) { return 0.5 + 0.25 * (mb % 3); },
                       .backward = [](int mb) { return 1.0 + 0.5 * (mb % 3); }};
  // Encoder placements are types (hp::encoder_placement): one generic body per placement.
  const auto place = [&](const auto& policy, bool write_trace) {
    const hp::schedule s = hp::add_encoder(llm, policy, costs, enc);
    (void)hp::verify(hp::add_send_recv(s));
    const auto sim = hp::simulate(s, hp::with_encoder(costs, enc, s.num_encoder_shards()));
    fmt::print("\n{}: {}\n{}", policy, sim, hp::ascii_timeline(sim.timeline, 96));
    if (write_trace) std::ofstream(trace) << hp::chrome_trace(sim.timeline).dump(1) << "\n";
  };
  place(hp::colocated_encoder{}, !trace.empty());
  place(hp::encoder_on_first_stage{}, false);
  return 0;
}
