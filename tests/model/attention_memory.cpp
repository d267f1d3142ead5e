// SPDX-License-Identifier: Apache-2.0
// model::memory_policy is about memory only, and model::attention_memory refines it with the attention
// merges: a policy without merge_attention and attention_delta is still a memory policy (activation stores
// run over it), but not an attention memory; the library's policies are both.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include <hetmesh/model/activation.hpp>
#include <hetmesh/model/attention_memory.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/seq/attention_merge.hpp>

using namespace hetmesh;

namespace {

/// A memory policy of host memory with the memory operations only (no attention arithmetic). copy counts
/// its calls, so a test sees that a store copied through it.
struct memory_only {
  static constexpr memory_space space = memory_space::host;
  template <class T>
  using buffer = model::host_memory::buffer<T>;

  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    ++calls;
    host.copy(dst, src);
  }
  template <class T>
  void copy_2d(std::span<T> dst, std::size_t dp, std::span<const T> src, std::size_t sp, std::size_t w,
               std::size_t h) const {
    host.copy_2d(dst, dp, src, sp, w, h);
  }
  template <class T>
  void fill(std::span<T> dst, T value) const {
    host.fill(dst, value);
  }
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    host.add(dst, src);
  }
  template <class T>
  void upload(std::span<T> dst, std::span<const T> src) const {
    host.upload(dst, src);
  }
  template <class T>
  void download(std::span<T> dst, std::span<const T> src) const {
    host.download(dst, src);
  }
  void synchronize() const noexcept {}

  model::host_memory host{};
  mutable int calls = 0;
};

/// memory_only plus the two attention operations, for one element type only (float).
struct float_attention_only : memory_only {
  void merge_attention(std::span<float> out, std::span<float> lse, std::span<const float> out_b,
                       std::span<const float> lse_b, std::size_t dim) const {
    seq::merge_partial(out, lse, out_b, lse_b, dim);
  }
  void attention_delta(std::span<const float> out, std::span<const float> dout, std::span<float> delta,
                       std::size_t dim) const {
    seq::attention_delta(out, dout, delta, dim);
  }
};

/// merge_attention without attention_delta.
struct merge_only : memory_only {
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    seq::merge_partial(out, lse, out_b, lse_b, dim);
  }
};

static_assert(model::memory_policy<memory_only>);
static_assert(!model::attention_memory<memory_only, float>);
static_assert(!model::attention_memory<memory_only, double>);
static_assert(model::memory_policy<merge_only>);
static_assert(!model::attention_memory<merge_only, float>);
static_assert(model::attention_memory<float_attention_only, float>);
static_assert(!model::attention_memory<float_attention_only, double>);
// A type that is no memory policy is no attention memory, whatever members it has.
struct no_space {
  template <class T>
  void merge_attention(std::span<T>, std::span<T>, std::span<const T>, std::span<const T>,
                       std::size_t) const {}
  template <class T>
  void attention_delta(std::span<const T>, std::span<const T>, std::span<T>, std::size_t) const {}
};
static_assert(!model::memory_policy<no_space> && !model::attention_memory<no_space, float>);
// The library's policies model both (cuda::device_memory: tests/cuda/device_memory.cpp).
static_assert(model::attention_memory<model::host_memory, float>);
static_assert(model::attention_memory<model::emulated_device_memory, double>);
static_assert(model::check_attention_memory<model::host_memory, double>());

}  // namespace

TEST_CASE("attention_memory: a memory-only policy still runs an activation store") {
  model::memory_activation_store<double, memory_only> store;
  const std::vector<double> data{1.5, -2.0, 3.25};
  const model::activation_key k{1, 2, 0};
  store.write(k, data);
  CHECK(store.memory().calls == 1);
  const auto back = store.read(k);
  CHECK(std::vector<double>(back.begin(), back.end()) == data);
  CHECK(store.bytes() == static_cast<std::int64_t>(3 * sizeof(double)));
  store.release(k);
  CHECK(!store.contains(k));
}

TEST_CASE("attention_memory: the host policies' merges are seq::merge_partial and seq::attention_delta") {
  const float inf = std::numeric_limits<float>::infinity();
  // Two rows of dim 2: row 0 merges two blocks, row 1's block sees no key (lse_b = -inf) and changes nothing.
  std::vector<float> out{1, 2, 3, 4}, lse{0.5f, 1.0f};
  const std::vector<float> out_b{5, 6, 7, 8}, lse_b{-0.25f, -inf};
  auto want_out = out;
  auto want_lse = lse;
  seq::merge_partial(std::span<float>(want_out), std::span<float>(want_lse), std::span<const float>(out_b),
                     std::span<const float>(lse_b), 2);
  const model::host_memory host;
  host.merge_attention(std::span<float>(out), std::span<float>(lse), std::span<const float>(out_b),
                       std::span<const float>(lse_b), 2);
  CHECK(out == want_out);
  CHECK(lse == want_lse);
  CHECK(out[2] == 3);  // the row without a visible key kept its values
  CHECK(lse[1] == 1.0f);

  float_attention_only f;
  std::vector<float> delta(2);
  f.attention_delta(std::span<const float>(out_b), std::span<const float>(out_b), std::span<float>(delta), 2);
  CHECK(delta == std::vector<float>{5 * 5 + 6 * 6, 7 * 7 + 8 * 8});
}
