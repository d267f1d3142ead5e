// SPDX-License-Identifier: Apache-2.0
// bench_gpu_nccl: hetmesh's nccl backend against the same raw NCCL calls on the same communicator and
// stream, side by side in one run, one thread per visible GPU (or --gpus N). Collectives: all_reduce,
// broadcast, all_gather, reduce_scatter, all_to_all, and all_to_all_v (ours: the generic grouped
// send/recv; raw: the same ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd loop written by hand).
// Reports, per collective and size (1 KiB .. --max-bytes, x4), the device time per call (cudaEvent
// over --iters calls after --warmup), the host enqueue time per call, algbw and busbw with
// nccl-tests' factors. Writes JSON to --out (default bench/results/comm_nccl.json). Exits 77 when
// no GPU is visible.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/nccl.hpp>
#include <hetmesh/cuda/buffer.hpp>
#include <hetmesh/cuda/check.hpp>
#include <hetmesh_tools/args.hpp>

#include "../support/json_file.hpp"

namespace comm = hetmesh::comm;
namespace nccl = hetmesh::comm::nccl;
using hetmesh::cuda::check;
using hetmesh::cuda::device_buffer;

namespace {

/// Completes a raw NCCL call on the (non-blocking) communicator as NCCL requires: a call that reports
/// ncclInProgress is polled with ncclCommGetAsyncError until it leaves that state, before the next call
/// on the communicator (the wrapper does the same, with a deadline). Throws naming a failed call.
void ok(ncclResult_t r, const char* call, ncclComm_t comm) {
  while (r == ncclInProgress)
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  if (r != ncclSuccess) throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(r));
}

struct args {
  std::string out = "bench/results/comm_nccl.json";
  std::int64_t max_bytes = std::int64_t{256} << 20;
  int gpus = 0;
  int iters = 20;
  int warmup = 5;
};

args parse(int argc, char** argv) {
  args a;
  if (!hetmesh::tools::parse_command_line(argc, argv, "bench_gpu_nccl",
                                          {{"--out", "FILE", "the JSON results", &a.out},
                                           {"--max-bytes", "N", "largest message", &a.max_bytes},
                                           {"--gpus", "N", "GPUs (0: all)", &a.gpus},
                                           {"--iters", "N", "timed calls", &a.iters},
                                           {"--warmup", "N", "untimed calls", &a.warmup}}))
    std::exit(2);
  return a;
}

struct timing {
  double device_us;  // per call, cudaEvent on the stream
  double host_us;    // per call, time to enqueue
};

/// Runs `call` warmup + iters times on c's stream; returns per-call device and host times.
timing measure(nccl::communicator& c, const args& a, const std::function<void()>& call) {
  for (int i = 0; i < a.warmup; ++i) call();
  c.synchronize();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, c.stream()), "cudaEventRecord");
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; ++i) call();
  const double host =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
  check(cudaEventRecord(stop, c.stream()), "cudaEventRecord");
  c.synchronize();
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return {1000.0 * ms / a.iters, host / a.iters};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const args a = parse(argc, argv);
    const int visible = hetmesh::cuda::device_count();
    if (visible == 0) {
      std::printf("bench_gpu_nccl: no CUDA device; skipped\n");
      return 77;
    }
    const int g = a.gpus > 0 ? std::min(a.gpus, visible) : visible;
    std::barrier sync(g);
    nlohmann::json rows = nlohmann::json::array(), errors = nlohmann::json::array();
    std::mutex rows_mutex;
    std::atomic<int> failures{0};
    const std::vector<std::pair<std::string, double>> colls{
        {"all_reduce", 2.0 * (g - 1) / g}, {"broadcast", 1.0},
        {"all_gather", double(g - 1) / g}, {"reduce_scatter", double(g - 1) / g},
        {"all_to_all", double(g - 1) / g}, {"all_to_all_v", double(g - 1) / g}};
    std::vector<ncclUniqueId> ids;
    for (std::size_t i = 0; i < colls.size(); ++i) ids.push_back(nccl::unique_id());
    auto worker = [&](int rank) {
      const auto n = static_cast<std::size_t>(g);
      for (std::size_t ci = 0; ci < colls.size(); ++ci) {
        const auto& [name, factor] = colls[ci];
        // One communicator per collective: a failure (an asynchronous NCCL error aborts the
        // communicator) costs that collective's rows only, and is recorded in the JSON.
        try {
          auto c = nccl::communicator::init(ids[ci], g, rank, rank);
          const ncclComm_t raw = c.native();
          const cudaStream_t s = c.stream();
          for (std::int64_t bytes = 1024; bytes <= a.max_bytes; bytes *= 4) {
            const auto total = static_cast<std::size_t>(bytes / 4);  // floats
            const std::size_t per = std::max<std::size_t>(total / n, 1);
            device_buffer<float> x(std::max(total, per * n)), y(std::max(total, per * n));
            check(cudaMemset(x.data(), 0, x.size() * 4), "cudaMemset");
            std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(per)), displs(n);
            for (std::size_t j = 0; j < n; ++j) displs[j] = static_cast<std::int64_t>(j * per);
            std::function<void()> raw_call, our_call;
            const std::span<float> xs = x.span(), ys = y.span();
            if (name == "all_reduce") {
              raw_call = [&] {
                ok(ncclAllReduce(x.data(), x.data(), total, ncclFloat32, ncclSum, raw, s), "ncclAllReduce",
                   raw);
              };
              our_call = [&] { comm::all_reduce(c, xs.first(total), comm::reduce_op::sum); };
            } else if (name == "broadcast") {
              raw_call = [&] {
                ok(ncclBroadcast(x.data(), x.data(), total, ncclFloat32, 0, raw, s), "ncclBroadcast", raw);
              };
              our_call = [&] { comm::broadcast(c, xs.first(total), 0); };
            } else if (name == "all_gather") {
              raw_call = [&] {
                ok(ncclAllGather(x.data(), y.data(), per, ncclFloat32, raw, s), "ncclAllGather", raw);
              };
              our_call = [&] {
                comm::all_gather(c, std::span<const float>(xs.first(per)), ys.first(per * n));
              };
            } else if (name == "reduce_scatter") {
              raw_call = [&] {
                ok(ncclReduceScatter(x.data(), y.data(), per, ncclFloat32, ncclSum, raw, s),
                   "ncclReduceScatter", raw);
              };
              our_call = [&] {
                comm::reduce_scatter(c, std::span<const float>(xs.first(per * n)), ys.first(per),
                                     comm::reduce_op::sum);
              };
            } else {  // all_to_all and all_to_all_v: raw is the grouped send/recv loop
              raw_call = [&] {
                ok(ncclGroupStart(), "ncclGroupStart", raw);
                for (std::size_t j = 0; j < n; ++j) {
                  ok(ncclSend(x.data() + j * per, per, ncclFloat32, static_cast<int>(j), raw, s), "ncclSend",
                     raw);
                  ok(ncclRecv(y.data() + j * per, per, ncclFloat32, static_cast<int>(j), raw, s), "ncclRecv",
                     raw);
                }
                ok(ncclGroupEnd(), "ncclGroupEnd", raw);
              };
              if (name == "all_to_all")
                our_call = [&] {
                  comm::all_to_all(c, std::span<const float>(xs.first(per * n)), ys.first(per * n));
                };
              else
                our_call = [&] {
                  comm::all_to_all_v(
                      c, std::span<const float>(xs.first(per * n)), std::span<const std::int64_t>(counts),
                      std::span<const std::int64_t>(displs), ys.first(per * n),
                      std::span<const std::int64_t>(counts), std::span<const std::int64_t>(displs));
                };
            }
            sync.arrive_and_wait();
            const timing r = measure(c, a, raw_call);
            sync.arrive_and_wait();
            const timing o = measure(c, a, our_call);
            if (rank == 0) {
              const double algbw = static_cast<double>(bytes) / (o.device_us * 1e3);
              std::printf("%-14s %12lld %10.2f %10.2f %8.2f %10.2f %10.2f %9.2f\n", name.c_str(),
                          static_cast<long long>(bytes), r.device_us, o.device_us,
                          100 * (o.device_us - r.device_us) / r.device_us, r.host_us, o.host_us,
                          algbw * factor);
              rows.push_back({{"collective", name},
                              {"bytes", bytes},
                              {"raw_device_us", r.device_us},
                              {"ours_device_us", o.device_us},
                              {"overhead_pct", 100 * (o.device_us - r.device_us) / r.device_us},
                              {"raw_host_us", r.host_us},
                              {"ours_host_us", o.host_us},
                              {"algbw_GBps", algbw},
                              {"busbw_GBps", algbw * factor}});
            }
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_gpu_nccl rank %d, %s: %s\n", rank, name.c_str(), e.what());
          ++failures;
          if (rank == 0) {
            const std::lock_guard lock(rows_mutex);
            errors.push_back({{"collective", name}, {"error", e.what()}});
          }
          if (g > 1) {  // the other ranks' barriers and collectives would wait for this one: leave
            sync.arrive_and_drop();
            return;
          }
        }
      }
    };
    std::printf("%-14s %12s %10s %10s %8s %10s %10s %9s\n", "collective", "bytes", "raw_us", "ours_us",
                "ovh%", "raw_host", "ours_host", "busbw");
    std::vector<std::thread> threads;
    for (int r = 0; r < g; ++r) threads.emplace_back(worker, r);
    for (auto& t : threads) t.join();
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    const nlohmann::json j{{"benchmark", "bench_gpu_nccl"},
                           {"measured", true},
                           {"gpus", g},
                           {"device", prop.name},
                           {"iters", a.iters},
                           {"results", rows},
                           {"errors", errors}};
    hetmesh::bench::write_json(j, a.out);
    return failures.load() > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_nccl: %s\n", e.what());
    return 1;
  }
}
