// Host-callable runs of cuda::device_memory (compiled by nvcc in memory_kernels.cu).
#pragma once
#include <cstddef>
#include <span>
#include <vector>

namespace test_cuda {
/// test_support::run_memory_sequence with cuda::device_memory on the default stream.
std::vector<double> device_memory_sequence(std::span<const double> x, std::span<const double> y,
                                           std::span<const double> la, std::span<const double> lb,
                                           std::size_t dim);
std::vector<float> device_memory_sequence(std::span<const float> x, std::span<const float> y,
                                          std::span<const float> la, std::span<const float> lb,
                                          std::size_t dim);
}  // namespace test_cuda
