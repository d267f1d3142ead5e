// cuda::device_memory under test: model::memory_policy is checked here, where model/ and cuda/ meet, and the
// shared operation sequence runs on the device.
#include <hetmesh/cuda/memory.cuh>
#include <hetmesh/model/memory_policy.hpp>

#include "memory_kernels.hpp"
#include "support/memory_sequence.hpp"

static_assert(hetmesh::model::memory_policy<hetmesh::cuda::device_memory>);

namespace test_cuda {
std::vector<double> device_memory_sequence(std::span<const double> x, std::span<const double> y,
                                           std::span<const double> la, std::span<const double> lb,
                                           std::size_t dim) {
  hetmesh::cuda::device_memory m;
  return test_support::run_memory_sequence(m, x, y, la, lb, dim);
}
std::vector<float> device_memory_sequence(std::span<const float> x, std::span<const float> y,
                                          std::span<const float> la, std::span<const float> lb,
                                          std::size_t dim) {
  hetmesh::cuda::device_memory m;
  return test_support::run_memory_sequence(m, x, y, la, lb, dim);
}
}  // namespace test_cuda
