// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan pipeline / simulate: pipeline schedules by name (the compute actions each rank runs, in
// PyTorch's notation), and the simulated step of a schedule over a workload's variable micro-batches.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/io.hpp>

#include "commands.hpp"
#include "output.hpp"

namespace hetmesh_plan {
namespace {

namespace pl = hetmesh::pipeline;

constexpr output_format pipeline_formats[] = {output_format::json, output_format::csv, output_format::ascii,
                                              output_format::table};
constexpr std::string_view schedule_names[] = {"gpipe",       "1f1b", "interleaved-1f1b", "zero-bubble",
                                               "interleaved-zero-bubble", "zbv"};

pl::schedule schedule_of(const parsed& args) {
  const std::string& name = args.choice("schedule", schedule_names);
  const int pp = args.int32("pp", 1, 1 << 16);
  const int m = args.int32("microbatches", 1, 1 << 20);
  const int v = args.opt_int32("virtual", 1, 1 << 10).value_or(0);
  const int g = args.opt_int32("group-size", 1, 1 << 20).value_or(0);
  return pl::make_schedule(name, pp, m, v, g);
}

json schedule_json(const pl::schedule& s) {
  json doc;
  doc["schedule"] = s.name;
  doc["pp"] = s.num_ranks;
  doc["microbatches"] = s.num_microbatches;
  doc["stages"] = s.num_stages;
  doc["virtual"] = s.num_ranks > 0 ? s.num_stages / s.num_ranks : 0;
  doc["stage_to_rank"] = s.stage_to_rank;
  json ranks = json::array();
  for (const auto& row : s.ranks) {
    json actions = json::array();
    for (const auto& a : row)
      if (pl::is_compute(a.type)) actions.push_back(pl::to_text(a));
    ranks.push_back(std::move(actions));
  }
  doc["ranks"] = std::move(ranks);
  return doc;
}

void run_pipeline(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, pipeline_formats);
  const auto s = schedule_of(args);
  switch (format) {
    case output_format::json: print_json(out, schedule_json(s)); break;
    case output_format::csv: out << pl::to_csv(s); break;
    case output_format::table: out << pl::format_pipeline_order(s); break;
    case output_format::ascii: out << pl::format_pipeline_order(s); break;
  }
}

const char* const schedule_help =
    "gpipe, 1f1b, interleaved-1f1b, zero-bubble, interleaved-zero-bubble or zbv";

}  // namespace

std::vector<subcommand> pipeline_commands() {
  command_spec pipeline("pipeline", "A pipeline schedule: the compute actions each rank runs, in PyTorch's notation.");
  pipeline.required("schedule", "NAME", schedule_help)
      .required("pp", "P", "pipeline-parallel degree (ranks)")
      .required("microbatches", "M", "micro-batches per step")
      .option("virtual", "V", "stages per rank for the interleaved schedules (default 2)")
      .option("group-size", "G", "micro-batch group size of the interleaved schedules (default: the rule's)")
      .option("format", "FMT", "json, csv (PyTorch's CSV), ascii (timeline) or table (PyTorch's step grid)", "json")
      .epilog(
          "Actions are <stage><F|B|I|W><microbatch> with global stage numbers as PyTorch numbers them:\n"
          "F forward, B full backward, I backward for inputs, W backward for weights.\n\n"
          "output (json):\n"
          "  {\"schedule\": \"1f1b\", \"pp\": 2, \"microbatches\": 3, \"stages\": 2, \"virtual\": 1,\n"
          "   \"stage_to_rank\": [0, 1],\n"
          "   \"ranks\": [[\"0F0\", \"0F1\", \"0B0\", \"0F2\", \"0B1\", \"0B2\"], [\"1F0\", \"1B0\", ...]]}\n\n"
          "example:\n"
          "  hetmesh-plan pipeline --schedule interleaved-1f1b --pp 4 --microbatches 8 --virtual 2 --format csv\n");
  return {{std::move(pipeline), run_pipeline}};
}

}  // namespace hetmesh_plan
