// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu: the mllm_train example's multimodal model trained through train::system on GPUs.
// The model is the CPU example's (examples/mllm_train: a vision and an audio encoder with attention inside
// items, a pipelined transformer backbone, the same tensor ids and seeded parameters), written over device
// buffers (tensors.hpp, backbone.hpp, encoder.hpp) and CUDA kernels (math.cu: cuBLAS GEMMs and the
// example's kernels), with Adam on the device (optimizer.hpp). train::system runs it on its device path:
// one rank per GPU over NCCL (threads), cuda::device_memory on one stream per rank, ring attention with
// cuda::device_reference_attention (static CP, or ByteScale's HDP with --partition hdp), the encoders in the
// joint pipeline, plan agreement, the landing reshard, the gradient reduction and the stats through device
// buffers. The data is the CPU example's (data.hpp: a text
// source, image-text and audio-text sources, mixed with a curriculum). With --device host the same stages
// run their kernels' bodies on the CPU over loopback ranks and host memory, and with --device emulated
// over comm::emulated_device and model::emulated_device_memory (device buffers the CPU cannot dereference:
// the run fails if a stage hands a kernel host memory or reads device memory on the CPU). CTest runs both
// where there is no GPU.
//
// Usage: example_mllm_train_gpu [--steps N] [--device cuda|host|emulated] [--ranks R] [--pp P] [--cp C]
//                               [--partition static-cp|hdp] [--capacity C] [--lr X] [--report FILE]
//                               [--check-reference] [--data-dir D]
//   --ranks R          R ranks: GPUs (cuda; at most the visible ones) or loopback threads (host); the
//                      world is R / (pp x cp) data-parallel replicas of a pp-stage pipeline with static
//                      context parallelism of degree cp (zigzag rings)
//   --partition        static-cp (default): zigzag rings of --cp over the family placement; hdp: ByteScale's
//                      HDP (rings sized per sequence over each pipeline stage's pool, selective offload of
//                      activations to pinned host memory, ByteScale's balancer); --capacity: its tokens of
//                      activations per rank (default: the longest document over the pool, at least 192)
//   --check-reference  step 0's loss and every gradient tensor against the CPU example's model
//                      (mllm::multimodal_model) under the same train::system configuration on loopback
//                      host ranks; exit 1 beyond the tolerance (2e-3 relative on cuda, 1e-4 on the CPU)
// Exit 0: trained (and the check passed); 1: the check failed or an error; 2: bad flags (one line);
// 77: --device cuda without a GPU (skipped).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <cuda_runtime.h>

#include <hetmesh_tools/args.hpp>

#include "mllm_train/demo.hpp"
#include "mllm_train_gpu/math.hpp"
#include "mllm_train_gpu/trainer.hpp"

namespace {

using namespace gpu_example;

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "example_mllm_train_gpu: %s\n", what.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  const hetmesh::tools::bound_option flags[] = {
      {"--steps", "N", "steps", &o.steps, 1, 100000},
      {"--ranks", "R", "ranks", &o.ranks, 1, 64},
      {"--pp", "P", "pipeline stages", &o.pp, 1, 64},
      {"--cp", "C", "context-parallel degree", &o.cp, 1, 64},
      {"--capacity", "C", "HDP's tokens per rank", &o.capacity, 1, 1 << 30},
      {"--partition", "static-cp|hdp", "partition family", &o.partition},
      {"--device", "cuda|host|emulated", "where the kernels run", &o.device},
      {"--lr", "X", "learning rate in (0, 1)", &o.lr},
      {"--report", "FILE", "the run's report", &o.report},
      {"--data-dir", "D", "where the sources are written", &o.data_dir},
      {"--check-reference", "", "step 0 against the CPU model", &o.check_reference},
  };
  try {
    hetmesh::tools::parse_into(hetmesh::tools::arguments(argc, argv), flags);
  } catch (const hetmesh::tools::usage_error& e) {
    usage_error(e.what());
  }
  if (o.partition != "static-cp" && o.partition != "hdp")
    usage_error("option --partition '" + o.partition + "': expected static-cp or hdp");
  if (o.device != "cuda" && o.device != "host" && o.device != "emulated")
    usage_error("option --device '" + o.device + "': expected cuda, host or emulated");
  if (!(o.lr > 0 && o.lr < 1))
    usage_error("option --lr '" + std::to_string(o.lr) + "': expected a number in (0, 1)");
  if (o.ranks % (o.pp * o.cp) != 0)
    usage_error("--ranks " + std::to_string(o.ranks) + " over --pp " + std::to_string(o.pp) + " x --cp " +
                std::to_string(o.cp) + ": expected a multiple of pp x cp");
  if (o.partition == "hdp" && o.cp != 1)
    usage_error("--cp " + std::to_string(o.cp) +
                " with --partition hdp: HDP sizes its rings per sequence; expected "
                "no --cp");
  if (o.capacity > 0 && o.partition != "hdp")
    usage_error("--capacity is HDP's tokens per rank: it needs --partition hdp");
  return o;
}

/// What --check-reference found.
struct check_result {
  bool passed = false;
  double loss_rel = 0, worst_rel = 0, tolerance = 0;
  std::string worst_at, failure;  ///< the worst tensor ("loss" or "tensor ID"); why it failed outright
};

/// Compares step 0 of the run with the reference: loss and every tensor's gradient (max-norm relative).
check_result compare(const step0& run, const step0& ref, double tol) {
  check_result c;
  c.tolerance = tol;
  c.loss_rel = std::abs(run.loss - ref.loss) / std::max(1e-30, std::abs(ref.loss));
  c.worst_rel = c.loss_rel, c.worst_at = "loss";
  if (run.grads.size() != ref.grads.size())
    c.failure = std::to_string(run.grads.size()) + " gradient tensors; the reference has " +
                std::to_string(ref.grads.size());
  for (const auto& [id, want] : ref.grads) {
    const auto it = run.grads.find(id);
    if (it == run.grads.end() || it->second.size() != want.size()) {
      c.failure = "tensor " + std::to_string(id) + " missing or of another size";
      break;
    }
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(it->second[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    const double err = scale > 0 ? diff / scale : diff;
    if (err > c.worst_rel) c.worst_rel = err, c.worst_at = "tensor " + std::to_string(id);
  }
  c.passed = c.failure.empty() && c.worst_rel <= tol;
  if (!c.failure.empty())
    std::printf("check-reference: %s\n", c.failure.c_str());
  else
    std::printf(
        "check-reference: step 0 against the CPU example's model: loss %.6f vs %.6f (rel %.2e), %zu gradient "
        "tensors, worst relative error %.2e at %s (tolerance %.0e)\n",
        run.loss, ref.loss, c.loss_rel, ref.grads.size(), c.worst_rel, c.worst_at.c_str(), tol);
  return c;
}

void write_report(const options& o, const std::vector<step_record>& recs, const std::string& device_name,
                  const std::optional<check_result>& check) {
  nlohmann::json j;
  j["config"] = {
      {"steps", o.steps},
      {"device", o.device},
      {"ranks", o.ranks},
      {"pp", o.pp},
      {"cp", o.cp},
      {"lr", o.lr},
      {"device_name", device_name},
      {"partition", o.partition},
      {"system", o.partition == "hdp" ? "train::system<hdp<selective_offload>, reference_attention, comm, "
                                        "bytescale, 1f1b, colocated_encoder, memory>"
                                      : "train::system<cp_zigzag, reference_attention, comm, "
                                        "family_placement, 1f1b, colocated_encoder, memory>"}};
  j["measured"] = true;
  if (check)
    j["check_reference"] = {{"passed", check->passed},       {"loss_rel", check->loss_rel},
                            {"worst_rel", check->worst_rel}, {"worst_at", check->worst_at},
                            {"tolerance", check->tolerance}, {"failure", check->failure}};
  for (const auto& r : recs) {
    j["loss"].push_back(r.loss);
    j["tokens"].push_back(r.tokens);
    j["step_ms"].push_back(r.step_ms);
    j["plan_ms"].push_back(r.plan_ms);
    j["library_cpu_share"].push_back(r.library_share);
    j["tokens_per_s"].push_back(r.tokens_per_s);
    j["offloaded_mb"].push_back(r.offloaded_mb);
  }
  std::ofstream(o.report) << j.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  options o = parse(argc, argv);
  try {
    const auto setup = mllm::demo(HETMESH_EXAMPLE_DATA_DIR);  // the CPU example's model and data
    const mllm::config& mc = setup.model;
    const mllm::data_config& dc = setup.data;
    if (o.data_dir.empty())
      o.data_dir = (std::filesystem::temp_directory_path() / "hetmesh-mllm-gpu-data").string();
    mllm::make_sources(o.data_dir, dc);
    std::vector<step_record> records;
    step0 first;
    std::string device_name = "host CPU";
    if (o.device == "host") {
      run_host(o, mc, dc, records, o.check_reference ? &first : nullptr);
    } else if (o.device == "emulated") {
      device_name = "host CPU (emulated device memory)";
      run_emulated(o, mc, dc, records, o.check_reference ? &first : nullptr);
    } else {
      const int gpus = mllm_gpu::cuda_devices();
      if (gpus == 0) {
        std::printf("example_mllm_train_gpu: no CUDA device; skipped (--device host runs on the CPU)\n");
        return 77;
      }
      if (o.ranks > gpus)
        usage_error("--ranks " + std::to_string(o.ranks) + ": only " + std::to_string(gpus) +
                    " GPUs visible (NCCL runs one rank per GPU)");
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) device_name = prop.name;
      std::printf("device: %s, %d rank(s), one per GPU (NCCL), pp %d, cp %d\n", device_name.c_str(), o.ranks,
                  o.pp, o.cp);
      run_cuda(o, mc, dc, records, o.check_reference ? &first : nullptr);
    }
    if (records.size() >= 2)
      std::printf("loss %.4f -> %.4f over %zu steps (%.0f%%)\n", records.front().loss, records.back().loss,
                  records.size(), 100.0 * records.back().loss / records.front().loss);
    std::optional<check_result> check;
    if (o.check_reference) {
      step0 ref;
      reference_step0(o, mc, dc, ref);
      check = compare(first, ref, o.device == "cuda" ? 2e-3 : 1e-4);
    }
    if (!o.report.empty()) write_report(o, records, device_name, check);
    return check && !check->passed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_mllm_train_gpu: %s\n", e.what());
    return 1;
  }
}
