// Host-callable wrappers around the device kernels under test (compiled by nvcc in gather_kernels.cu).
#pragma once
#include <cstdint>
#include <span>

namespace test_cuda {
void gather_rows_f32(std::span<const float> src, std::span<const std::int64_t> indices, std::span<float> dst,
                     std::int64_t width);
void scatter_rows_f32(std::span<const float> src, std::span<const std::int64_t> indices, std::span<float> dst,
                      std::int64_t width);
}  // namespace test_cuda
