// Device gather and scatter by a plan's indices (hetmesh::cuda::gather_rows, scatter_rows) against their
// bound, a device-to-device cudaMemcpy of the same bytes, side by side in one run, for several row widths
// and sizes (4-byte rows also read 8 bytes of index per element, which the GB/s do not count). Indices are
// a zigzag context-parallel partition of one long sequence (the shape a CP rank gathers).
// Usage: bench_gpu_gather [--out FILE]   (default bench/results/gpu_gather.json). Exits 77 without a GPU.
#include <hetmesh/cuda/gather.cuh>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {
#define BENCH_CHECK(call)                                                                \
  do {                                                                                   \
    const cudaError_t s_ = (call);                                                       \
    if (s_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "bench_gpu_gather: %s: %s\n", #call, cudaGetErrorString(s_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (false)

template <class F>
float median_ms(F&& f, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::string out = "bench/results/gpu_gather.json";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "bench_gpu_gather: unknown argument '%s' (expected --out FILE)\n", k.c_str());
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("bench_gpu_gather: no CUDA device; skipped");
    return 77;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::string json = std::string("{\"device\":\"") + prop.name + "\",\"kind\":\"measured\",\"rows\":[";
  std::printf("%-10s %-8s %-12s %-12s %-12s %-12s %-8s %-8s %-8s %-8s\n", "tokens", "width", "bytes",
              "gather GB/s", "scatter GB/s", "memcpy GB/s", "gather", "scatter", "g touch", "s touch");
  bool first = true;
  for (std::int64_t width : {1, 1024, 4096}) {
    for (std::int64_t tokens : {std::int64_t{1} << 16, std::int64_t{1} << 20, std::int64_t{1} << 24}) {
      if (tokens * width > (std::int64_t{1} << 30)) continue;
      const std::int64_t cp = 8, chunk = tokens / (2 * cp);
      std::vector<std::int64_t> idx;
      for (std::int64_t r = 0; r < cp; ++r)
        for (std::int64_t c : {r, 2 * cp - 1 - r})
          for (std::int64_t i = 0; i < chunk; ++i) idx.push_back(c * chunk + i);
      const std::size_t n = static_cast<std::size_t>(tokens * width);
      float *src = nullptr, *dst = nullptr;
      std::int64_t* didx = nullptr;
      BENCH_CHECK(cudaMalloc(&src, n * sizeof(float)));
      BENCH_CHECK(cudaMalloc(&dst, n * sizeof(float)));
      BENCH_CHECK(cudaMalloc(&didx, idx.size() * sizeof(std::int64_t)));
      BENCH_CHECK(cudaMemcpy(didx, idx.data(), idx.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemset(src, 1, n * sizeof(float)));
      const std::span<const float> s(src, n);
      const std::span<float> d(dst, n);
      const std::span<const std::int64_t> ix(didx, idx.size());
      hetmesh::cuda::gather_rows(s, ix, d, width);  // warm-up
      BENCH_CHECK(cudaDeviceSynchronize());
      const float g = median_ms([&] { hetmesh::cuda::gather_rows(s, ix, d, width); }, 21);
      // The inverse: the gathered rows back to their places (what a CP rank's gradients do).
      const std::span<const float> back_src(dst, n);
      const std::span<float> back_dst(src, n);
      const float sc = median_ms([&] { hetmesh::cuda::scatter_rows(back_src, ix, back_dst, width); }, 21);
      const float m =
          median_ms([&] { cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice); }, 21);
      const double bytes = 2.0 * static_cast<double>(n * sizeof(float));  // read + write
      const double gbs = bytes / (g * 1e6), sbs = bytes / (sc * 1e6), mbs = bytes / (m * 1e6);
      // Bytes the kernels touch: the rows read and written plus one 8-byte index per row (a memcpy touches
      // only the rows). For narrow rows the indices are a large share: 4-byte rows touch 16 bytes per row
      // against a memcpy's 8, so their data-byte ratio is bounded by about 0.5 at equal bandwidth.
      const double touched = bytes + static_cast<double>(idx.size() * sizeof(std::int64_t));
      const double gtbs = touched / (g * 1e6), stbs = touched / (sc * 1e6);
      std::printf("%-10lld %-8lld %-12zu %-12.1f %-12.1f %-12.1f %-8.3f %-8.3f %-8.3f %-8.3f\n",
                  static_cast<long long>(tokens), static_cast<long long>(width), n * sizeof(float), gbs, sbs,
                  mbs, gbs / mbs, sbs / mbs, gtbs / mbs, stbs / mbs);
      json += (first ? "" : ",") + std::string("{\"tokens\":") + std::to_string(tokens) +
              ",\"width\":" + std::to_string(width) + ",\"bytes\":" + std::to_string(n * sizeof(float)) +
              ",\"gather_ms\":" + std::to_string(g) + ",\"scatter_ms\":" + std::to_string(sc) +
              ",\"memcpy_ms\":" + std::to_string(m) + ",\"scatter_gbs\":" + std::to_string(sbs) +
              ",\"gather_gbs\":" + std::to_string(gbs) + ",\"memcpy_gbs\":" + std::to_string(mbs) +
              ",\"gather_touched_gbs\":" + std::to_string(gtbs) + ",\"scatter_touched_gbs\":" +
              std::to_string(stbs) + ",\"gather_touched_over_memcpy\":" + std::to_string(gtbs / mbs) +
              ",\"scatter_touched_over_memcpy\":" + std::to_string(stbs / mbs) + "}";
      first = false;
      cudaFree(src);
      cudaFree(dst);
      cudaFree(didx);
    }
  }
  json += "]}\n";
  std::ofstream(out) << json;
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
