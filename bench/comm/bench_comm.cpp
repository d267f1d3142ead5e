// SPDX-License-Identifier: Apache-2.0
// bench_comm: collectives side by side in one run.
//  - Under mpirun: hetmesh's mpi backend (polling mode, the default, and blocking mode) against the
//    same raw MPI calls (MPI_Iallreduce + MPI_Wait for polling mode, MPI_Allreduce for blocking
//    mode), for all_reduce, broadcast, all_gather, reduce_scatter, all_to_all; sizes 1 KiB .. --max-bytes.
//    With one rank (mpirun -np 1) the calls never wait for a peer, which isolates the wrapper's own
//    per-call cost from scheduling noise.
//  - Otherwise: loopback all_reduce, all_to_all_v and all_gather_v on 2, 4 and 8 threads against a
//    memcpy of the bytes each rank receives, in thread CPU time (loopback_vs_memcpy.hpp says how).
// MPI times: each call is timed; a batch reports the slowest rank's median call; the table reports the
// median (and the best) of --reps batches.
// Bus bandwidth uses nccl-tests' factors: all_reduce 2(n-1)/n; all_gather, reduce_scatter and
// all_to_all (n-1)/n; broadcast 1. Prints a table and writes JSON to --out.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#if HETMESH_HAS_MPI
#include <hetmesh/comm/mpi.hpp>
#endif
#include <hetmesh_tools/args.hpp>

#include "../support/json_file.hpp"
#include "../support/machine.hpp"
#include "loopback_vs_memcpy.hpp"

namespace comm = hetmesh::comm;
using clk = std::chrono::steady_clock;

namespace {

struct args {
  std::string out;
  std::int64_t max_bytes = 64 << 20;
  int reps = 5;
  double target_s = 0.02;  // aim for batches of about this long
};

args parse(int argc, char** argv) {
  args a;
  if (!hetmesh::tools::parse_command_line(argc, argv, "bench_comm",
                                          {{"--out", "FILE", "the JSON results", &a.out},
                                           {"--max-bytes", "N", "largest message", &a.max_bytes},
                                           {"--reps", "N", "repetitions", &a.reps}}))
    std::exit(2);
  return a;
}

[[maybe_unused]] double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
/// The fastest batch: on a shared machine, the estimate least disturbed by other processes.
[[maybe_unused]] double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

std::string machine() {
  return hetmesh::bench::machine_description() +
         ", a VM shared with other builds, no GPU; OpenMPI shared memory";
}

/// The 1-minute load average when measured: this machine is shared, so say how busy it was.
double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

using hetmesh::bench::write_json;

#if HETMESH_HAS_MPI
// --- mpi backend vs raw MPI ----------------------------------------------------------------------

struct coll {
  const char* name;
  double busbw_factor;  // times algbw
};

/// Runs `f` `iters` times, timing each call; returns the slowest rank's median call time (seconds).
/// Per-call medians, not batch means: on a shared, oversubscribed machine a batch is often cut by a
/// time slice of another process, a single call rarely.
template <class F>
double timed(MPI_Comm w, int iters, F&& f) {
  std::vector<double> t(static_cast<std::size_t>(iters));
  MPI_Barrier(w);
  for (auto& x : t) {
    const auto s = clk::now();
    f();
    x = std::chrono::duration<double>(clk::now() - s).count();
  }
  double mine = median(t), worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, w);
  return worst;
}

nlohmann::json bench_mpi(const args& a) {
  namespace mpi = comm::mpi;
  auto poll = mpi::communicator::world();
  auto block = poll.dup();
  block.set_options(
      {.timeout = std::chrono::milliseconds(HETMESH_DEFAULT_TIMEOUT_MS), .verify = false, .blocking = true});
  const MPI_Comm w = MPI_COMM_WORLD;
  const int n = poll.size(), me = poll.rank();
  const coll colls[] = {{"all_reduce", 2.0 * (n - 1) / n},
                        {"broadcast", 1.0},
                        {"all_gather", double(n - 1) / n},
                        {"reduce_scatter", double(n - 1) / n},
                        {"all_to_all", double(n - 1) / n}};
  nlohmann::json rows = nlohmann::json::array();
  if (me == 0)
    std::printf("%-14s %10s %10s %10s %10s %10s %8s %8s %9s %9s %9s\n", "collective", "bytes", "rawI_us",
                "ours_us", "raw_us", "oursB_us", "ovh%", "ovhB%", "busbw", "minovh%", "minovhB%");
  for (const coll& cl : colls) {
    const std::string name = cl.name;
    for (std::int64_t bytes = 8; bytes <= a.max_bytes; bytes = bytes < 1024 ? 1024 : bytes * 4) {
      // `bytes` is the nccl-tests size: the all_reduce/broadcast buffer, the total gathered or scattered
      // bytes.
      const auto total = static_cast<std::size_t>(bytes / 4);
      const std::size_t per = std::max<std::size_t>(total / static_cast<std::size_t>(n), 1);
      std::vector<float> buf(std::max(total, per * static_cast<std::size_t>(n)), 1.0f), out(buf.size());
      std::span<float> x(buf.data(), name == "all_reduce" || name == "broadcast"
                                         ? total
                                         : per * static_cast<std::size_t>(n));
      std::span<float> y(out.data(), x.size());
      const int ci = static_cast<int>(per);
      auto raw_nb = [&] {
        MPI_Request q;
        if (name == "all_reduce")
          MPI_Iallreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM, w, &q);
        else if (name == "broadcast")
          MPI_Ibcast(x.data(), static_cast<int>(x.size()), MPI_FLOAT, 0, w, &q);
        else if (name == "all_gather")
          MPI_Iallgather(x.data(), ci, MPI_FLOAT, y.data(), ci, MPI_FLOAT, w, &q);
        else if (name == "reduce_scatter")
          MPI_Ireduce_scatter_block(x.data(), y.data(), ci, MPI_FLOAT, MPI_SUM, w, &q);
        else
          MPI_Ialltoall(x.data(), ci, MPI_FLOAT, y.data(), ci, MPI_FLOAT, w, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
      };
      auto raw_b = [&] {
        if (name == "all_reduce")
          MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM, w);
        else if (name == "broadcast")
          MPI_Bcast(x.data(), static_cast<int>(x.size()), MPI_FLOAT, 0, w);
        else if (name == "all_gather")
          MPI_Allgather(x.data(), ci, MPI_FLOAT, y.data(), ci, MPI_FLOAT, w);
        else if (name == "reduce_scatter")
          MPI_Reduce_scatter_block(x.data(), y.data(), ci, MPI_FLOAT, MPI_SUM, w);
        else
          MPI_Alltoall(x.data(), ci, MPI_FLOAT, y.data(), ci, MPI_FLOAT, w);
      };
      auto ours = [&](mpi::communicator& c) {
        return [&] {
          if (name == "all_reduce")
            comm::all_reduce(c, x, comm::reduce_op::sum);
          else if (name == "broadcast")
            comm::broadcast(c, x, 0);
          else if (name == "all_gather")
            comm::all_gather(c, std::span<const float>(x.data(), per), y);
          else if (name == "reduce_scatter")
            comm::reduce_scatter(c, std::span<const float>(x), std::span<float>(y.data(), per),
                                 comm::reduce_op::sum);
          else
            comm::all_to_all(c, std::span<const float>(x), y);
        };
      };
      // Calibrate the batch length on the raw call.
      for (int i = 0; i < 2; ++i) raw_b(), ours(poll)(), ours(block)();  // warm (pages, MPI buffers)
      const double t1 = timed(w, 3, raw_b);
      int iters = std::clamp(static_cast<int>(a.target_s / std::max(t1, 1e-7)), 5, 2000);
      MPI_Bcast(&iters, 1, MPI_INT, 0, w);
      double rn = 0, on = 0, rb = 0, ob = 0;
      std::vector<double> vrn, von, vrb, vob;
      for (int rep = 0; rep < a.reps; ++rep) {  // interleaved, so drift hits all four alike
        vrn.push_back(timed(w, iters, raw_nb));
        von.push_back(timed(w, iters, ours(poll)));
        vrb.push_back(timed(w, iters, raw_b));
        vob.push_back(timed(w, iters, ours(block)));
      }
      rn = median(vrn) * 1e6, on = median(von) * 1e6, rb = median(vrb) * 1e6, ob = median(vob) * 1e6;
      const double rnb = best(vrn) * 1e6, onb = best(von) * 1e6, rbb = best(vrb) * 1e6, obb = best(vob) * 1e6;
      const double algbw = static_cast<double>(bytes) / (on * 1e3);  // GB/s
      if (me == 0)
        std::printf("%-14s %10lld %10.2f %10.2f %10.2f %10.2f %8.1f %8.1f %9.3f %9.1f %9.1f\n", cl.name,
                    static_cast<long long>(bytes), rn, on, rb, ob, 100 * (on - rn) / rn, 100 * (ob - rb) / rb,
                    algbw * cl.busbw_factor, 100 * (onb - rnb) / rnb, 100 * (obb - rbb) / rbb);
      rows.push_back({{"collective", name},
                      {"bytes", bytes},
                      {"raw_nonblocking_us", rn},
                      {"ours_polling_us", on},
                      {"raw_blocking_us", rb},
                      {"ours_blocking_us", ob},
                      {"overhead_polling_pct", 100 * (on - rn) / rn},
                      {"overhead_blocking_pct", 100 * (ob - rb) / rb},
                      {"overhead_polling_us", on - rn},
                      {"overhead_blocking_us", ob - rb},
                      {"algbw_GBps", algbw},
                      {"busbw_GBps", algbw * cl.busbw_factor},
                      {"best_raw_nonblocking_us", rnb},
                      {"best_ours_polling_us", onb},
                      {"best_raw_blocking_us", rbb},
                      {"best_ours_blocking_us", obb},
                      {"best_overhead_polling_pct", 100 * (onb - rnb) / rnb},
                      {"best_overhead_blocking_pct", 100 * (obb - rbb) / rbb}});
    }
  }
  return rows;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    args a = parse(argc, argv);
    const bool under_mpirun =
        std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
    nlohmann::json j{
        {"benchmark", "bench_comm"},
        {"machine", machine()},
        {"measured", true},
        {"time", "per-call median within a batch (slowest rank), then median (and best) over reps"},
        {"load_average_1min", load_average()}};
    if (under_mpirun) {
#if HETMESH_HAS_MPI
      comm::mpi::environment env(&argc, &argv);
      int n = 0, me = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &n);
      MPI_Comm_rank(MPI_COMM_WORLD, &me);
      j["mode"] = "mpi", j["ranks"] = n;
      j["results"] = bench_mpi(a);
      if (me == 0) write_json(j, a.out.empty() ? fmt::format("bench/results/comm_mpi_np{}.json", n) : a.out);
      return 0;
#else
      std::fprintf(stderr, "bench_comm was built without MPI\n");
      return 1;
#endif
    }
    j["mode"] = "loopback";
    j["time"] =
        "thread CPU time per call (CLOCK_THREAD_CPUTIME_ID), each rank's median over a batch, mean over "
        "ranks, "
        "median over reps; wall time beside it (ranks outnumber cores, so wall time is for reference)";
    j["ratio"] =
        "cpu_ratio = mean rank CPU time per call / CPU time of a memcpy of the bytes one rank receives, done "
        "by as many threads at once as there are ranks; cpu_ratio_from_memory: the same memcpy, each from "
        "the "
        "next of several sources out of the cache; cpu_ratio_same_bytes: the collective's own copies (the "
        "same bytes, from the same buffers to the same places) by memcpy, every rank in the same round (a "
        "barrier before each), no arithmetic; cpu_ratio_alone: the memcpy by one thread alone";
    j["results"] = hetmesh::bench::comm_loopback::run(a.max_bytes, a.reps);
    j["targets"] = hetmesh::bench::comm_loopback::targets(j["results"]);
    j["load_average_1min_after"] = load_average();
    write_json(j, a.out.empty() ? "bench/results/comm_loopback.json" : a.out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    return 1;
  }
}
