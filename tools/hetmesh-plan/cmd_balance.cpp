// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan compare / balance: the balance strategies of balance/strategies.hpp on one workload.
// compare sets all of them side by side (modelled step time, imbalance, ratio to the lower bound,
// modelled ring traffic, measured planning time); balance prints one strategy's full per-rank plan.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/balance/strategies.hpp>
#include <hetmesh/mesh/topology.hpp>
#include <hetmesh_tools/balancer_names.hpp>

#include "commands.hpp"
#include "output.hpp"
#include "workload.hpp"

namespace hetmesh_plan {
namespace {

namespace bal = hetmesh::balance;
namespace sq = hetmesh::seq;

constexpr output_format compare_formats[] = {output_format::json, output_format::table, output_format::csv};
constexpr output_format balance_formats[] = {output_format::json, output_format::table};

// ---- configuration shared by compare and balance -------------------------------------------------

void add_model_options(command_spec& spec) {
  spec.required("workload", "FILE",
                "one sample length per line, or JSONL {\"id\",\"text\",\"images\",\"audio\"}")
      .required("ranks", "N", "ranks in the data-parallel pool (dp x cp positions)")
      .required("capacity", "C", "tokens of activations one rank holds per micro-batch (ByteScale's C)")
      .option("layers", "L", "transformer layers of the whole model", "32")
      .option("hidden", "H",
              "hidden size; prices layers from FLOPs (default: ByteScale Fig. 6(a)'s 7B-class fit)")
      .option("tflops", "T", "with --hidden: achieved TFLOP/s per rank", "400")
      .option("kv-ratio", "R", "with --hidden: KV heads / heads (GQA)", "0.125")
      .option("pp", "P", "pipeline stages behind every pool rank", "1")
      .option("devices-per-node", "N", "ranks per node (rings beyond a node use the inter-node link)",
              fmt::format("{}", hetmesh::mesh::topology{}.devices_per_node))
      .option("intra-gbps", "B", "intra-node link bandwidth, GB/s",
              fmt::format("{}", hetmesh::mesh::topology{}.intra_bw_gbps))
      .option("inter-gbps", "B", "inter-node link bandwidth, GB/s",
              fmt::format("{}", hetmesh::mesh::topology{}.inter_bw_gbps))
      .flag("offload",
            "let long sequences use ByteScale's selective activation offloading (fewer ring ranks)")
      .option("context", "S",
              "static_dp_cp: the context length its cp is sized for (default: the longest sample)")
      .option("group-size", "G",
              "gap_filling_hdp: ranks per locality group for grouped reordering (default: one group)")
      .option("seed", "N", "seed of the random strategy", "1");
}

struct setup {
  workload wl;
  std::vector<sq::seq_desc> seqs;
  bal::strategy_config cfg;
  hetmesh::tools::balancer_options options;  // each balancer's own parameters
};

// The most ranks balance/compare plan for: per-rank plans and schedules grow with it.
constexpr int max_plan_ranks = 1 << 17;

setup setup_of(const parsed& args) {
  setup s;
  s.wl = read_workload(args.str("workload"));
  const auto lengths = s.wl.lengths();
  s.seqs = sq::with_index_ids(lengths);
  auto& cfg = s.cfg;
  // 2^17 ranks plan in about a second and 150 MB; 2^24 took minutes and ended in bad_alloc (issue 37).
  cfg.ranks = args.int32("ranks", 1, max_plan_ranks);
  cfg.hdp.capacity = args.integer("capacity", 1, std::int64_t{1} << 40);
  cfg.hdp.offload.enabled = args.flag("offload");
  const auto layers = args.integer("layers", 1, 1 << 16);
  args.needs("kv-ratio", "hidden", "the KV size is a fraction of the hidden size");
  args.needs("tflops", "hidden", "FLOPs are counted from the hidden size");
  if (args.has("hidden")) {
    const auto hidden = args.integer("hidden", 1, 1 << 20);
    const double kv_ratio = args.real("kv-ratio", 1e-6, 1.0);
    // Model units are milliseconds: T TFLOP/s = T * 1e9 FLOPs per ms.
    cfg.model.llm =
        hetmesh::cost::llm_compute::from_dims(hidden, layers, args.real("tflops", 1e-3, 1e6) * 1e9, kv_ratio);
    // K and V, bf16, kv_ratio of the hidden size each.
    cfg.model.kv_bytes_per_token = 2.0 * 2.0 * static_cast<double>(hidden) * kv_ratio;
  } else {
    cfg.model.llm.layers = layers;
  }
  cfg.model.pp_stages = args.int32("pp", 1, 1 << 12);
  if (layers < cfg.model.pp_stages)
    usage_fail("option --layers {}: fewer layers than --pp {} stages; expected at least one layer per stage",
               layers, cfg.model.pp_stages);
  cfg.model.net.devices_per_node = args.int32("devices-per-node", 1, 1 << 20);
  cfg.model.net.intra_bw_gbps = args.real("intra-gbps", 1e-3, 1e6);
  cfg.model.net.inter_bw_gbps = args.real("inter-gbps", 1e-3, 1e6);
  cfg.model.net.nodes = (cfg.ranks + cfg.model.net.devices_per_node - 1) / cfg.model.net.devices_per_node;
  cfg.model.net.validate();
  if (args.has("context")) {
    s.options.context = args.integer("context", 1, std::int64_t{1} << 40);
    // static_dp_cp sizes cp for max(context, longest): a shorter --context would be ignored.
    const auto longest = std::max_element(lengths.begin(), lengths.end());
    if (s.options.context < *longest)
      usage_fail(
          "option --context {}: shorter than the longest sample ({} tokens, sample {} of '{}'); expected "
          "--context >= {}",
          s.options.context, *longest, s.wl.samples[static_cast<std::size_t>(longest - lengths.begin())].id,
          s.wl.path, *longest);
  }
  if (args.has("group-size")) s.options.group_size = args.int32("group-size", 1, cfg.ranks);
  s.options.seed = static_cast<std::uint64_t>(args.integer("seed", 0));
  return s;
}

json config_json(const setup& s) {
  const auto& c = s.cfg;
  std::int64_t items = 0;
  const auto lengths = s.wl.lengths();
  for (const auto& smp : s.wl.samples)
    items += static_cast<std::int64_t>(smp.images.size() + smp.audio.size());
  return {{"samples", s.wl.samples.size()},
          {"tokens", s.wl.total_tokens()},
          {"longest", *std::max_element(lengths.begin(), lengths.end())},
          {"encoder_items", items},
          {"capacity", c.hdp.capacity},
          {"offload", c.hdp.offload.enabled},
          {"model", hetmesh::to_string(c.model.llm)},
          {"kv_bytes_per_token", c.model.kv_bytes_per_token},
          {"pp", c.model.pp_stages},
          {"devices_per_node", c.model.net.devices_per_node}};
}

std::vector<std::string_view> strategies_of(const parsed& args) {
  std::vector<std::string_view> out;
  if (!args.has("strategies"))
    return {hetmesh::tools::strategy_names.begin(), hetmesh::tools::strategy_names.end()};
  for (const auto name : split_commas(args.str("strategies"))) {
    const auto it =
        std::find(hetmesh::tools::strategy_names.begin(), hetmesh::tools::strategy_names.end(), name);
    if (it == hetmesh::tools::strategy_names.end()) {
      usage_fail("--strategies: unknown strategy '{}'; expected names from: {}", name,
                 fmt::join(hetmesh::tools::strategy_names, ", "));
    }
    out.push_back(*it);
  }
  return out;
}

// An option of one strategy, given while that strategy is not run, would be ignored: refuse it.
void check_strategy_options(const parsed& args, std::span<const std::string_view> names) {
  const struct {
    const char* option;
    std::string_view strategy;
  } owned[] = {{"context", "static_dp_cp"}, {"group-size", "gap_filling_hdp"}, {"seed", "random"}};
  for (const auto& o : owned) {
    if (!args.given(o.option) || std::find(names.begin(), names.end(), o.strategy) != names.end()) continue;
    usage_fail(
        "option --{} '{}' applies only to strategy {}, which this command does not run; expected {} "
        "among the strategies, or no --{}",
        o.option, args.str(o.option), o.strategy, o.strategy, o.option);
  }
}

// ---- compare ---------------------------------------------------------------------------------------

void run_compare(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, compare_formats);
  const auto names = strategies_of(args);
  const int repeat = args.int32("repeat", 1, 1000);
  check_strategy_options(args, names);
  const setup s = setup_of(args);
  json doc;
  doc["workload"] = s.wl.path;
  doc["ranks"] = s.cfg.ranks;
  doc["config"] = config_json(s);
  json rows = json::array();
  table t{{"strategy", "step (s, model)", "imbalance", "vs lower bound", "ring traffic (model)", "plan (ms)"},
          {}};
  double lower_bound_s = 0.0;
  for (const auto name : names) {
    // plan_ms is the median of `repeat` runs: one run on a busy machine is mostly noise.
    std::vector<double> times;
    bal::strategy_result r;
    for (int k = 0; k < repeat; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      r = hetmesh::tools::run_strategy(name, s.seqs, s.cfg, s.options);
      const auto t1 = std::chrono::steady_clock::now();
      times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double plan_ms = times[times.size() / 2];
    const double bytes = r.comm_bytes;
    const double step_s = r.step.units() / 1000.0;  // model units are milliseconds
    lower_bound_s = r.lower_bound.units() / 1000.0;
    rows.push_back({{"name", r.name},
                    {"step_time_model_s", step_s},
                    {"imbalance", r.imbalance},
                    {"vs_lower_bound", r.ratio_to_lower_bound},
                    {"comm_bytes", bytes},
                    {"plan_ms", plan_ms},
                    {"micro_batches", r.tasks},
                    {"max_micro_batches_per_rank", r.max_tasks_per_rank}});
    t.rows.push_back({r.name, fixed_str(step_s, 3), fixed_str(r.imbalance, 3),
                      fixed_str(r.ratio_to_lower_bound, 3), bytes_str(bytes), fixed_str(plan_ms, 2)});
  }
  doc["lower_bound_model_s"] = lower_bound_s;
  doc["strategies"] = std::move(rows);
  require_finite(doc);
  if (format == output_format::json) {
    print_json(out, doc);
  } else if (format == output_format::csv) {
    table c{{"name", "step_time_model_s", "imbalance", "vs_lower_bound", "comm_bytes", "plan_ms"}, {}};
    for (const auto& r : doc["strategies"]) {
      c.rows.push_back({r["name"].get<std::string>(), fmt::format("{}", r["step_time_model_s"].get<double>()),
                        fmt::format("{}", r["imbalance"].get<double>()),
                        fmt::format("{}", r["vs_lower_bound"].get<double>()),
                        fmt::format("{:.0f}", r["comm_bytes"].get<double>()),
                        fmt::format("{}", r["plan_ms"].get<double>())});
    }
    c.print_csv(out);
  } else {
    out << fmt::format("{}: {} samples, {} tokens (longest {}) over {} ranks, capacity {} tokens/rank{}\n",
                       s.wl.path, s.wl.samples.size(), s.wl.total_tokens(),
                       doc["config"]["longest"].get<std::int64_t>(), s.cfg.ranks, s.cfg.hdp.capacity,
                       s.cfg.model.pp_stages > 1 ? fmt::format(", pp {}", s.cfg.model.pp_stages) : "");
    out << fmt::format(
        "lower bound {:.3f} s (modelled); step times and traffic are modelled, plan time is measured\n\n",
        lower_bound_s);
    t.print(out);
  }
}

// ---- balance ---------------------------------------------------------------------------------------

void run_balance(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, balance_formats);
  const std::string& name = args.str("strategy");
  if (std::find(hetmesh::tools::strategy_names.begin(), hetmesh::tools::strategy_names.end(), name) ==
      hetmesh::tools::strategy_names.end()) {
    usage_fail("--strategy = '{}'; expected one of: {}", name,
               fmt::join(hetmesh::tools::strategy_names, ", "));
  }
  const std::string_view run[] = {name};
  check_strategy_options(args, run);
  const setup s = setup_of(args);
  const bal::strategy_plan v = hetmesh::tools::plan_strategy(name, s.seqs, s.cfg, s.options);
  const auto tl = bal::simulate(s.cfg.ranks, v.tasks, s.cfg.model.pp_stages);
  const auto lb = bal::step_lower_bound(s.seqs, s.cfg);

  // Per rank, its micro-batches in execution order (order key, then item), as every planner here
  // runs them; ring position p holds zigzag chunks p and 2D-1-p of each sequence.
  std::vector<std::vector<std::pair<std::int64_t, std::size_t>>> on(static_cast<std::size_t>(s.cfg.ranks));
  for (std::size_t i = 0; i < v.items.size(); ++i)
    for (const int r : v.items[i].ring) on.at(static_cast<std::size_t>(r)).push_back({v.items[i].order, i});
  json items = json::array();
  for (std::size_t i = 0; i < v.items.size(); ++i) {
    const auto& it = v.items[i];
    json ids = json::array();
    for (const auto& q : it.seqs) ids.push_back(q.id);
    items.push_back({{"item", i},
                     {"order", it.order},
                     {"ring", it.ring},
                     {"tokens", it.tokens()},
                     {"offload_ratio", it.offload_ratio},
                     {"time_model_ms", v.tasks[i].duration.units()},
                     {"sequences", std::move(ids)}});
  }
  json ranks = json::array();
  table t{{"rank", "micro-batches", "rings", "tokens", "busy (ms, model)", "finish (ms, model)"}, {}};
  for (std::size_t r = 0; r < on.size(); ++r) {
    auto& list = on[r];
    std::sort(list.begin(), list.end());
    json mbs = json::array();
    std::int64_t tokens = 0;
    int rings = 0;
    for (const auto& [order, i] : list) {
      const auto& it = v.items[i];
      const int degree = static_cast<int>(it.ring.size());
      const int pos =
          static_cast<int>(std::find(it.ring.begin(), it.ring.end(), static_cast<int>(r)) - it.ring.begin());
      json segs = json::array();
      std::int64_t held = 0;
      for (const auto& q : it.seqs) {
        for (const auto& range : sq::hdp_ranges(q.length, degree, pos)) {
          if (range.size() <= 0) continue;
          segs.push_back({{"seq", q.id}, {"begin", range.begin}, {"end", range.end}});
          held += range.size();
        }
      }
      tokens += held;
      if (degree > 1) ++rings;
      mbs.push_back({{"item", i},
                     {"order", order},
                     {"degree", degree},
                     {"ring_position", pos},
                     {"tokens", held},
                     {"segments", std::move(segs)}});
    }
    const double busy = tl.busy[r].units(), finish = tl.finish[r].units();
    ranks.push_back({{"rank", r},
                     {"busy_model_ms", busy},
                     {"finish_model_ms", finish},
                     {"tokens", tokens},
                     {"micro_batches", std::move(mbs)}});
    t.rows.push_back({std::to_string(r), std::to_string(list.size()), std::to_string(rings),
                      std::to_string(tokens), fixed_str(busy, 1), fixed_str(finish, 1)});
  }
  json doc;
  doc["strategy"] = name;
  doc["workload"] = s.wl.path;
  doc["ranks"] = s.cfg.ranks;
  doc["config"] = config_json(s);
  doc["step_time_model_s"] = tl.step.units() / 1000.0;
  doc["imbalance"] = tl.imbalance();
  doc["lower_bound_model_s"] = lb.units() / 1000.0;
  doc["vs_lower_bound"] = lb.ticks > 0 ? tl.step.units() / lb.units() : 0.0;
  doc["comm_bytes"] = bal::ring_comm_bytes(v, s.cfg.model);
  doc["items"] = std::move(items);
  doc["per_rank"] = std::move(ranks);
  require_finite(doc);
  if (format == output_format::json) {
    print_json(out, doc);
  } else {
    out << fmt::format(
        "{} on {}: step {:.3f} s (modelled), imbalance {:.3f}, {:.3f}x the lower bound, {} items\n\n", name,
        s.wl.path, doc["step_time_model_s"].get<double>(), tl.imbalance(),
        doc["vs_lower_bound"].get<double>(), v.items.size());
    t.print(out);
  }
}

const char* const workload_help =
    "Workload FILE: one sample length (tokens) per line, or one JSON object per line:\n"
    "  {\"id\": \"a7\", \"text\": 900, \"images\": [576, 576], \"audio\": [750]}\n"
    "where every count is in LLM tokens; a sample's LLM length is text + its items. Blank lines and\n"
    "lines starting with '#' are skipped. Encoder items add their LLM tokens to the sample; their\n"
    "encoder compute is not priced here. Step times, imbalance and traffic are modelled (the cost\n"
    "models of include/hetmesh/cost and the balance simulator); plan_ms is measured on this machine.\n";

}  // namespace

std::vector<subcommand> balance_commands() {
  command_spec compare("compare",
                       "Balance strategies side by side on one workload: modelled step time and balance.");
  add_model_options(compare);
  compare
      .option("strategies", "A,B,...",
              "strategies to run (default: random,token_count,static_dp_cp,bytescale_hdp,gap_filling_hdp)")
      .option("repeat", "N", "plan each strategy N times; plan_ms is the median", "5")
      .option("format", "FMT", "json, table or csv", "json")
      .epilog(std::string(workload_help) +
              "\noutput (json):\n"
              "  {\"workload\": \"w.txt\", \"ranks\": 64, \"config\": {...}, \"lower_bound_model_s\": 1.9,\n"
              "   \"strategies\": [{\"name\": \"random\", \"step_time_model_s\": 3.1, \"imbalance\": 1.52,\n"
              "                   \"vs_lower_bound\": 1.63, \"comm_bytes\": 1.2e10, \"plan_ms\": 1.4, ...}, "
              "...]}\n"
              "  imbalance: max / mean modelled rank time; vs_lower_bound: modelled step time over\n"
              "  max(total work / ranks, largest unsplit sample); comm_bytes: modelled ring-attention\n"
              "  traffic of the step (bytes, all ranks); plan_ms: measured time to plan and price.\n\n"
              "example:\n"
              "  hetmesh-plan compare --workload examples/data/prolong_sample.txt --ranks 64 --capacity "
              "16384 --format table\n");
  command_spec balance(
      "balance", "One balance strategy's full plan: per rank, its micro-batches, rings and token ranges.");
  balance.option("strategy", "NAME", "random, token_count, static_dp_cp, bytescale_hdp or gap_filling_hdp",
                 "gap_filling_hdp");
  add_model_options(balance);
  balance.option("format", "FMT", "json or table", "json")
      .epilog(
          std::string(workload_help) +
          "\noutput (json):\n"
          "  {\"strategy\": \"gap_filling_hdp\", \"ranks\": 4, \"step_time_model_s\": .., \"imbalance\": "
          "..,\n"
          "   \"vs_lower_bound\": .., \"comm_bytes\": .., \"items\": [{\"item\": 0, \"order\": 0, \"ring\": "
          "[0, 1],\n"
          "   \"tokens\": 9000, \"offload_ratio\": 0, \"time_model_ms\": .., \"sequences\": [3]}, ...],\n"
          "   \"per_rank\": [{\"rank\": 0, \"busy_model_ms\": .., \"finish_model_ms\": .., \"tokens\": ..,\n"
          "     \"micro_batches\": [{\"item\": 0, \"order\": 0, \"degree\": 2, \"ring_position\": 0, "
          "\"tokens\": 4500,\n"
          "       \"segments\": [{\"seq\": 3, \"begin\": 0, \"end\": 2250}, {\"seq\": 3, \"begin\": 6750, "
          "\"end\": 9000}]}]}]}\n"
          "  seq: the sample's 0-based position in the workload file; begin/end: its token range.\n\n"
          "example:\n"
          "  hetmesh-plan balance --strategy bytescale_hdp --workload examples/data/prolong_sample.txt "
          "--ranks 64 --capacity 16384 --format table\n");
  std::vector<subcommand> out;
  out.push_back({std::move(compare), run_compare});
  out.push_back({std::move(balance), run_balance});
  return out;
}

}  // namespace hetmesh_plan
