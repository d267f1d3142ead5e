// cuda::device_memory against model::host_memory (CTest label gpu; the main in gather.cpp exits 77 without a
// device; the kernels come from memory_kernels.cu): the same operation sequence on random rows, dims that are
// narrower and wider than a warp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/train/offload.hpp>

#include <hetmesh/cuda/device_memory.hpp>

#include "support/memory_sequence.hpp"

// cuda::device_memory models the policy concepts; checked in a plain C++ translation unit, as users include
// it (cuda/ does not include model/, so the static_asserts of this model live here).
static_assert(hetmesh::model::memory_policy<hetmesh::cuda::device_memory>);
static_assert(hetmesh::model::attention_memory<hetmesh::cuda::device_memory, float> &&
              hetmesh::model::attention_memory<hetmesh::cuda::device_memory, double>);

namespace {
template <class T>
void compare(std::size_t rows, std::size_t dim, double tol) {
  hetmesh::rng gen(rows * 131 + dim);
  std::vector<T> x(rows * dim), y(rows * dim), la(rows), lb(rows);
  for (auto* v : {&x, &y})
    for (auto& e : *v) e = static_cast<T>(gen.unit() * 2 - 1);
  for (std::size_t r = 0; r < rows; ++r) {
    la[r] = r % 7 == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(gen.unit() * 4 - 2);
    lb[r] = r % 5 == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(gen.unit() * 4 - 2);
  }
  hetmesh::model::host_memory h;
  const auto want = test_support::run_memory_sequence(h, std::span<const T>(x), std::span<const T>(y),
                                                      std::span<const T>(la), std::span<const T>(lb), dim);
  hetmesh::cuda::device_memory d;
  const auto got = test_support::run_memory_sequence(d, std::span<const T>(x), std::span<const T>(y),
                                                     std::span<const T>(la), std::span<const T>(lb), dim);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      REQUIRE(got[i] == want[i]);
      continue;
    }
    INFO("rows " << rows << " dim " << dim << " element " << i);
    REQUIRE(std::abs(static_cast<double>(got[i]) - want[i]) <=
            tol * (1 + std::abs(static_cast<double>(want[i]))));
  }
}
}  // namespace

TEST_CASE("cuda::device_memory computes what host_memory computes") {
  for (std::size_t dim : {1, 8, 32, 33, 128, 200})
    for (std::size_t rows : {1, 7, 1000}) {
      compare<double>(rows, dim, 1e-12);
      compare<float>(rows, dim, 2e-5);
    }
}

TEST_CASE("train::offload_store over cuda::device_memory keeps the offloaded share in pinned host memory") {
  using store_t = hetmesh::train::offload_store<
      double, hetmesh::model::memory_activation_store<double, hetmesh::cuda::device_memory>>;
  static_assert(std::is_same_v<hetmesh::model::host_buffer_t<hetmesh::cuda::device_memory, double>,
                               hetmesh::cuda::device_memory::host_buffer<double>>);
  store_t s;
  s.set_ratio(0, 1, 0.5);
  std::vector<double> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 0.25 - 3.0;
  hetmesh::cuda::device_memory mem;
  hetmesh::cuda::device_memory::buffer<double> dx;
  dx.resize(x.size());
  mem.upload(dx.span(), std::span<const double>(x));
  s.write({0, 1, 0}, std::span<const double>(dx.span()));
  CHECK(s.offloaded_bytes() == static_cast<std::int64_t>(500 * sizeof(double)));
  std::vector<double> back(x.size());
  mem.download(std::span<double>(back), s.read({0, 1, 0}));
  CHECK(back == x);
  s.release({0, 1, 0});
  CHECK(s.bytes() == 0);
}
