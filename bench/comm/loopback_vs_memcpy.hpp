// SPDX-License-Identifier: Apache-2.0
// bench_comm, loopback part: all_reduce, all_to_all_v and all_gather_v over 2, 4 and 8 threads against a
// memcpy of the bytes each rank receives (the bound: every byte a rank receives is written once).
//
// Ranks are threads; this machine has fewer cores than ranks, and other processes share them, so wall
// time measures the scheduler as much as the copies. The ratios therefore use thread CPU time
// (CLOCK_THREAD_CPUTIME_ID): a rank's CPU time per call is the work it did, whatever shared the cores.
//   cpu_ratio        = mean over ranks of a rank's CPU time per call
//                      / CPU time per memcpy of the bytes one rank receives, by n threads copying at once
//                        (the bound under the same thread count and memory-bandwidth sharing)
//   cpu_ratio_from_memory = the same numerator / the same memcpy, each copy from the next of several
//                      sources (>= 32 MiB together), so the bytes come from memory beyond the 16 MiB L3
//                      cache, as the collective's inputs (n buffers) do at 4 MiB and up
//   cpu_ratio_same_bytes = the same numerator / CPU time of the collective's own copies done by memcpy, no
//                      synchronisation and no arithmetic: each rank copies the very bytes the collective
//                      moves, from the same buffers to the same places (all_to_all_v: block me of every
//                      rank's send buffer into its receive buffer; all_gather_v: every rank's send
//                      buffer; all_reduce: slice me of every rank's buffer, read and written back), all
//                      ranks at once: what a copy-once collective costs at best on this machine
//   cpu_ratio_alone  = the same numerator / CPU time per memcpy of those bytes by one thread alone
//   wall_ratio       = the slowest rank's wall time per call / one thread's memcpy wall time
//                      (with more ranks than cores this counts every rank's work; for reference only)
// Bytes: all_reduce: the buffer (every rank receives all of it, reduced); all_to_all_v: what each rank
// sends and receives (bytes / n to and from each rank); all_gather_v: what each rank receives (bytes / n
// from each rank). Per call times; per batch each rank's median; per configuration the median over reps.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/cpu_time.hpp>

namespace hetmesh::bench::comm_loopback {

namespace comm = hetmesh::comm;
using clk = std::chrono::steady_clock;

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One call's wall and thread CPU seconds.
struct sample {
  double wall = 0, cpu = 0;
};
template <class F>
sample timed_call(F&& f) {
  const auto w0 = clk::now();
  const double c0 = thread_cpu_seconds();
  f();
  const double c1 = thread_cpu_seconds();
  return {std::chrono::duration<double>(clk::now() - w0).count(), c1 - c0};
}

/// Per-rank medians of `iters` timed calls of body(c) (after two untimed calls), gathered to rank 0:
/// returns {max wall, mean cpu} over ranks.
template <class Body>
sample per_rank_medians(comm::loopback::communicator& c, int iters, Body&& body) {
  body();
  body();
  std::vector<double> w(static_cast<std::size_t>(iters)), u(w.size());
  comm::barrier(c);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const sample s = timed_call(body);
    w[i] = s.wall, u[i] = s.cpu;
  }
  const double mine[2] = {median_of(w), median_of(u)};
  std::vector<double> all(2 * static_cast<std::size_t>(c.size()));
  comm::all_gather(c, std::span<const double>(mine), std::span<double>(all));
  sample out;
  for (std::size_t r = 0; r < all.size(); r += 2)
    out.wall = std::max(out.wall, all[r]), out.cpu += all[r + 1];
  out.cpu /= c.size();
  return out;
}

/// One configuration's per-call figures: the collective and its three memcpy bounds.
struct measured {
  sample collective, memcpy, memcpy_cold, memcpy_same;
};

/// Runs `iters` timed calls of `collective` on n ranks and as many memcpys of `bytes` per rank on n
/// threads at once (from one source, then from sources out of cache, then the collective's own copies).
inline measured measure(const std::string& collective, int n, std::int64_t bytes, int iters) {
  const auto count = static_cast<std::size_t>(bytes / 8);
  const auto per = count / static_cast<std::size_t>(n);  // elements to / from each rank
  measured out;
  comm::loopback::run(n, [&](comm::loopback::communicator& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    // Verifiable values (a function of rank and index), never zeros.
    std::vector<double> x(count), y(count);
    for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<double>((me + 1) * 1000003 + i % 4099);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n), static_cast<std::int64_t>(per)),
        displs(counts.size());
    for (std::size_t j = 0; j < displs.size(); ++j) displs[j] = static_cast<std::int64_t>(j * per);
    const sample s = [&] {
      if (collective == "all_reduce")
        return per_rank_medians(c, iters,
                                [&] { comm::all_reduce(c, std::span<double>(y), comm::reduce_op::sum); });
      if (collective == "all_to_all_v")
        return per_rank_medians(c, iters, [&] {
          comm::all_to_all_v(c, std::span<const double>(x.data(), per * static_cast<std::size_t>(n)),
                             std::span<const std::int64_t>(counts), std::span<const std::int64_t>(displs),
                             std::span<double>(y.data(), per * static_cast<std::size_t>(n)),
                             std::span<const std::int64_t>(counts), std::span<const std::int64_t>(displs));
        });
      return per_rank_medians(c, iters, [&] {
        comm::all_gather_v(c, std::span<const double>(x.data(), per),
                           std::span<double>(y.data(), per * static_cast<std::size_t>(n)),
                           std::span<const std::int64_t>(counts));
      });
    }();
    // The bound under the same conditions: every rank copies the bytes it receives, all at once.
    const sample m = per_rank_medians(c, iters, [&] {
      std::memcpy(y.data(), x.data(), count * 8);
      asm volatile("" ::"r"(y.data()) : "memory");
    });
    // The same, each copy from the next of k sources of at least 32 MiB together, so that (beyond the
    // L3 cache) the bytes come from memory, as the collective's do from the other ranks' buffers.
    const auto k = static_cast<std::size_t>(std::clamp<std::int64_t>((32 << 20) / bytes, 1, 8));
    std::vector<std::vector<double>> srcs(k, x);
    std::size_t next = 0;
    const sample cold = per_rank_medians(c, iters, [&] {
      std::memcpy(y.data(), srcs[next].data(), count * 8);
      next = (next + 1) % k;
      asm volatile("" ::"r"(y.data()) : "memory");
    });
    // The collective's own copies, by memcpy: every rank's buffers by address (exchanged once).
    const std::int64_t mine[2] = {static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x.data())),
                                  static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(y.data()))};
    std::vector<std::int64_t> addr(2 * static_cast<std::size_t>(n));
    comm::all_gather(c, std::span<const std::int64_t>(mine), std::span<std::int64_t>(addr));
    auto buf = [&](std::size_t j, int which) {
      return reinterpret_cast<double*>(
          static_cast<std::uintptr_t>(addr[2 * j + static_cast<std::size_t>(which)]));
    };
    const std::size_t lo = count * me / static_cast<std::size_t>(n),
                      hi = count * (me + 1) / static_cast<std::size_t>(n);
    const sample same = per_rank_medians(c, iters, [&] {
      comm::barrier(c);  // every rank copies in the same round, as a collective's ranks do
      for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
        const std::size_t j = (me + k) % static_cast<std::size_t>(n);  // the collectives' order
        if (collective == "all_reduce")  // slice me of every buffer: read (here from x_j), written back
          std::memcpy(buf(j, 1) + lo, buf(j, 0) + lo, (hi - lo) * 8);
        else if (collective == "all_to_all_v")
          std::memcpy(y.data() + j * per, buf(j, 0) + me * per, per * 8);
        else
          std::memcpy(y.data() + j * per, buf(j, 0), per * 8);
      }
      asm volatile("" ::"r"(y.data()) : "memory");
    });
    comm::barrier(c);  // nobody frees its buffers while another copies from them
    if (c.rank() == 0) out = {s, m, cold, same};
  });
  return out;
}

/// One thread alone: a memcpy of `bytes`, median of `iters` calls.
inline sample memcpy_alone(std::int64_t bytes, int iters) {
  const auto count = static_cast<std::size_t>(bytes / 8);
  std::vector<double> src(count, 1.0), dst(count, 2.0);
  std::vector<double> w(static_cast<std::size_t>(iters)), u(w.size());
  for (int warm = 0; warm < 2; ++warm) std::memcpy(dst.data(), src.data(), count * 8);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const sample s = timed_call([&] {
      std::memcpy(dst.data(), src.data(), count * 8);
      asm volatile("" ::"r"(dst.data()) : "memory");
    });
    w[i] = s.wall, u[i] = s.cpu;
  }
  return {median_of(w), median_of(u)};
}

/// The table and JSON rows for sizes 1 KiB .. max_bytes (x4) on 2, 4 and 8 ranks; `reps` batches each.
inline nlohmann::json run(std::int64_t max_bytes, int reps) {
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-13s %5s %10s %11s %11s %11s %11s %9s %9s %9s %9s %9s\n", "collective", "ranks", "bytes",
              "cpu_us", "memcpy_n_us", "same_us", "memcpy1_us", "cpu_ratio", "cpu/mem", "cpu/same",
              "cpu/alone", "wall_rat");
  for (const char* name : {"all_reduce", "all_to_all_v", "all_gather_v"})
    for (const int n : {2, 4, 8})
      for (std::int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        // Calls per batch: about 32 MiB received per rank, at least 5 and at most 400.
        const int iters = static_cast<int>(std::clamp<std::int64_t>((32 << 20) / bytes, 5, 400));
        std::vector<double> cw, cc, mc, md, ms, aw, ac;
        for (int rep = 0; rep < reps; ++rep) {
          const auto r = measure(name, n, bytes, iters);
          const sample a = memcpy_alone(bytes, iters);
          cw.push_back(r.collective.wall), cc.push_back(r.collective.cpu), mc.push_back(r.memcpy.cpu),
              md.push_back(r.memcpy_cold.cpu), ms.push_back(r.memcpy_same.cpu), aw.push_back(a.wall),
              ac.push_back(a.cpu);
        }
        const double w = median_of(cw), u = median_of(cc), mn = median_of(mc), mm = median_of(md),
                     msm = median_of(ms), m1w = median_of(aw), m1 = median_of(ac);
        std::printf("%-13s %5d %10lld %11.2f %11.2f %11.2f %11.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, n,
                    static_cast<long long>(bytes), u * 1e6, mn * 1e6, msm * 1e6, m1 * 1e6, u / mn, u / mm,
                    u / msm, u / m1, w / m1w);
        rows.push_back({{"collective", name},
                        {"ranks", n},
                        {"bytes", bytes},
                        {"calls_per_batch", iters},
                        {"cpu_us_mean_rank", u * 1e6},
                        {"wall_us_slowest_rank", w * 1e6},
                        {"memcpy_concurrent_cpu_us", mn * 1e6},
                        {"memcpy_concurrent_from_memory_cpu_us", mm * 1e6},
                        {"memcpy_same_bytes_cpu_us", msm * 1e6},
                        {"memcpy_alone_cpu_us", m1 * 1e6},
                        {"memcpy_alone_wall_us", m1w * 1e6},
                        {"cpu_ratio", u / mn},
                        {"cpu_ratio_from_memory", u / mm},
                        {"cpu_ratio_same_bytes", u / msm},
                        {"cpu_ratio_alone", u / m1},
                        {"wall_ratio", w / m1w}});
      }
  return rows;
}

/// The targets at >= 4 MiB with 4 and 8 ranks: all_reduce <= 2.5x and all_to_all_v <= 1.5x the
/// memcpy bound (cpu_ratio); each checked row with its verdict.
inline nlohmann::json targets(const nlohmann::json& rows) {
  nlohmann::json out = nlohmann::json::array();
  bool all_met = true;
  for (const auto& r : rows) {
    const std::string name = r["collective"];
    const int n = r["ranks"];
    if (r["bytes"].get<std::int64_t>() < (4 << 20) || (n != 4 && n != 8)) continue;
    double limit = 0;
    if (name == "all_reduce") limit = 2.5;
    if (name == "all_to_all_v") limit = 1.5;
    if (limit == 0) continue;
    const bool met = r["cpu_ratio"].get<double>() <= limit;
    all_met = all_met && met;
    out.push_back({{"collective", name},
                   {"ranks", n},
                   {"bytes", r["bytes"]},
                   {"limit", limit},
                   {"cpu_ratio", r["cpu_ratio"]},
                   {"cpu_ratio_from_memory", r["cpu_ratio_from_memory"]},
                   {"cpu_ratio_same_bytes", r["cpu_ratio_same_bytes"]},
                   {"cpu_ratio_alone", r["cpu_ratio_alone"]},
                   {"met", met},
                   {"met_from_memory", r["cpu_ratio_from_memory"].get<double>() <= limit},
                   {"met_same_bytes", r["cpu_ratio_same_bytes"].get<double>() <= limit}});
  }
  return {{"rows", out}, {"all_met", all_met}};
}

}  // namespace hetmesh::bench::comm_loopback
