// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu: the mllm_train example's multimodal model trained through train::system on GPUs.
// The model is the CPU example's (examples/mllm_train: a vision and an audio encoder with attention inside
// items, a pipelined transformer backbone, the same tensor ids and seeded parameters), written over device
// buffers (tensors.hpp, backbone.hpp, encoder.hpp) and CUDA kernels (math.cu: cuBLAS GEMMs and the
// example's kernels), with Adam on the device (optimizer.hpp). train::system runs it on its device path:
// one rank per GPU over NCCL (threads), cuda::device_memory on one stream per rank, ring attention with
// cuda::reference_attention, the encoders in the joint pipeline, plan agreement, the landing reshard, the
// gradient reduction and the stats through device buffers. The data is the CPU example's (data.hpp: a text
// source, image-text and audio-text sources, mixed with a curriculum). With --device host the same stages
// run their kernels' bodies on the CPU over loopback ranks and host memory, and with --device emulated
// over comm::emulated_device and model::emulated_device_memory (device buffers the CPU cannot dereference:
// the run fails if a stage hands a kernel host memory or reads device memory on the CPU). CTest runs both
// where there is no GPU.
//
// Usage: example_mllm_train_gpu [--steps N] [--device cuda|host|emulated] [--ranks R] [--pp P] [--cp C] [--lr
// X]
//                               [--report FILE] [--check-reference] [--data-dir D]
//   --ranks R          R ranks: GPUs (cuda; at most the visible ones) or loopback threads (host); the
//                      world is R / (pp x cp) data-parallel replicas of a pp-stage pipeline with static
//                      context parallelism of degree cp (zigzag rings)
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

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/cpu_time.hpp>
#include <hetmesh/model/emulated_attention.hpp>
#include <hetmesh/model/memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>
#if HETMESH_HAS_NCCL
#include <cuda_runtime.h>

#include <hetmesh/comm/nccl.hpp>
#include <hetmesh/cuda/attention.hpp>
#include <hetmesh/cuda/memory.hpp>
#endif

#include "mllm_train/data.hpp"
#include "mllm_train/demo.hpp"
#include "mllm_train/model.hpp"
#include "mllm_train_gpu/backbone.hpp"
#include "mllm_train_gpu/encoder.hpp"
#include "mllm_train_gpu/math.hpp"
#include "mllm_train_gpu/optimizer.hpp"

namespace {

using namespace hetmesh;
using mllm_gpu::backend;

struct options {
  int steps = 30, ranks = 1, pp = 1, cp = 1;
  std::string device = "cuda";
  double lr = 3e-3;
  std::string report, data_dir;
  bool check_reference = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "example_mllm_train_gpu: %s\n", what.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f + " needs a value");
      return argv[++i];
    };
    const auto number = [&](long lo, long hi) {
      const std::string v = value();
      std::size_t used = 0;
      long n = 0;
      try {
        n = std::stol(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || n < lo || n > hi)
        usage_error(f + " " + v + ": expected an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
      return static_cast<int>(n);
    };
    if (f == "--steps")
      o.steps = number(1, 100000);
    else if (f == "--ranks")
      o.ranks = number(1, 64);
    else if (f == "--pp")
      o.pp = number(1, 64);
    else if (f == "--cp")
      o.cp = number(1, 64);
    else if (f == "--device") {
      o.device = value();
      if (o.device != "cuda" && o.device != "host" && o.device != "emulated")
        usage_error("--device " + o.device + ": expected cuda, host or emulated");
    } else if (f == "--lr") {
      const std::string v = value();
      std::size_t used = 0;
      try {
        o.lr = std::stod(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || !(o.lr > 0 && o.lr < 1))
        usage_error("--lr " + v + ": expected a number in (0, 1)");
    } else if (f == "--report")
      o.report = value();
    else if (f == "--data-dir")
      o.data_dir = value();
    else if (f == "--check-reference")
      o.check_reference = true;
    else
      usage_error(
          "unknown flag " + f +
          "; expected --steps, --device, --ranks, --pp, --cp, --lr, --report, --check-reference, --data-dir");
  }
  if (o.ranks % (o.pp * o.cp) != 0)
    usage_error("--ranks " + std::to_string(o.ranks) + " over --pp " + std::to_string(o.pp) + " x --cp " +
                std::to_string(o.cp) + ": expected a multiple of pp x cp");
  return o;
}

constexpr std::uint64_t model_seed = 7;

/// The train::system type of a backend: static CP (zigzag rings of --cp), 1F1B over --pp stages, the
/// encoders in the joint pipeline.
template <class Kernel, class Comm, class M>
using system_t = train::system<seq::cp_zigzag, Kernel, Comm, train::family_placement, pipeline::one_f_one_b,
                               pipeline::colocated_encoder, M>;

template <class Kernel, class Comm, class M>
system_t<Kernel, Comm, M> make_system(Comm& world, const options& o, const mllm::config& mc, Kernel kernel) {
  train::system_options so{.reproducible = true};
  so.encoder_sp.heads = mc.enc_heads;
  return system_t<Kernel, Comm, M>(seq::cp_zigzag{.cp = o.cp, .pad = true}, train::family_placement{},
                                   {o.pp, {}, {}}, world, std::move(kernel), so);
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
template <class Kernel, class Comm, class M>
void train_rank(Comm& world, const options& o, const mllm::config& mc, const mllm::data_config& dc,
                const M& mem, const mllm_gpu::math<float>& k, Kernel kernel,
                std::vector<step_record>& records, step0* first) {
  auto sys = make_system<Kernel, Comm, M>(world, o, mc, std::move(kernel));
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
    std::vector<double> mine(4 + 2 * static_cast<std::size_t>(world.size()), 0.0);
    mine[0] = stats.library_cpu_seconds() + plan_cpu, mine[1] = stats.cpu_step_seconds + plan_cpu;
    mine[4 + 2 * static_cast<std::size_t>(world.rank())] = run_ms;
    mine[5 + 2 * static_cast<std::size_t>(world.rank())] = plan_ms;
    train::sum_host_values_over_ranks(world, mem, std::span<double>(mine), false);
    if (world.rank() != 0) continue;
    step_record rec;
    rec.loss = stats.loss, rec.tokens = stats.tokens, rec.micro_batches = stats.micro_batches;
    for (std::size_t r = 0; r < static_cast<std::size_t>(world.size()); ++r) {
      rec.step_ms = std::max(rec.step_ms, mine[4 + 2 * r]);
      rec.plan_ms = std::max(rec.plan_ms, mine[5 + 2 * r]);
    }
    rec.library_share = mine[1] > 0 ? mine[0] / mine[1] : 0.0;
    rec.tokens_per_s = rec.step_ms > 0 ? 1e3 * static_cast<double>(rec.tokens) / rec.step_ms : 0.0;
    std::printf(
        "step %3d  loss %.4f  tokens %5lld  micro-batches %3lld  step %.2f ms  plan %.2f ms  library "
        "%.1f%%\n",
        step, rec.loss, static_cast<long long>(rec.tokens), static_cast<long long>(rec.micro_batches),
        rec.step_ms, rec.plan_ms, 100.0 * rec.library_share);
    std::fflush(stdout);
    records.push_back(rec);
  }
  mem.synchronize();
}

/// Step 0 of the CPU example's model under the same system configuration on loopback host ranks.
void reference_step0(const options& o, const mllm::config& mc, const mllm::data_config& dc, step0& out) {
  comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
    auto sys = make_system<model::reference_attention, comm::loopback::communicator, model::host_memory>(
        c, o, mc, model::reference_attention{});
    mllm::step_source src(o.data_dir, dc);
    const auto batch = src.next();
    const auto plan = sys.plan(batch);
    mllm::multimodal_model<float> m(mc, model_seed, plan.pipeline.num_stages, sys.local_stages(plan));
    train::adam<float> opt{.lr = static_cast<float>(o.lr)};
    const auto stats =
        sys.run(plan, batch, m.llm, opt, train::bind_encoder(m.vision, src.input(mllm::vision_index)),
                train::bind_encoder(m.audio, src.input(mllm::audio_index)));
    out.add(m.tensors(), model::host_memory{}, stats.loss);
  });
}

/// Compares step 0 of the run with the reference: loss and every tensor's gradient (max-norm relative).
int compare(const step0& run, const step0& ref, double tol) {
  double worst = std::abs(run.loss - ref.loss) / std::max(1e-30, std::abs(ref.loss));
  std::string worst_at = "loss";
  const double loss_err = worst;
  if (run.grads.size() != ref.grads.size()) {
    std::printf("check-reference: %zu gradient tensors; the reference has %zu\n", run.grads.size(),
                ref.grads.size());
    return 1;
  }
  for (const auto& [id, want] : ref.grads) {
    const auto it = run.grads.find(id);
    if (it == run.grads.end() || it->second.size() != want.size()) {
      std::printf("check-reference: tensor %d missing or of another size\n", id);
      return 1;
    }
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(it->second[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    const double err = scale > 0 ? diff / scale : diff;
    if (err > worst) worst = err, worst_at = "tensor " + std::to_string(id);
  }
  std::printf(
      "check-reference: step 0 against the CPU example's model: loss %.6f vs %.6f (rel %.2e), %zu gradient "
      "tensors, worst relative error %.2e at %s (tolerance %.0e)\n",
      run.loss, ref.loss, loss_err, ref.grads.size(), worst, worst_at.c_str(), tol);
  return worst <= tol ? 0 : 1;
}

void write_report(const options& o, const std::vector<step_record>& recs, const std::string& device_name,
                  const std::string& check) {
  nlohmann::json j;
  j["config"] = {{"steps", o.steps},
                 {"device", o.device},
                 {"ranks", o.ranks},
                 {"pp", o.pp},
                 {"cp", o.cp},
                 {"lr", o.lr},
                 {"device_name", device_name},
                 {"system",
                  "train::system<cp_zigzag, reference_attention, comm, family_placement, 1f1b, "
                  "colocated_encoder, memory>"}};
  j["measured"] = true;
  j["check_reference"] = check;
  for (const auto& r : recs) {
    j["loss"].push_back(r.loss);
    j["tokens"].push_back(r.tokens);
    j["step_ms"].push_back(r.step_ms);
    j["plan_ms"].push_back(r.plan_ms);
    j["library_cpu_share"].push_back(r.library_share);
    j["tokens_per_s"].push_back(r.tokens_per_s);
  }
  std::ofstream(o.report) << j.dump(1) << "\n";
}

int run_host(const options& o, const mllm::config& mc, const mllm::data_config& dc,
             std::vector<step_record>& records, step0* first) {
  const mllm_gpu::math<float> k(backend::host);
  comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
    train_rank(c, o, mc, dc, model::host_memory{}, k, model::reference_attention{}, records, first);
  });
  return 0;
}

int run_emulated(const options& o, const mllm::config& mc, const mllm::data_config& dc,
                 std::vector<step_record>& records, step0* first) {
  const mllm_gpu::math<float> k(backend::emulated);
  comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
    comm::emulated_device<comm::loopback::communicator> dev(comm::split(c, 0, c.rank()));
    train_rank(dev, o, mc, dc, model::emulated_device_memory{}, k, model::emulated_attention<>{}, records,
               first);
  });
  return 0;
}

#if HETMESH_HAS_NCCL
int run_cuda(const options& o, const mllm::config& mc, const mllm::data_config& dc,
             std::vector<step_record>& records, step0* first) {
  const ncclUniqueId id = comm::nccl::unique_id();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
          throw std::runtime_error("cudaStreamCreate failed");
        {
          auto c = comm::nccl::communicator::init(id, o.ranks, r, r);
          c.set_stream(stream);
          const mllm_gpu::math<float> k(backend::cuda, stream);
          train_rank(c, o, mc, dc, cuda::device_memory(stream), k, cuda::reference_attention(stream), records,
                     first);
        }
        cudaStreamDestroy(stream);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return 0;
}
#endif

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
#if HETMESH_HAS_NCCL
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
#else
      std::fprintf(stderr, "example_mllm_train_gpu: built without CUDA/NCCL; use --device host\n");
      return 2;
#endif
    }
    if (records.size() >= 2)
      std::printf("loss %.4f -> %.4f over %zu steps (%.0f%%)\n", records.front().loss, records.back().loss,
                  records.size(), 100.0 * records.back().loss / records.front().loss);
    int status = 0;
    std::string check = "not run";
    if (o.check_reference) {
      step0 ref;
      reference_step0(o, mc, dc, ref);
      status = compare(first, ref, o.device == "cuda" ? 2e-3 : 1e-4);
      check = status == 0 ? "passed" : "failed";
    }
    if (!o.report.empty()) write_report(o, records, device_name, check);
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_mllm_train_gpu: %s\n", e.what());
    return 1;
  }
}
