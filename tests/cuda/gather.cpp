// Device gather/scatter by a plan's indices (CTest label gpu): exits 77 (skipped) without a device.
// With one: a zigzag context-parallel partition is applied to a device token buffer and must equal
// the host gather; scattering back restores the original, for several row widths.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/cuda/buffer.hpp>
#include <hetmesh/cuda/check.hpp>
#include <hetmesh/cuda/cuda.hpp>  // the room's umbrella: host-side headers, a g++ translation unit

#include "gather_kernels.hpp"

using hetmesh::cuda::device_buffer;

namespace {
float value(std::int64_t row, std::int64_t col) {
  return static_cast<float>(
             hetmesh::key_hash({7, static_cast<std::uint64_t>(row), static_cast<std::uint64_t>(col)}) %
             100003) -
         50000.0f;
}
// Zigzag indices of one cp rank: chunks r and 2cp-1-r of a sequence split into 2cp chunks.
std::vector<std::int64_t> zigzag(std::int64_t seqlen, std::int64_t cp, std::int64_t r) {
  const std::int64_t chunk = seqlen / (2 * cp);
  std::vector<std::int64_t> idx;
  for (std::int64_t c : {r, 2 * cp - 1 - r})
    for (std::int64_t i = 0; i < chunk; ++i) idx.push_back(c * chunk + i);
  return idx;
}
}  // namespace

TEST_CASE("gather_rows applies a zigzag partition and scatter_rows inverts it") {
  for (std::int64_t width : {1, 2, 3, 4, 5, 64, 128, 130, 1024}) {  // scalar, 8- and 16-byte, wide rows
    const std::int64_t seqlen = 4096, cp = 4;
    std::vector<float> host(static_cast<std::size_t>(seqlen * width));
    for (std::int64_t t = 0; t < seqlen; ++t)
      for (std::int64_t c = 0; c < width; ++c) host[static_cast<std::size_t>(t * width + c)] = value(t, c);
    device_buffer<float> src(host.size());
    src.copy_from(host);
    device_buffer<float> back(host.size());
    for (std::int64_t r = 0; r < cp; ++r) {
      const auto idx = zigzag(seqlen, cp, r);
      device_buffer<std::int64_t> didx(idx.size());
      didx.copy_from(idx);
      device_buffer<float> part(idx.size() * static_cast<std::size_t>(width));
      test_cuda::gather_rows_f32(src.span(), didx.span(), part.span(), width);
      std::vector<float> got(part.size());
      part.copy_to(got);
      for (std::size_t i = 0; i < idx.size(); ++i)
        for (std::int64_t c = 0; c < width; ++c)
          REQUIRE(got[i * static_cast<std::size_t>(width) + static_cast<std::size_t>(c)] == value(idx[i], c));
      test_cuda::scatter_rows_f32(part.span(), didx.span(), back.span(), width);
    }
    std::vector<float> restored(host.size());
    back.copy_to(restored);
    CHECK(restored == host);
  }
}

TEST_CASE("gather_rows rejects sizes that do not match the indices") {
  device_buffer<float> src(8), dst(5);
  device_buffer<std::int64_t> idx(2);
  CHECK_THROWS_AS(test_cuda::gather_rows_f32(src.span(), idx.span(), dst.span(), 2),
                  hetmesh::invalid_argument);
  CHECK_THROWS_AS(test_cuda::gather_rows_f32(src.span(), idx.span(), dst.span(), 0),
                  hetmesh::invalid_argument);
}

int main(int argc, char** argv) {
  if (hetmesh::cuda::device_count() == 0) {
    std::puts("test_cuda: no CUDA device; skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
