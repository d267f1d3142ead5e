// Instantiates the device kernels under test with nvcc; the doctest cases live in gather.cpp.
#include <hetmesh/cuda/gather.cuh>

#include "gather_kernels.hpp"

namespace test_cuda {
void gather_rows_f32(std::span<const float> src, std::span<const std::int64_t> indices, std::span<float> dst,
                     std::int64_t width) {
  hetmesh::cuda::gather_rows(src, indices, dst, width);
}
void scatter_rows_f32(std::span<const float> src, std::span<const std::int64_t> indices, std::span<float> dst,
                      std::int64_t width) {
  hetmesh::cuda::scatter_rows(src, indices, dst, width);
}
}  // namespace test_cuda
