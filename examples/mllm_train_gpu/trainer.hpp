// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu's trainer (main.cpp has the command line): one rank's training loop through
// train::system with the GPU stages over a memory policy and math<float> kernels, for any backend
// (run_host.cpp, run_emulated.cpp, run_cuda.cpp instantiate it, one translation unit each); the policies the
// flags name; what a step records; step 0's loss and gradients for the reference check.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <hetmesh/core/cpu_time.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/data.hpp"
#include "mllm_train/model.hpp"
#include "mllm_train_gpu/backbone.hpp"
#include "mllm_train_gpu/encoder.hpp"
#include "mllm_train_gpu/math.hpp"
#include "mllm_train_gpu/optimizer.hpp"

namespace gpu_example {

using namespace hetmesh;

/// The command line (main.cpp parses it).
struct options {
  int steps = 30, ranks = 1, pp = 1, cp = 1;
  int capacity =
      0;  ///< HDP: tokens of activations per rank (0: the longest document over the pool, at least 192)
  std::string device = "cuda", partition = "static-cp";
  double lr = 3e-3;
  std::string report, data_dir;
  bool check_reference = false;
};

constexpr std::uint64_t model_seed = 7;

/// The train::system of a run: the partition and balancer the flags name, the backend's kernel,
/// communicator and memory, 1F1B over --pp stages, the encoders in the joint pipeline.
template <class Partition, class Balancer, class Kernel, class Comm, class M>
using system_t =
    train::system<Partition, Kernel, Comm, Balancer, pipeline::one_f_one_b, pipeline::colocated_encoder, M>;

template <class Partition, class Balancer, class Kernel, class Comm, class M>
system_t<Partition, Balancer, Kernel, Comm, M> make_system(Comm& world, const options& o,
                                                           const mllm::config& mc, Partition partition,
                                                           Balancer balancer, Kernel kernel) {
  train::system_options so{.reproducible = true};
  so.encoder_sp.heads = mc.enc_heads;
  return system_t<Partition, Balancer, Kernel, Comm, M>(std::move(partition), std::move(balancer),
                                                        {o.pp, {}, {}}, world, std::move(kernel), so);
}

/// f(partition, balancer) with the policies of --partition: static CP (zigzag rings of --cp, the family
/// placement) or ByteScale's HDP (dynamic rings over the pool, selective offload, ByteScale's balancer).
template <class F>
decltype(auto) with_policies(const options& o, const mllm::config& mc, const mllm::data_config& dc, F&& f) {
  if (o.partition == "hdp") {
    const int pool = o.ranks / o.pp;
    seq::hdp<seq::selective_offload> hdp{
        .capacity =
            o.capacity > 0 ? o.capacity : std::max<std::int64_t>(192, (dc.max_doc_tokens + pool - 1) / pool)};
    hdp.model.activation.layers = std::max(2, mc.blocks / o.pp);
    hdp.model.d2h_bandwidth = hdp.model.h2d_bandwidth = std::numeric_limits<double>::infinity();  // as before
    return f(hdp, balance::bytescale{});
  }
  return f(seq::cp_zigzag{.cp = o.cp, .pad = true}, train::family_placement{});
}

/// Step 0's loss and reduced gradients by tensor id, collected over the ranks (each rank adds the tensors
/// it holds; a tensor held by several ranks has the same reduced gradient on each).
struct step0 {
  double loss = 0;
  std::map<int, std::vector<double>> grads;
  std::mutex mu;

  template <class T, class M>
  void add(std::vector<mllm::tensor_ref<T>> refs, const M& mem, double step_loss) {
    std::lock_guard lock(mu);
    loss = step_loss;
    for (const auto& t : refs) {
      if (grads.count(t.id) != 0) continue;
      std::vector<T> h(t.grad.size());
      mem.download(std::span<T>(h), std::span<const T>(t.grad));
      grads[t.id].assign(h.begin(), h.end());
    }
  }
};

/// What rank 0 records of a step (the ranks' values reduced).
struct step_record {
  double loss = 0, step_ms = 0, plan_ms = 0, library_share = 0, tokens_per_s = 0;
  double offloaded_mb = 0;  ///< activations offloaded to host memory over the ranks (HDP's selective offload)
  std::int64_t tokens = 0, micro_batches = 0;
};

/// The GPU stages of one rank, made from the CPU model of the same split (so the parameters are equal).
template <class T, class M>
struct device_model {
  mllm_gpu::backbone<T, M> llm;
  mllm_gpu::encoder<T, M, model::vision_modality> vision;
  mllm_gpu::encoder<T, M, model::audio_modality> audio;

  device_model(const mllm::multimodal_model<T>& host, const M& mem, const mllm_gpu::math<T>& k)
      : llm(host.llm, mem, k), vision(host.vision, mem, k), audio(host.audio, mem, k) {}
  std::vector<mllm::tensor_ref<T>> tensors() {
    auto out = llm.tensors();
    for (auto& t : vision.tensors()) out.push_back(t);
    for (auto& t : audio.tensors()) out.push_back(t);
    return out;
  }
};

/// Trains o.steps steps on this rank with the GPU stages over memory `mem` and kernels `k`; rank 0 records
/// each step; step 0's gradients go to `first` when it is set. Collective over `world`.
template <class Partition, class Balancer, class Kernel, class Comm, class M>
void train_rank(Comm& world, const options& o, const mllm::config& mc, const mllm::data_config& dc,
                Partition partition, Balancer balancer, const M& mem, const mllm_gpu::math<float>& k,
                Kernel kernel, std::vector<step_record>& records, step0* first) {
  auto sys = make_system<Partition, Balancer, Kernel, Comm, M>(world, o, mc, std::move(partition),
                                                               std::move(balancer), std::move(kernel));
  sys.memory() = mem;
  mllm::step_source src(o.data_dir, dc);
  std::optional<device_model<float, M>> dm;
  mllm_gpu::adam<float, M> opt(static_cast<float>(o.lr), k);
  for (int step = 0; step < o.steps; ++step) {
    const auto batch = src.next();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    const auto plan = sys.plan(batch);
    const double plan_cpu = thread_cpu_seconds() - c0;
    const double plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!dm) {
      const mllm::multimodal_model<float> host(mc, model_seed, plan.pipeline.num_stages,
                                               sys.local_stages(plan));
      dm.emplace(host, mem, k);
    }
    const auto r0 = std::chrono::steady_clock::now();
    const auto stats =
        sys.run(plan, batch, dm->llm, opt,
                train::bind_encoder(
                    dm->vision,
                    mllm_gpu::uploaded_input<decltype(src.input(0)), M>{src.input(mllm::vision_index), mem}),
                train::bind_encoder(dm->audio, mllm_gpu::uploaded_input<decltype(src.input(0)), M>{
                                                   src.input(mllm::audio_index), mem}));
    k.synchronize();
    const double run_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count();
    if (step == 0 && first != nullptr) first->add(dm->tensors(), mem, stats.loss);
    // Over the ranks: the slowest run and plan, the library's and the whole call's thread CPU time.
    std::vector<double> mine(3 + 2 * static_cast<std::size_t>(world.size()), 0.0);
    mine[0] = stats.library_cpu_seconds() + plan_cpu, mine[1] = stats.cpu_step_seconds + plan_cpu;
    mine[2] = static_cast<double>(stats.offloaded_bytes);
    mine[3 + 2 * static_cast<std::size_t>(world.rank())] = run_ms;
    mine[4 + 2 * static_cast<std::size_t>(world.rank())] = plan_ms;
    train::sum_host_values_over_ranks(world, mem, std::span<double>(mine), false);
    if (world.rank() != 0) continue;
    step_record rec;
    rec.loss = stats.loss, rec.tokens = stats.tokens, rec.micro_batches = stats.micro_batches;
    for (std::size_t r = 0; r < static_cast<std::size_t>(world.size()); ++r) {
      rec.step_ms = std::max(rec.step_ms, mine[3 + 2 * r]);
      rec.plan_ms = std::max(rec.plan_ms, mine[4 + 2 * r]);
    }
    rec.library_share = mine[1] > 0 ? mine[0] / mine[1] : 0.0;
    rec.offloaded_mb = mine[2] / 1e6;
    rec.tokens_per_s = rec.step_ms > 0 ? 1e3 * static_cast<double>(rec.tokens) / rec.step_ms : 0.0;
    std::printf(
        "step %3d  loss %.4f  tokens %5lld  micro-batches %3lld  step %.2f ms  plan %.2f ms  library "
        "%.1f%%  offloaded %.2f MB\n",
        step, rec.loss, static_cast<long long>(rec.tokens), static_cast<long long>(rec.micro_batches),
        rec.step_ms, rec.plan_ms, 100.0 * rec.library_share, rec.offloaded_mb);
    std::fflush(stdout);
    records.push_back(rec);
  }
  mem.synchronize();
}

/// Trains (and records on rank 0) o.steps steps on the backend: loopback ranks and host memory
/// (run_host.cpp), loopback ranks over the emulated device (run_emulated.cpp), or one thread per GPU over
/// NCCL (run_cuda.cpp). Step 0's gradients go to `first` when it is set.
void run_host(const options& o, const mllm::config& mc, const mllm::data_config& dc,
              std::vector<step_record>& records, step0* first);
void run_emulated(const options& o, const mllm::config& mc, const mllm::data_config& dc,
                  std::vector<step_record>& records, step0* first);
void run_cuda(const options& o, const mllm::config& mc, const mllm::data_config& dc,
              std::vector<step_record>& records, step0* first);
/// Step 0 of the CPU example's model (mllm::multimodal_model) under the same system configuration on
/// loopback host ranks (run_host.cpp).
void reference_step0(const options& o, const mllm::config& mc, const mllm::data_config& dc, step0& out);

}  // namespace gpu_example
