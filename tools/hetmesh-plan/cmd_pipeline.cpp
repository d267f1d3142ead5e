// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan pipeline / simulate: pipeline schedules by name (the compute actions each rank runs, in
// PyTorch's notation), and the simulated step of a schedule over a workload's variable micro-batches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/core/files.hpp>
#include <hetmesh/cost/activation_memory.hpp>
#include <hetmesh/cost/comm.hpp>
#include <hetmesh/cost/compute.hpp>
#include <hetmesh/mesh/topology.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/io.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/pipeline/trace_json.hpp>
#include <hetmesh/seq/packing.hpp>
#include <hetmesh_tools/schedule_names.hpp>

#include "commands.hpp"
#include "output.hpp"
#include "workload.hpp"

namespace hetmesh_plan {
namespace {

namespace pl = hetmesh::pipeline;

constexpr output_format pipeline_formats[] = {output_format::json, output_format::csv, output_format::ascii,
                                              output_format::table};
constexpr output_format simulate_formats[] = {output_format::json, output_format::table,
                                              output_format::ascii};

// The most compute actions a schedule may hold: each costs ~60 bytes and ~1 us to generate, verify and
// print (measured: 4.2 million in 4.8 s and 250 MiB), so 2^21 actions stay near two seconds; pp 65536 x
// 2^20 micro-batches would be 2 x 10^11 actions (~12 TiB).
constexpr std::int64_t max_actions = std::int64_t{1} << 21;

pl::schedule schedule_of(const parsed& args, int m) {
  const std::string& name = args.choice("schedule", hetmesh::tools::schedule_names);
  const int pp = args.int32("pp", 1, 1 << 16);
  const int v = args.opt_int32("virtual", 1, 1 << 10).value_or(0);
  const int g = args.opt_int32("group-size", 1, 1 << 20).value_or(0);
  // Stated up front: stages x micro-batches x (F, I, W); every factor is at most 2^20 here.
  const std::int64_t per_rank = name.find("interleaved") != std::string::npos ? (v == 0 ? 2 : v)
                                : name == "zbv"                               ? 2
                                                                              : 1;
  const std::int64_t actions = std::int64_t{pp} * per_rank * m * 3;
  if (actions > max_actions)
    usage_fail(
        "pipeline {}: pp {} x {} stage(s) per rank x {} micro-batches needs about {} actions (~{:.1f} GiB); "
        "expected at most {} actions (fewer stages or micro-batches)",
        name, pp, per_rank, m, actions, static_cast<double>(actions) * 60 / (1 << 30), max_actions);
  return hetmesh::tools::make_schedule(name, pp, m, v, g);
}

json schedule_json(const pl::schedule& s, bool lowered) {
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
      if (lowered || pl::is_compute(a.type)) actions.push_back(pl::to_text(a));
    ranks.push_back(std::move(actions));
  }
  doc["ranks"] = std::move(ranks);
  return doc;
}

void run_pipeline(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, pipeline_formats);
  if (args.given("width") && format != output_format::ascii)
    usage_fail("option --width '{}' applies only to --format ascii; expected --format ascii, or no --width",
               args.str("width"));
  const int width = args.int32("width", 10, 10000);
  const bool lowered = args.flag("lowered");
  auto s = schedule_of(args, args.int32("microbatches", 1, 1 << 20));
  // PyTorch's runtime lowering: gradient reduction after each stage's last backward, then SEND/RECV.
  if (lowered) s = pl::add_send_recv(pl::add_reduce_grad(s));
  switch (format) {
    case output_format::json:
      print_json(out, schedule_json(s, lowered));
      break;
    case output_format::csv:
      out << (lowered ? pl::to_compute_comms_csv(s) : pl::to_csv(s));
      break;
    case output_format::table:
      out << pl::format_pipeline_order(s);
      break;
    case output_format::ascii: {
      // Equal costs (F 1, B 2, W 1 of the B) show the schedule's shape; `simulate` prices real work.
      const auto sim = pl::simulate(s, pl::uniform_costs{}.model());
      out << fmt::format("{} pp={} microbatches={}: step {:.6g} units, bubble {:.1f}% (F=1, B=2, I=W=1)\n",
                         s.name, s.num_ranks, s.num_microbatches, sim.step_time, 100.0 * sim.bubble_ratio);
      out << pl::ascii_timeline(sim.timeline, width, true);
      break;
    }
  }
}

// ---- simulate ------------------------------------------------------------------------------------

void run_simulate(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, simulate_formats);
  if (args.given("width") && format != output_format::ascii)
    usage_fail("option --width '{}' applies only to --format ascii; expected --format ascii, or no --width",
               args.str("width"));
  const auto wl = read_workload(args.str("workload"));
  const auto lengths = wl.lengths();
  const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const std::int64_t capacity = args.has("capacity") ? args.integer("capacity", 1, std::int64_t{1} << 40)
                                                     : std::max<std::int64_t>(8192, longest);
  const auto seqs = hetmesh::seq::with_index_ids(lengths);
  const auto packs = hetmesh::seq::pack(seqs, {.capacity = capacity});
  int m = static_cast<int>(packs.micro_batches.size());
  if (args.has("microbatches")) {
    const int want = args.int32("microbatches", 1, 1 << 20);
    if (want > m) {
      usage_fail(
          "--microbatches {}: the workload packs into only {} micro-batches of {} tokens; expected at most "
          "{}",
          want, m, capacity, m);
    }
    m = want;
  }
  const auto s = schedule_of(args, m);

  const auto layers = args.integer("layers", 1, 1 << 16);
  if (layers < s.num_stages)
    usage_fail(
        "option --layers {}: fewer layers than the schedule's {} stages (--pp {} x {} per rank); expected at "
        "least one layer per stage",
        layers, s.num_stages, s.num_ranks, s.num_stages / std::max(1, s.num_ranks));
  const auto hidden = args.integer("hidden", 1, 1 << 20);
  hetmesh::cost::llm_compute llm{hetmesh::cost::bytescale_fig6a_layer(), layers, 3.0};
  if (args.has("tflops"))
    llm = hetmesh::cost::llm_compute::from_dims(hidden, layers, args.real("tflops", 1e-3, 1e6) * 1e9);
  hetmesh::mesh::topology cluster;
  cluster.inter_bw_gbps = args.real("link-gbps", 1e-3, 1e6);
  cluster.validate();
  const auto link = cluster.inter();  // stages sit on different nodes
  const auto tp = args.integer("tp", 1, 1 << 12);
  // Tensor parallelism splits a stage's compute and (with sequence parallelism) its activations evenly.
  const double stages = static_cast<double>(s.num_stages) * static_cast<double>(tp);
  const auto act =
      hetmesh::cost::activation_memory::from_dims(hidden, (layers + s.num_stages - 1) / s.num_stages, tp);
  std::vector<std::vector<std::int64_t>> docs(static_cast<std::size_t>(m));
  std::vector<std::int64_t> mb_tokens;
  for (int k = 0; k < m; ++k) {
    const auto& mb = packs.micro_batches[static_cast<std::size_t>(k)];
    for (const auto& d : mb.docs) docs[static_cast<std::size_t>(k)].push_back(d.length);
    mb_tokens.push_back(mb.tokens());
  }
  const auto costs = pl::micro_batch_costs::priced(docs, llm, stages, link, hidden, act);
  const auto sim = pl::simulate(s, costs.model());
  // The same schedule with every micro-batch at the mean cost: what variable lengths add on top.
  pl::micro_batch_costs mean = costs;
  for (auto* v : {&mean.forward_s, &mean.transfer_s}) {
    const double avg = std::accumulate(v->begin(), v->end(), 0.0) / static_cast<double>(v->size());
    std::fill(v->begin(), v->end(), avg);
  }
  const auto uniform = pl::simulate(s, mean.model(), false);
  for (const double v : {sim.step_time, sim.bubble_ratio, uniform.step_time, uniform.bubble_ratio})
    if (!std::isfinite(v) || v < 0)
      hetmesh::throw_error<hetmesh::invalid_argument>(
          "simulate: the modelled step is {} (bubble {}); expected a finite time: the inputs (--tflops, "
          "--link-gbps, the workload's lengths) are outside the model's range",
          sim.step_time, sim.bubble_ratio);

  if (args.has("trace")) {
    // Temporary, fsync, rename (core/files.hpp): a folder or /dev/full as the target, a read-only folder
    // or a full disk exits 2 naming the path, and an earlier trace of that name stays whole.
    hetmesh::write_file_atomic(
        args.str("trace"),
        pl::chrome_trace(sim.timeline, fmt::format("hetmesh-plan simulate {} pp={}", s.name, s.num_ranks))
            .dump(),
        "--trace");
  }

  json doc;
  doc["schedule"] = s.name;
  doc["pp"] = s.num_ranks;
  doc["stages"] = s.num_stages;
  doc["microbatches"] = m;
  doc["workload"] = wl.path;
  doc["capacity"] = capacity;
  doc["model"] = hetmesh::to_string(llm);
  doc["step_time_model_s"] = sim.step_time;
  doc["bubble_ratio"] = sim.bubble_ratio;
  doc["uniform_step_time_model_s"] = uniform.step_time;
  doc["uniform_bubble_ratio"] = uniform.bubble_ratio;
  doc["microbatch_tokens"] = mb_tokens;
  json ranks = json::array();
  table t{{"rank", "busy (s, model)", "idle", "peak activations (model)"}, {}};
  for (std::size_t r = 0; r < sim.busy.size(); ++r) {
    const double idle = sim.step_time > 0 ? 1.0 - sim.busy[r] / sim.step_time : 0.0;
    const auto peak = r < sim.peak_memory.size() ? sim.peak_memory[r] : 0;
    ranks.push_back({{"rank", r}, {"busy_model_s", sim.busy[r]}, {"peak_activation_bytes", peak}});
    t.rows.push_back({std::to_string(r), fixed_str(sim.busy[r], 3), fmt::format("{:.1f}%", 100.0 * idle),
                      bytes_str(static_cast<double>(peak))});
  }
  doc["per_rank"] = std::move(ranks);
  if (args.has("trace")) doc["trace"] = args.str("trace");
  const std::string summary = fmt::format(
      "{} pp={} stages={}: {} micro-batches of <= {} tokens from {}\n"
      "step {:.3f} s, bubble {:.1f}% (modelled); at equal micro-batch costs {:.3f} s, bubble {:.1f}%\n",
      s.name, s.num_ranks, s.num_stages, m, capacity, wl.path, sim.step_time, 100.0 * sim.bubble_ratio,
      uniform.step_time, 100.0 * uniform.bubble_ratio);
  require_finite(doc);
  if (format == output_format::json) {
    print_json(out, doc);
  } else if (format == output_format::table) {
    out << summary << '\n';
    t.print(out);
  } else {
    out << summary;
    out << pl::ascii_timeline(sim.timeline, args.int32("width", 10, 10000), true);
  }
}

const char* const schedule_help =
    "gpipe, 1f1b, interleaved-1f1b, looped-bfs, zero-bubble, interleaved-zero-bubble, zbv or dualpipev";

}  // namespace

std::vector<subcommand> pipeline_commands() {
  command_spec pipeline("pipeline",
                        "A pipeline schedule: the compute actions each rank runs, in PyTorch's notation.");
  pipeline.required("schedule", "NAME", schedule_help)
      .required("pp", "P", "pipeline-parallel degree (ranks)")
      .required("microbatches", "M", "micro-batches per step")
      .option("virtual", "V", "stages per rank for the interleaved schedules and looped-bfs (default 2)")
      .option("group-size", "G",
              "micro-batch group size of the interleaved schedules (default: PyTorch's rule; for "
              "interleaved-1f1b a size picks Megatron-LM's rule)")
      .flag("lowered",
            "with REDUCE_GRAD and SEND/RECV actions (PyTorch's lowering); csv is then the compute_comms "
            "CSV PyTorch's runtime loads, with its WAIT_SEND_F/B and WAIT_REDUCE_GRAD")
      .option("format", "FMT", "json, csv (PyTorch's CSV), ascii (timeline) or table (PyTorch's step grid)",
              "json")
      .option("width", "N", "ascii: columns of the timeline", "100")
      .epilog(
          "Actions are <stage><F|B|I|W><microbatch> with global stage numbers as PyTorch numbers them:\n"
          "F forward, B full backward, I backward for inputs, W backward for weights.\n"
          "interleaved-1f1b follows PyTorch's ScheduleInterleaved1F1B (micro-batches in rounds of\n"
          "M / max(1, M / pp)); --group-size G gives Megatron-LM's interleaved schedule for that group "
          "size.\n"
          "dualpipev overlaps a forward and a full backward in one action, (0F3;3B1)OVERLAP_F_B.\n\n"
          "output (json):\n"
          "  {\"schedule\": \"1f1b\", \"pp\": 2, \"microbatches\": 3, \"stages\": 2, \"virtual\": 1,\n"
          "   \"stage_to_rank\": [0, 1],\n"
          "   \"ranks\": [[\"0F0\", \"0F1\", \"0B0\", \"0F2\", \"0B1\", \"0B2\"], [\"1F0\", \"1B0\", "
          "...]]}\n\n"
          "example:\n"
          "  hetmesh-plan pipeline --schedule interleaved-1f1b --pp 4 --microbatches 8 --virtual 2 --format "
          "csv\n");
  command_spec simulate(
      "simulate",
      "Simulate a pipeline schedule over a workload's variable-length micro-batches (Perfetto trace).");
  simulate.required("schedule", "NAME", schedule_help)
      .required("pp", "P", "pipeline-parallel degree (ranks)")
      .required("workload", "FILE", "one sample length per line, or JSONL (see 'compare --help')")
      .option("capacity", "C",
              "tokens per micro-batch; samples are packed best-fit decreasing (default: the longest sample, "
              "at least 8192)")
      .option("microbatches", "M", "simulate only the first M micro-batches (default: all)")
      .option("virtual", "V", "stages per rank for the interleaved schedules and looped-bfs (default 2)")
      .option("group-size", "G",
              "micro-batch group size of the interleaved schedules (interleaved-1f1b: Megatron-LM's rule)")
      .option("layers", "L", "transformer layers of the whole model, split evenly over the stages", "32")
      .option("hidden", "H", "hidden size: activation and transfer sizes", "4096")
      .option("tp", "N", "tensor-parallel degree of each stage (divides compute and activations)", "1")
      .option("tflops", "T",
              "price layers from FLOPs at T TFLOP/s (default: ByteScale Fig. 6(a)'s 7B-class fit)")
      .option("link-gbps", "B", "bandwidth of the link between pipeline stages (inter-node), GB/s",
              fmt::format("{}", hetmesh::mesh::topology{}.inter_bw_gbps))
      .option("trace", "FILE", "write the simulated timeline as Chrome trace JSON (open in ui.perfetto.dev)")
      .option("width", "N", "ascii: columns of the timeline", "100")
      .option("format", "FMT", "json, table or ascii", "json")
      .epilog(
          "Samples are packed into micro-batches of at most C tokens; micro-batch k costs its packed row\n"
          "(attention per document, quadratic; the rest linear) on each stage: F one forward, B two, I and\n"
          "W one each. Times are modelled. uniform_step_time_model_s is the same schedule with every\n"
          "micro-batch at the mean cost: the difference is what variable lengths cost.\n\n"
          "output (json):\n"
          "  {\"schedule\": \"1f1b\", \"pp\": 4, \"stages\": 4, \"microbatches\": 96, \"workload\": "
          "\"w.txt\",\n"
          "   \"capacity\": 65536, \"model\": \"...\", \"step_time_model_s\": 12.3, \"bubble_ratio\": 0.08,\n"
          "   \"uniform_step_time_model_s\": 11.9, \"uniform_bubble_ratio\": 0.05, \"microbatch_tokens\": "
          "[...],\n"
          "   \"per_rank\": [{\"rank\": 0, \"busy_model_s\": 11.2, \"peak_activation_bytes\": 1234}, ...],\n"
          "   \"trace\": \"out.json\"}\n\n"
          "example:\n"
          "  hetmesh-plan simulate --schedule 1f1b --pp 4 --workload examples/data/prolong_sample.txt "
          "--trace step.json --format ascii\n");
  std::vector<subcommand> out;
  out.push_back({std::move(pipeline), run_pipeline});
  out.push_back({std::move(simulate), run_simulate});
  return out;
}

}  // namespace hetmesh_plan
