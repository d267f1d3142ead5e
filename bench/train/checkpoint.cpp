// SPDX-License-Identifier: Apache-2.0
// bench_train_checkpoint: the step-time overhead of the example's checkpoint. The mllm_train example's step
// loop (examples/mllm_train/trainer.hpp: mllm::train over train::system, HDP with ByteScale's balancer,
// 1F1B, joint encoders; the example's default layout: 8 loopback ranks, pp 2, pool 4) runs in three modes
// side by side: no checkpoint, a synchronous checkpoint after every step (train::save_checkpoint) and the
// asynchronous writer after every step (train::checkpoint_writer: the snapshot is taken on the step's
// thread, the files are written on a background thread while the next step runs). Each repeat runs the
// three modes one after the other, the order rotating per repeat, so a change of load on the shared
// machine touches all three alike.
//
// Measured: wall time between the ends of consecutive steps on rank 0 (the step, plus its checkpoint's
// share on the step's thread: the snapshot and the collective part of a save, or the whole save), over
// steps 1.. of each run (step 0 warms up). Per mode the median over all repeats' steps, and the mean beside
// it; the overhead is median(mode) / median(none) - 1. The checkpoints go to a temporary directory (local
// disk, fsynced as every save is). Results go under the "checkpoint" key of --out, whose other keys are kept.
//
//   bench_train_checkpoint [--out FILE] [--steps N] [--repeats N] [--dir D]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh_tools/args.hpp>

#include "../support/json_file.hpp"
#include "../support/machine.hpp"
#include "mllm_train/demo.hpp"
#include "mllm_train/run_policies.hpp"

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

/// Bytes under `dir` (the checkpoint's size on disk).
std::uintmax_t bytes_under(const fs::path& dir) {
  std::uintmax_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

/// One run of `steps` steps of the example under `o` checkpointing as `mode` says ("none", "sync",
/// "async") into `root`; appends rank 0's step times (seconds, steps 1..) to `times`. Returns the bytes of
/// the newest checkpoint (0 for none).
std::uintmax_t run_mode(const std::string& mode, const mllm::options& o, const mllm::config& mc,
                        const mllm::data_config& dc, const fs::path& root, std::vector<double>& times) {
  namespace tr = hetmesh::train;
  using comm_t = hetmesh::comm::loopback::communicator;
  fs::remove_all(root);
  std::uintmax_t bytes = 0;
  hetmesh::comm::loopback::run(o.ranks, [&](comm_t& world) {
    const auto partition = mllm::hdp_partition(o, mc);
    using system_t = tr::system<std::remove_const_t<decltype(partition)>, hetmesh::model::reference_attention,
                                comm_t, hetmesh::balance::bytescale, hetmesh::pipeline::one_f_one_b,
                                hetmesh::pipeline::colocated_encoder>;
    const tr::pipeline_config<hetmesh::pipeline::one_f_one_b, hetmesh::pipeline::colocated_encoder> pc{
        o.pp, {}, {}};
    tr::system_options so{.reproducible = true};
    so.encoder_sp.heads = mc.enc_heads;
    system_t sys(partition, hetmesh::balance::bytescale{}, pc, world, {}, so);
    mllm::step_feed<comm_t> data(world, 0, o.data_dir, dc);
    mllm::trainer_options to;
    to.steps = o.steps;
    to.data_dir = o.data_dir;
    if (mode != "none") {
      to.ckpt_dir = root;
      to.ckpt_async = mode == "async";
      to.layout = mllm::layout_text(sys, o);
    }
    auto last = std::chrono::steady_clock::now();
    mllm::train(sys, data, mc, to, [&](const mllm::step_result& r) {
      const auto now = std::chrono::steady_clock::now();
      if (world.rank() == 0 && r.step > 0) times.push_back(std::chrono::duration<double>(now - last).count());
      last = now;
    });
  });
  if (mode != "none")
    if (const auto dir = tr::latest_checkpoint(root.string())) bytes = bytes_under(*dir);
  fs::remove_all(root);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out = "bench/results/train.json";
  std::string dir = (fs::temp_directory_path() / "hetmesh-bench-checkpoint").string();
  int steps = 8, repeats = 3;
  const hetmesh::tools::bound_option flags[] = {
      {"--out", "FILE", "the JSON results (other keys kept)", &out},
      {"--steps", "N", "steps per run (step 0 is not timed)", &steps, 2},
      {"--repeats", "N", "repeats of the three modes", &repeats, 1},
      {"--dir", "D", "where the data and checkpoints go", &dir},
  };
  hetmesh::tools::parse_into(hetmesh::tools::arguments(argc, argv), flags);
  const auto setup = mllm::demo(HETMESH_EXAMPLE_DATA_DIR);
  mllm::config mc = setup.model;
  mc.moe_experts = 4;  // as example_mllm_train runs it (main.cpp)
  mc.moe_top_k = 2;
  mllm::options o;  // the example's defaults: 8 ranks, pp 2, HDP, ByteScale, 1F1B, joint encoders
  o.steps = steps;
  o.data_dir = (fs::path(dir) / "data").string();
  mllm::make_sources(o.data_dir, setup.data);
  const double load_start = hetmesh::bench::load_average_now();
  const std::vector<std::string> modes = {"none", "sync", "async"};
  std::vector<std::vector<double>> times(modes.size());
  std::uintmax_t bytes = 0;
  for (int rep = 0; rep < repeats; ++rep)
    for (std::size_t k = 0; k < modes.size(); ++k) {
      const auto m = (k + static_cast<std::size_t>(rep)) % modes.size();
      const auto b = run_mode(modes[m], o, mc, setup.data, fs::path(dir) / ("ckpt-" + modes[m]), times[m]);
      bytes = std::max(bytes, b);
      std::fprintf(stderr, "repeat %d %-5s median step %.4f s\n", rep, modes[m].c_str(), median(times[m]));
    }
  const double none = median(times[0]);
  json row;
  row["what"] =
      "the example's step (8 loopback ranks, tp 1 x pp 2 x HDP pool 4, 1F1B, joint encoders) without a "
      "checkpoint, with a synchronous checkpoint after every step and with the asynchronous writer after "
      "every step; wall time between step ends on rank 0, steps 1.., median over repeats";
  row["ranks"] = o.ranks;
  row["steps_per_run"] = steps;
  row["repeats"] = repeats;
  row["checkpoint_bytes"] = bytes;
  for (std::size_t m = 0; m < modes.size(); ++m) {
    row["step_seconds_median"][modes[m]] = median(times[m]);
    row["step_seconds_mean"][modes[m]] = mean(times[m]);
  }
  row["overhead"]["sync_vs_none"] = median(times[1]) / none - 1;
  row["overhead"]["async_vs_none"] = median(times[2]) / none - 1;
  row["target"] = "async_vs_none <= 0.05";
  row["load_average_1min"] = {{"start", load_start}, {"end", hetmesh::bench::load_average_now()}};
  row["machine"] =
      "2-core VM shared with other builds, no GPU; 8 ranks as threads; checkpoints on local disk";
  json j;
  if (fs::is_regular_file(out)) j = json::parse(std::ifstream(out));
  j["checkpoint"] = row;
  hetmesh::bench::write_json(j, out);
  std::printf(
      "step median: none %.4f s, sync %.4f s (%+.1f%%), async %.4f s (%+.1f%%); checkpoint %ju bytes\n", none,
      median(times[1]), 100 * (median(times[1]) / none - 1), median(times[2]),
      100 * (median(times[2]) / none - 1), bytes);
  return 0;
} catch (const hetmesh::tools::usage_error& e) {
  std::fprintf(stderr, "bench_train_checkpoint: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_checkpoint: %s\n", e.what());
  return 1;
}
