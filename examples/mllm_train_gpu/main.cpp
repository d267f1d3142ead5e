// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu: the GPU variant of examples/mllm_train, written as a user of hetmesh writes
// a data-parallel trainer on GPUs: the same multimodal data (examples/mllm_train/data.hpp: a text source,
// image-text and audio-text sources, a mixture with a curriculum, through the data room's loader), each
// step's documents balanced over the ranks by hetmesh's DP balancer (balance::plan_dp, priced by the cost
// model), CUDA layers (model.cu: cuBLAS GEMMs and the example's kernels), and the gradients and loss
// all-reduced through hetmesh's NCCL backend (comm::nccl, one rank per GPU, threads). Gradients equal
// a one-rank run's: each rank sums its documents' weighted losses, the all-reduced sum is divided by the
// all-reduced weight. With --device host the same program runs its kernels' bodies on the CPU over
// loopback ranks (what CTest runs where there is no GPU).
//
// Usage: example_mllm_train_gpu [--steps N] [--device cuda|host] [--ranks R] [--lr X] [--report FILE]
//                               [--check-host] [--check-grad] [--data-dir D]
//   --check-host  (cuda) step 0's loss and gradients on the device against the host run of the same
//                 micro-batch and parameters; exit 1 beyond 2e-3 relative
//   --check-grad  (host) analytic gradients against central finite differences in double; exit 1 beyond 1e-4
// Exit 0: trained (and the checks passed); 1: a check failed or an error; 2: bad flags (one line).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/balance/dp.hpp>
#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/cost/compute.hpp>
#include <hetmesh/model/micro_batch.hpp>
#if HETMESH_HAS_NCCL
#include <hetmesh/comm/nccl.hpp>
#include <hetmesh/cuda/buffer.hpp>
#endif

#include "mllm_train/data.hpp"
#include "mllm_train_gpu/model.hpp"

namespace {

namespace comm = hetmesh::comm;
using mllm_gpu::backend;
using mllm_gpu::micro_batch;

struct options {
  int steps = 30;
  std::string device = "cuda";
  int ranks = 1;
  double lr = 3e-3;
  std::string report, data_dir;
  bool check_host = false, check_grad = false;
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
    else if (f == "--device") {
      o.device = value();
      if (o.device != "cuda" && o.device != "host")
        usage_error("--device " + o.device + ": expected cuda or host");
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
    else if (f == "--check-host")
      o.check_host = true;
    else if (f == "--check-grad")
      o.check_grad = true;
    else
      usage_error(
          "unknown flag " + f +
          "; expected --steps, --device, --ranks, --lr, --report, --check-host, --check-grad, --data-dir");
  }
  if (o.check_host && o.device != "cuda")
    usage_error("--check-host compares the device with the host: needs --device cuda");
  if (o.check_grad && o.device != "host")
    usage_error("--check-grad runs in double on the host: needs --device host");
  return o;
}

mllm_gpu::sizes model_sizes(const mllm::data_config& dc) {
  mllm_gpu::sizes s;
  s.vocab = dc.vocab, s.patch = dc.image_dim, s.frame = dc.audio_dim;
  return s;
}

/// The documents of `ids` (packed, in that order) as one micro-batch, with their encoders' rows.
micro_batch build(const hetmesh::model::step_batch& batch, const std::map<std::int64_t, std::size_t>& index,
                  const std::vector<hetmesh::seq::seq_desc>& docs, const mllm::step_source& src,
                  const mllm::data_config& dc) {
  micro_batch mb;
  std::vector<std::int32_t> audio_tokens;
  std::vector<std::size_t> audio_slots;  // indices into enc_row to renumber once the vision rows are known
  for (const auto& sd : docs) {
    const auto& d = batch.documents[index.at(sd.id)];
    const auto start = static_cast<std::int32_t>(mb.tokens.size());
    for (std::int64_t p = 0; p < d.length(); ++p) {
      const bool counts = hetmesh::model::target_counts(d, p);
      mb.tokens.push_back(static_cast<std::int32_t>(d.tokens[static_cast<std::size_t>(p)]));
      mb.targets.push_back(counts ? static_cast<std::int32_t>(d.tokens[static_cast<std::size_t>(p + 1)])
                                  : -1);
      mb.weights.push_back(counts ? 1.0f : 0.0f);
      mb.doc_start.push_back(start);
      mb.position.push_back(static_cast<std::int32_t>(p));
      mb.enc_row.push_back(-1);
    }
    for (const auto& it : d.items) {
      const int w = mllm::feature_width(dc, it.encoder);
      std::vector<float> rows(static_cast<std::size_t>(it.tokens * w));
      src.features(it.encoder, it.id, rows);
      auto& dst = it.encoder == mllm::vision_index ? mb.vision : mb.audio;
      dst.insert(dst.end(), rows.begin(), rows.end());
      for (std::int64_t r = 0; r < it.tokens; ++r) {
        const auto t = static_cast<std::size_t>(start + it.position + r);
        if (it.encoder == mllm::vision_index) {
          mb.enc_row[t] = static_cast<std::int32_t>(mb.enc_token.size());
          mb.enc_token.push_back(static_cast<std::int32_t>(t));
        } else {
          audio_slots.push_back(t);
          audio_tokens.push_back(static_cast<std::int32_t>(t));
        }
      }
    }
  }
  const auto vision_rows = static_cast<std::int32_t>(mb.enc_token.size());
  for (std::size_t k = 0; k < audio_slots.size(); ++k)
    mb.enc_row[audio_slots[k]] = vision_rows + static_cast<std::int32_t>(k);
  mb.enc_token.insert(mb.enc_token.end(), audio_tokens.begin(), audio_tokens.end());
  return mb;
}

/// One step's plan: the documents balanced over `ranks` by balance::plan_dp, each rank's share packed
/// into micro-batches of at most `capacity` tokens.
struct step_work {
  hetmesh::balance::dp_plan plan;
  std::vector<std::vector<micro_batch>> per_rank;
  std::int64_t tokens = 0;
};

step_work plan_step(const hetmesh::model::step_batch& batch, const mllm::step_source& src,
                    const mllm::data_config& dc, int ranks) {
  step_work w;
  const auto descs = hetmesh::model::document_descs(batch);
  std::map<std::int64_t, std::size_t> index;
  for (std::size_t i = 0; i < batch.documents.size(); ++i) index[batch.documents[i].id] = i;
  const auto s = model_sizes(dc);
  // Modelled per-document cost: the example's own width and depth at a nominal 100 TFLOP/s (ms units).
  const auto cost = hetmesh::cost::llm_compute::from_dims(s.width, s.blocks, 100e9);
  w.plan = hetmesh::balance::plan_dp(descs, cost, {.ranks = ranks, .capacity = 1024});
  w.per_rank.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (const auto& mb : w.plan.per_rank[static_cast<std::size_t>(r)])
      if (!mb.seqs.empty())
        w.per_rank[static_cast<std::size_t>(r)].push_back(build(batch, index, mb.seqs, src, dc));
  for (const auto& d : batch.documents) w.tokens += d.length();
  return w;
}

/// Sums `v` over the ranks (through device memory for a device communicator).
template <class Comm>
void sum_over_ranks(Comm& c, std::vector<double>& v) {
#if HETMESH_HAS_NCCL
  if constexpr (Comm::memory == comm::memory_space::device) {
    hetmesh::cuda::device_buffer<double> d(v.size());
    d.copy_from(std::span<const double>(v));
    comm::all_reduce(c, d.span(), comm::reduce_op::sum);
    c.synchronize();
    d.copy_to(std::span<double>(v));
    return;
  }
#endif
  comm::all_reduce(c, std::span<double>(v), comm::reduce_op::sum);
}

struct step_record {
  double loss = 0;
  std::int64_t tokens = 0;
  std::vector<double> busy_s;
  double modelled_imbalance = 1, plan_ms = 0;
  std::vector<std::size_t> micro_batches;
};

/// Trains `o.steps` steps on this rank; rank 0 prints and records each.
template <class Comm>
void train_rank(Comm& c, const options& o, const mllm::data_config& dc, backend b, int device,
                std::vector<step_record>& records) {
  const int r = c.rank(), R = c.size();
  mllm_gpu::model<float> m(model_sizes(dc), 7, b, device);
  mllm::step_source src(o.data_dir, dc);
  for (int step = 0; step < o.steps; ++step) {
    const auto batch = src.next();
    const auto p0 = std::chrono::steady_clock::now();
    const step_work w = plan_step(batch, src, dc, R);  // pure: every rank makes the same plan
    const double plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();
    const auto t0 = std::chrono::steady_clock::now();
    m.zero_grad();
    std::vector<double> stats(2 + static_cast<std::size_t>(R), 0.0);
    for (const auto& mb : w.per_rank[static_cast<std::size_t>(r)]) {
      const auto [l, wsum] = m.forward_backward(mb);
      stats[0] += l, stats[1] += wsum;
    }
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats[2 + static_cast<std::size_t>(r)] = busy;
    sum_over_ranks(c, stats);
    comm::all_reduce(c, m.gradients(), comm::reduce_op::sum);
    if constexpr (Comm::memory == comm::memory_space::device) c.synchronize();
    m.scale_gradients(1.0 / stats[1]);
    m.adam(o.lr, step + 1);
    m.synchronize();
    if (r == 0) {
      step_record rec;
      rec.loss = stats[0] / stats[1];
      rec.tokens = w.tokens;
      rec.busy_s.assign(stats.begin() + 2, stats.end());
      rec.plan_ms = plan_ms;
      double mean = 0;
      for (const auto& t : w.plan.rank_time) mean += t.units();
      mean /= static_cast<double>(R);
      rec.modelled_imbalance = mean > 0 ? w.plan.makespan().units() / mean : 1.0;
      for (const auto& mbs : w.per_rank) rec.micro_batches.push_back(mbs.size());
      const double bmax = *std::max_element(rec.busy_s.begin(), rec.busy_s.end());
      double bmean = 0;
      for (double x : rec.busy_s) bmean += x;
      bmean /= static_cast<double>(R);
      std::string mbs;
      for (auto n : rec.micro_batches) {  // (not `"," + to_string`: GCC 12 warns falsely, -Wrestrict)
        if (!mbs.empty()) mbs += ',';
        mbs += std::to_string(n);
      }
      std::printf(
          "step %3d  loss %.4f  tokens %5lld  micro-batches per rank [%s]  busy max %.2f ms (imbalance %.3f, "
          "modelled %.3f)  plan %.2f ms\n",
          step, rec.loss, static_cast<long long>(rec.tokens), mbs.c_str(), 1e3 * bmax,
          bmean > 0 ? bmax / bmean : 1.0, rec.modelled_imbalance, plan_ms);
      std::fflush(stdout);
      records.push_back(std::move(rec));
    }
  }
}

/// Relative max-norm difference of two gradient vectors.
template <class A, class B>
double max_rel(const std::vector<A>& a, const std::vector<B>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Step 0's first micro-batch of `dc`'s data.
micro_batch first_micro_batch(const options& o, const mllm::data_config& dc) {
  mllm::step_source src(o.data_dir, dc);
  const auto batch = src.next();
  const auto w = plan_step(batch, src, dc, 1);
  return w.per_rank.at(0).at(0);
}

int check_host(const options& o, const mllm::data_config& dc) {
  const micro_batch mb = first_micro_batch(o, dc);
  mllm_gpu::model<float> dev(model_sizes(dc), 7, backend::cuda, 0), host(model_sizes(dc), 7, backend::host);
  const auto [ld, wd] = dev.forward_backward(mb);
  const auto [lh, wh] = host.forward_backward(mb);
  const double loss_err = std::abs(ld - lh) / std::max(1e-30, std::abs(lh));
  const double grad_err = max_rel(dev.download(dev.gradients()), host.download(host.gradients()));
  std::printf(
      "check-host: %lld tokens, loss device %.6f host %.6f (rel %.2e), gradients max rel %.2e (tolerance "
      "2e-3)\n",
      static_cast<long long>(mb.size()), ld / wd, lh / wh, loss_err, grad_err);
  return loss_err <= 2e-3 && grad_err <= 2e-3 ? 0 : 1;
}

int check_grad(const options& o, const mllm::data_config& dc) {
  micro_batch mb = first_micro_batch(o, dc);
  mllm_gpu::model<double> m(model_sizes(dc), 7, backend::host);
  m.forward_backward(mb);
  const auto grad = m.download(m.gradients());
  const auto params = m.download(m.parameters());
  hetmesh::rng g(11);
  double worst = 0;
  std::string worst_at;
  int checked = 0;
  for (const auto& t : m.tensors()) {
    for (int k = 0; k < 2; ++k) {
      const std::int64_t i = t.offset + g.uniform(0, t.size - 1);
      const double h = 1e-4, p = params[static_cast<std::size_t>(i)];
      m.set_parameter(i, p + h);
      const double up = m.forward_backward(mb).first;
      m.set_parameter(i, p - h);
      const double down = m.forward_backward(mb).first;
      m.set_parameter(i, p);
      const double fd = (up - down) / (2 * h), an = grad[static_cast<std::size_t>(i)];
      const double err = std::abs(fd - an) / std::max(1e-3, std::abs(fd) + std::abs(an));
      ++checked;
      if (err > worst) worst = err, worst_at = t.name + "[" + std::to_string(i - t.offset) + "]";
    }
  }
  std::printf(
      "check-grad: %d parameters over %zu tensors, %lld tokens: worst relative error %.2e at %s (tolerance "
      "1e-4)\n",
      checked, m.tensors().size(), static_cast<long long>(mb.size()), worst, worst_at.c_str());
  return worst <= 1e-4 ? 0 : 1;
}

void write_report(const options& o, const std::vector<step_record>& recs, const std::string& device_name) {
  nlohmann::json j;
  j["config"] = {{"steps", o.steps},
                 {"device", o.device},
                 {"ranks", o.ranks},
                 {"lr", o.lr},
                 {"device_name", device_name},
                 {"partition", "dp"},
                 {"balancer", "balance::plan_dp (karmarkar_karp)"}};
  j["measured"] = true;
  for (const auto& r : recs) {
    j["loss"].push_back(r.loss);
    j["tokens"].push_back(r.tokens);
    j["busy_s"].push_back(r.busy_s);
    j["modelled_imbalance"].push_back(r.modelled_imbalance);
    j["plan_ms"].push_back(r.plan_ms);
  }
  std::ofstream(o.report) << j.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  options o = parse(argc, argv);
  try {
    mllm::data_config dc;
    dc.samples_dir = HETMESH_EXAMPLE_DATA_DIR;
    if (o.data_dir.empty())
      o.data_dir = (std::filesystem::temp_directory_path() / "hetmesh-mllm-gpu-data").string();
    mllm::make_sources(o.data_dir, dc);
    if (o.check_grad && check_grad(o, dc) != 0) return 1;
    std::vector<step_record> records;
    std::string device_name = "host CPU";
    if (o.device == "host") {
      comm::loopback::run(
          o.ranks, [&](comm::loopback::communicator& c) { train_rank(c, o, dc, backend::host, 0, records); });
    } else {
#if HETMESH_HAS_NCCL
      const int gpus = mllm_gpu::cuda_devices();
      if (gpus == 0) {
        std::printf("example_mllm_train_gpu: no CUDA device; skipped (--device host runs on the CPU)\n");
        return 77;
      }
      if (o.ranks > gpus)
        usage_error("--ranks " + std::to_string(o.ranks) + ": only " + std::to_string(gpus) +
                    " GPUs visible");
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) device_name = prop.name;
      std::printf("device: %s, %d rank(s), one per GPU (NCCL)\n", device_name.c_str(), o.ranks);
      if (o.check_host && check_host(o, dc) != 0) return 1;
      const ncclUniqueId id = comm::nccl::unique_id();
      std::vector<std::thread> threads;
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(o.ranks));
      for (int r = 0; r < o.ranks; ++r)
        threads.emplace_back([&, r] {
          try {
            auto c = comm::nccl::communicator::init(id, o.ranks, r, r);
            train_rank(c, o, dc, backend::cuda, r, records);
          } catch (...) {
            errors[static_cast<std::size_t>(r)] = std::current_exception();
          }
        });
      for (auto& t : threads) t.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
#else
      std::fprintf(stderr, "example_mllm_train_gpu: built without CUDA/NCCL; use --device host\n");
      return 2;
#endif
    }
    if (records.size() >= 2)
      std::printf("loss %.4f -> %.4f over %zu steps (%.0f%%)\n", records.front().loss, records.back().loss,
                  records.size(), 100.0 * records.back().loss / records.front().loss);
    if (!o.report.empty()) write_report(o, records, device_name);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_mllm_train_gpu: %s\n", e.what());
    return 1;
  }
}
