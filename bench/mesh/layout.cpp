// SPDX-License-Identifier: Apache-2.0
// Layout search, side by side. Modelled: per-step communication time of the searched order (ours),
// Megatron-LM's default order (baseline) and an unattainable lower bound (every dim's traffic at
// intra-node bandwidth), for dense, long-context and MoE traffic on 8-GPU nodes. Measured on this
// machine: the time the search itself takes, and group enumeration (groups(dp)) against a bare
// arithmetic loop producing the same ranks (lower bound). Writes JSON to --out FILE
// (default bench/results/mesh_layout.json).
#include <hetmesh/mesh/mesh.hpp>
#include <hetmesh_tools/args.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace hm = hetmesh::mesh;

namespace {

struct scenario {
  std::string name;
  std::vector<std::pair<hm::dim, std::int64_t>> shape;
  hm::traffic load;
};

template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench/results/mesh_layout.json";
  if (!hetmesh::tools::parse_command_line(argc, argv, "bench_mesh_layout",
                                          {{"--out", "FILE", "the JSON results", &out_path}},
                                          "usage: bench_mesh_layout [--out FILE]"))
    return 2;
  // Bytes per rank per step: illustrative traffic profiles (inputs of the model, not measurements).
  const std::vector<scenario> scenarios{
      {"dense 64", {{hm::tp, 8}, {hm::cp, 2}, {hm::dp, 4}}, {.tp = 8e9, .cp = 2e9, .dp = 1e9}},
      {"long-context 64", {{hm::tp, 2}, {hm::cp, 8}, {hm::dp, 4}}, {.tp = 1e9, .cp = 6e9, .dp = 1e9}},
      {"moe 64",
       {{hm::tp, 2}, {hm::cp, 2}, {hm::ep, 4}, {hm::dp, 4}},
       {.tp = 4e9, .cp = 1e9, .ep = 6e9, .dp = 0.5e9}},
      {"moe+pp 256",
       {{hm::tp, 2}, {hm::cp, 2}, {hm::ep, 4}, {hm::dp, 4}, {hm::pp, 4}},
       {.tp = 4e9, .cp = 1e9, .ep = 6e9, .dp = 0.5e9, .pp = 0.2e9}},
      {"moe+pp 1024",
       {{hm::tp, 4}, {hm::cp, 4}, {hm::ep, 8}, {hm::dp, 4}, {hm::pp, 2}},
       {.tp = 6e9, .cp = 3e9, .ep = 8e9, .dp = 0.5e9, .pp = 0.2e9}},
  };
  nlohmann::json json;
  json["machine"] = "2-core x86_64 CPU, no GPU (search and enumeration times measured; step times modelled)";
  json["model"] =
      "per dim: bytes / bw + (extent-1) * latency on the slowest link its groups use; sum over dims";

  fmt::print("modelled communication time per step (8 devices per node, 450/50 GB/s, 3/10 us)\n");
  fmt::print("{:<16} {:>14} {:>12} {:>12} {:>12} {:>8} {:>14}\n", "scenario", "best order", "ours ms",
             "megatron ms", "bound ms", "gain", "search time");
  for (const auto& s : scenarios) {
    std::int64_t world = 1;
    for (const auto& d : s.shape) world *= d.second;
    const hm::topology topo{.nodes = static_cast<int>(world / 8), .devices_per_node = 8};
    hm::layout_choice choice;
    const double search_s = median_seconds(15, [&] { choice = hm::search_layout(s.shape, s.load, topo); });
    // Lower bound: every dim on the intra-node links (what a node as large as the job would give).
    const hm::topology one_node{.nodes = 1, .devices_per_node = static_cast<int>(world)};
    const auto bound = hm::search_layout(s.shape, s.load, one_node).best().time_ns;
    const double ours = static_cast<double>(choice.best().time_ns) / 1e6;
    const double base = static_cast<double>(choice.baseline().time_ns) / 1e6;
    const double lb = static_cast<double>(bound) / 1e6;
    fmt::print("{:<16} {:>14} {:>12.3f} {:>12.3f} {:>12.3f} {:>7.2f}x {:>11.3f} ms\n", s.name,
               choice.best().order, ours, base, lb, base / ours, search_s * 1e3);
    json["scenarios"].push_back({{"name", s.name},
                                 {"world", world},
                                 {"best_order", choice.best().order},
                                 {"baseline_order", choice.baseline().order},
                                 {"modelled_ms_ours", ours},
                                 {"modelled_ms_megatron", base},
                                 {"modelled_ms_lower_bound", lb},
                                 {"modelled_gain", base / ours},
                                 {"orders_ranked", choice.ranking.size()},
                                 {"measured_search_ms_median", search_s * 1e3}});
  }

  fmt::print("\nmeasured group enumeration, groups(dp), median of 15\n");
  fmt::print("{:<10} {:>16} {:>16} {:>8}\n", "world", "groups() us", "bare loop us", "ratio");
  for (std::int64_t dpn : {64, 512, 4096}) {
    const auto m = hm::make_mesh(hm::tp(8), hm::cp(2), hm::dp(dpn));
    std::vector<std::vector<int>> a, b;
    const double ours = median_seconds(15, [&] { a = m.groups(hm::dp); });
    const double bare = median_seconds(15, [&] {
      b.assign(16, {});
      for (int base = 0; base < 16; ++base) {
        for (std::int64_t i = 0; i < dpn; ++i)
          b[static_cast<std::size_t>(base)].push_back(static_cast<int>(base + 16 * i));
      }
    });
    if (a != b) {
      fmt::print("groups(dp) disagrees with the bare loop\n");
      return 1;
    }
    fmt::print("{:<10} {:>16.1f} {:>16.1f} {:>7.2f}x\n", 16 * dpn, ours * 1e6, bare * 1e6, ours / bare);
    json["enumeration"].push_back(
        {{"world", 16 * dpn}, {"measured_us_groups", ours * 1e6}, {"measured_us_bare_loop", bare * 1e6}});
  }
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream(out_path) << json.dump(2) << '\n';
  fmt::print("\nwrote {}\n", out_path);
  return 0;
}
