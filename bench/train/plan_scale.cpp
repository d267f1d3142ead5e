// SPDX-License-Identifier: Apache-2.0
// bench_train_plan: the whole step plan of train::system at scale, single-threaded, without a
// communicator (train::plan_system_step: what system::plan calls). One step is planned in the stages
// of design.md's step:
//   data       data::plan_step: the step's global batch from two real sources (ProLong document
//              lengths, the Azure 2023 code trace) mixed 1:1, over the pool's dp ranks
//   balance +  train::plan_step: seq::hdp<selective_offload>{C = 8192} placed by the project's balancer
//   partition  (balance::gap_filling_hdp), lowered to rings and per-rank micro-batches and slots
//   schedule + train::attach_pipeline: the 1F1B schedule of (pp, slots), lowered (SEND/RECV) and
//   verify     checked deadlock-free
// The world is pp x pool ranks (pp = 16; pool = ranks / pp). Times are MEASURED thread CPU time of the
// planning thread (the machine is shared; CPU time is what one core spends), per stage, the median and
// the worst over steps x repeats; the wall time beside them. The headline is 16,384 ranks and 4,000
// sequences (target < 50 ms); the scaling table grows the ranks to 131,072 with the batch growing with
// them (4,000 sequences per 16,384 ranks: the same per-rank load), and also at a fixed 4,000 sequences.
//
//   bench_train_plan [--workloads DIR] [--out FILE] [--repeats N] [--steps N] [--max-ranks N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/data/planner.hpp>
#include <hetmesh/mesh/mesh.hpp>
#include <hetmesh/train/system.hpp>
#include <hetmesh_tools/args.hpp>

#include "../support/json_file.hpp"
#include "../support/workloads.hpp"

using namespace hetmesh;
using json = nlohmann::json;

namespace {

constexpr int kPp = 16;
constexpr std::int64_t kCapacity = 8192;

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? std::string("unknown") : one;
}

/// The data planner's view of the two sources: per source its lengths and, per epoch, the permutation
/// (computed once per epoch and kept).
struct length_sources {
  std::vector<std::vector<std::int64_t>> lengths;
  std::uint64_t seed = 1;
  mutable std::map<std::pair<int, std::int64_t>, std::vector<std::int64_t>> perms;

  [[nodiscard]] std::int64_t source_size(int s) const {
    return static_cast<std::int64_t>(lengths[static_cast<std::size_t>(s)].size());
  }
  [[nodiscard]] std::pair<std::int64_t, seq::sample_meta> lookup(int s, std::int64_t e,
                                                                 std::int64_t p) const {
    auto& perm = perms[{s, e}];
    if (perm.empty())
      perm = permutation(source_size(s),
                         key_hash({seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(e)}));
    const auto idx = perm[static_cast<std::size_t>(p)];
    const auto len = lengths[static_cast<std::size_t>(s)][static_cast<std::size_t>(idx)];
    return {idx, seq::sample_meta{.tokens = len, .item_tokens = {}, .bytes = 2 * len}};
  }
};

struct stage_times {
  std::vector<double> data, place, schedule, total, wall;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
double worst(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

struct run_result {
  stage_times t;
  std::int64_t sequences = 0, tokens = 0, rings = 0, slots = 0, actions = 0;
};

/// Plans `steps` steps of a batch of `batch` samples over `ranks` = kPp x pool ranks, each `repeats`
/// times; returns the per-plan times.
run_result plan_steps(const length_sources& src, int ranks, std::int64_t batch, int steps, int repeats) {
  const int pool = ranks / kPp;
  data::mixture_config cfg;
  cfg.seed = 7;
  cfg.global_batch = batch;
  cfg.sources = {{.name = "prolong", .paths = {"-"}, .weight = {{0, 0.5}}},
                 {.name = "azure_code", .paths = {"-"}, .weight = {{0, 0.5}}}};
  cfg.layout = mesh::make_mesh(mesh::dp(pool));
  data::validate(cfg);
  const seq::hdp<seq::selective_offload> family{.capacity = kCapacity};
  const balance::gap_filling_hdp balancer{};
  const train::pipeline_config<pipeline::one_f_one_b> pipe{.pp = kPp};
  balance::step_model cost;
  cost.pp_stages = kPp;
  run_result out;
  auto state = data::initial_state(cfg);
  for (int step = 0; step < steps; ++step) {
    data::planned_step planned;
    for (int r = 0; r < repeats; ++r) {
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_ms();
      planned = data::plan_step(cfg, state, src);
      std::vector<seq::seq_desc> docs;
      docs.reserve(planned.plan.samples.size());
      for (const auto& s : planned.plan.samples) docs.push_back({s.meta.id, s.meta.tokens});
      const double c1 = thread_cpu_ms();
      auto p = train::plan_step(family, docs, pool, balancer, cost);
      const double c2 = thread_cpu_ms();
      train::attach_pipeline(p, pipe.schedule, pipe.encoders, pipe.pp, nullptr);
      const double c3 = thread_cpu_ms();
      const auto w1 = std::chrono::steady_clock::now();
      out.t.data.push_back(c1 - c0);
      out.t.place.push_back(c2 - c1);
      out.t.schedule.push_back(c3 - c2);
      out.t.total.push_back(c3 - c0);
      out.t.wall.push_back(std::chrono::duration<double, std::milli>(w1 - w0).count());
      if (step == 0 && r == 0) {
        // The entry train::system::plan calls makes the very same plan.
        const auto q = train::plan_system_step(family, balancer, pipe, cost, pool, docs);
        if (q.hash() != p.hash())
          throw_error<invalid_argument>("bench_train_plan: plan_system_step differs from its stages");
        out.sequences = static_cast<std::int64_t>(docs.size());
        for (const auto& d : docs) out.tokens += d.length;
        out.rings = static_cast<std::int64_t>(p.rings.size());
        out.slots = p.slots;
        for (const auto& a : p.pipeline.ranks) out.actions += static_cast<std::int64_t>(a.size());
      }
    }
    state = planned.next;
  }
  return out;
}

json stage_json(const stage_times& t) {
  auto both = [](const std::vector<double>& v) { return json{{"median", median(v)}, {"worst", worst(v)}}; };
  return {{"data_cpu_ms", both(t.data)},
          {"balance_partition_cpu_ms", both(t.place)},
          {"schedule_verify_cpu_ms", both(t.schedule)},
          {"total_cpu_ms", both(t.total)},
          {"total_wall_ms", both(t.wall)}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string given, out_file = "bench/results/train_plan.json";
  int repeats = 7, steps = 3, max_ranks = 131072;
  try {
    if (!tools::parse_command_line(argc, argv, "bench_train_plan",
                                   {{"--workloads", "DIR", "the workload data", &given},
                                    {"--out", "FILE", "the JSON results", &out_file},
                                    {"--repeats", "N", "repeats", &repeats},
                                    {"--steps", "N", "steps", &steps},
                                    {"--max-ranks", "N", "largest world", &max_ranks}}))
      return 2;
    const auto dir = bench::workloads_dir(given, {"prolong_doc_lengths.txt", "azure_2023_code.csv"});
    length_sources src;
    src.lengths = {balance::read_lengths(dir / "prolong_doc_lengths.txt"),
                   bench::read_azure_csv(dir / "azure_2023_code.csv")};
    const std::string load_start = loadavg();
    json j{
        {"benchmark", "bench_train_plan"},
        {"machine",
         "2-core x86_64 VM, no GPU, shared with other engineers' builds; planning single-threaded, timed as "
         "thread CPU time (wall time beside it)"},
        {"kind", "measured"},
        {"workloads_dir", bench::project_relative(dir)},
        {"workload",
         "data::plan_step over two real sources mixed 1:1 (ProLong document lengths; Azure 2023 code "
         "trace, context + generated), global batch = 4,000 samples per 16,384 ranks"},
        {"plan",
         "train::plan_system_step (what train::system::plan calls): seq::hdp<selective_offload>{C = "
         "8192} placed by balance::gap_filling_hdp (step_model with pp_stages = 16), rings and slots, "
         "then the one_f_one_b schedule of (pp = 16, slots), lowered and verified deadlock-free"},
        {"pp", kPp},
        {"steps", steps},
        {"repeats", repeats},
        {"target_ms", 50}};
    fmt::print("{:>8} {:>6} {:>6} | {:>7} {:>8} {:>8} {:>8} {:>8} | {:>8}   (CPU ms, median; worst)\n",
               "ranks", "pool", "seqs", "data", "bal+part", "sched", "total", "worst", "wall");
    auto row = [&](int ranks, std::int64_t batch, int st, int rep) {
      const auto r = plan_steps(src, ranks, batch, st, rep);
      fmt::print("{:>8} {:>6} {:>6} | {:>7.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} | {:>8.2f}\n", ranks,
                 ranks / kPp, r.sequences, median(r.t.data), median(r.t.place), median(r.t.schedule),
                 median(r.t.total), worst(r.t.total), median(r.t.wall));
      std::fflush(stdout);
      json e = stage_json(r.t);
      e["ranks"] = ranks;
      e["pool"] = ranks / kPp;
      e["sequences"] = r.sequences;
      e["tokens"] = r.tokens;
      e["rings"] = r.rings;
      e["slots"] = r.slots;
      e["pipeline_actions"] = r.actions;
      e["plans_timed"] = r.t.total.size();
      return std::pair{e, r};
    };
    // The headline: 16,384 ranks, 4,000 sequences.
    const auto [head, hr] = row(16384, 4000, steps, repeats);
    j["headline"] = head;
    j["plan_ms_median"] = median(hr.t.total);
    j["plan_ms_worst"] = worst(hr.t.total);
    // Scaling: the batch grows with the ranks (the same load per rank), and a fixed batch.
    for (int ranks = 2048; ranks <= max_ranks; ranks *= 2) {
      const std::int64_t batch = 4000LL * ranks / 16384;
      const int st = ranks >= 65536 ? 1 : 2, rep = ranks >= 65536 ? 3 : 5;
      auto [e, r] = row(ranks, batch, st, rep);
      j["scaling"].push_back(e);
      j["scaling_ms"][std::to_string(ranks)] = median(r.t.total);
    }
    fmt::print("fixed batch of 4,000 samples:\n");
    for (int ranks = 16384; ranks <= max_ranks; ranks *= 2) {
      auto [e, r] = row(ranks, 4000, 1, 3);
      j["scaling_fixed_batch"].push_back(e);
    }
    // The other reading of "16,384 ranks at pp = 16": a pool of 16,384 ranks per pipeline rank.
    fmt::print("a pool of 16,384 ranks (world {} ranks):\n", 16384 * kPp);
    {
      auto [e, r] = row(16384 * kPp, 4000, steps, 3);
      j["pool_16384_world_262144"] = e;
    }
    j["load_average_1min_start_end"] = {load_start, loadavg()};
    fmt::print(
        "16,384 ranks x 4,000 sequences, pp = {}: {:.2f} ms median, {:.2f} ms worst (target < 50 ms)\n", kPp,
        j["plan_ms_median"].get<double>(), j["plan_ms_worst"].get<double>());
    bench::write_json(j, out_file);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train_plan: {}\n", e.what());
    return 1;
  }
  return 0;
}
