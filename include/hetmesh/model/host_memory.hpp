// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the memory policies whose operations run on the CPU: host_memory (host buffers, the
// policy of host communicators) and emulated_device_memory (host memory behind emulated device pointers),
// with the helpers every policy shares (host_buffer_t, host_side_memory, bound_memory). A memory policy is
// where the runtime's buffers live and the few operations the runtime does on them (model/memory_policy.hpp;
// the attention merges of model/attention_memory.hpp). The runtime (run/, train/) never reads or writes a
// buffer of a device path on the CPU: it allocates through the policy, hands spans to the user's stages and
// kernels and to the communicator, and does its own arithmetic (merging partial attention, zeroing,
// accumulating) through the policy. cuda::device_memory (cuda/device_memory.hpp) runs these as kernels on a
// stream; emulated_device_memory runs them on the CPU behind emulated device pointers, so the device path
// of the runtime is tested on a machine without a GPU (a stray host access faults at once).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"
#include "../seq/attention_merge.hpp"
#include "attention_memory.hpp"
#include "memory_policy.hpp"

namespace hetmesh::model {

namespace detail {

HETMESH_COMPILED void check_same_size(std::size_t a, std::size_t b, const char* what)
#if HETMESH_BODIES
{
  if (a != b)
    throw_error<invalid_argument>("{}: destination holds {} elements, source {}; expected equal sizes", what,
                                  a, b);
}
#else
    ;
#endif

/// The CPU bodies of the memory operations, shared by host_memory and emulated_device_memory.
struct cpu_ops {
  template <class T>
  static void copy(std::span<T> dst, std::span<const T> src, const char* who) {
    check_same_size(dst.size(), src.size(), who);
    std::copy(src.begin(), src.end(), dst.begin());
  }
  template <class T>
  static void add(std::span<T> dst, std::span<const T> src, const char* who) {
    check_same_size(dst.size(), src.size(), who);
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
  }
  template <class T>
  static void copy_2d(std::span<T> dst, std::size_t dst_pitch, std::span<const T> src, std::size_t src_pitch,
                      std::size_t width, std::size_t height, const char* who) {
    if (height == 0 || width == 0) return;
    check_extent(dst.size(), dst_pitch, width, height, "destination", who);
    check_extent(src.size(), src_pitch, width, height, "source", who);
    for (std::size_t r = 0; r < height; ++r)
      std::copy_n(src.data() + r * src_pitch, width, dst.data() + r * dst_pitch);
  }
  static void check_extent(std::size_t size, std::size_t pitch, std::size_t width, std::size_t height,
                           const char* what, const char* who) {
    if (pitch < width || (height - 1) * pitch + width > size)
      throw_error<invalid_argument>(
          "{}: {} of {} elements, pitch {}, rows {} of {}; expected pitch >= width and "
          "(rows - 1) * pitch + width <= size",
          who, what, size, pitch, height, width);
  }
};

}  // namespace detail

/// Host memory: buffers are std::vector, operations run on the calling thread and are complete on return.
/// The memory policy of host communicators (loopback, mpi). Stateless and cheap to copy.
struct host_memory {
  /// Where the buffers live (memory_policy requirement 1).
  static constexpr memory_space space = memory_space::host;

  /// A std::vector<T> behind the buffer interface.
  template <class T>
  class buffer {
   public:
    /// n elements (contents kept up to the old size).
    void resize(std::size_t n) { v_.resize(n); }
    /// Elements held.
    [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
    /// The elements, in the policy's memory.
    [[nodiscard]] std::span<T> span() noexcept { return v_; }
    /// The elements, read-only, in the policy's memory.
    [[nodiscard]] std::span<const T> span() const noexcept { return v_; }

   private:
    std::vector<T> v_;
  };

  /// dst = src (equal sizes; invalid_argument otherwise).
  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    detail::cpu_ops::copy(dst, src, "host_memory::copy");
  }
  /// Every element of dst = value.
  template <class T>
  void fill(std::span<T> dst, T value) const {
    std::fill(dst.begin(), dst.end(), value);
  }
  /// dst += src element by element (equal sizes).
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    detail::cpu_ops::add(dst, src, "host_memory::add");
  }
  /// dst = host_src (host memory), complete on return.
  template <class T>
  void upload(std::span<T> dst, std::span<const T> host_src) const {
    detail::cpu_ops::copy(dst, host_src, "host_memory::upload");
  }
  /// host_dst (host memory) = src, complete on return.
  template <class T>
  void download(std::span<T> host_dst, std::span<const T> src) const {
    detail::cpu_ops::copy(host_dst, src, "host_memory::download");
  }
  /// seq::merge_partial on the policy's memory (attention_memory requirement 2).
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    seq::merge_partial(out, lse, out_b, lse_b, dim);
  }
  /// seq::attention_delta on the policy's memory (attention_memory requirement 3).
  template <class T>
  void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta,
                       std::size_t dim) const {
    seq::attention_delta(out, dout, delta, dim);
  }
  /// The strided copy of memory_policy requirement 3 (pitches and width in elements).
  template <class T>
  void copy_2d(std::span<T> dst, std::size_t dst_pitch, std::span<const T> src, std::size_t src_pitch,
               std::size_t width, std::size_t height) const {
    detail::cpu_ops::copy_2d(dst, dst_pitch, src, src_pitch, width, height, "host_memory::copy_2d");
  }
  /// Nothing to wait for: every operation completed when it returned.
  void synchronize() const noexcept {}
};

static_assert(memory_policy<host_memory>);
static_assert(attention_memory<host_memory, float> && attention_memory<host_memory, double>);

/// Emulated device memory: host memory handed out as emulated device pointers (core/memory_space.hpp), with
/// every operation run on the CPU after checking that its spans are device views. A device path of the
/// runtime over comm::emulated_device and this policy runs on a CPU-only machine exactly as it would over
/// NCCL and cuda::device_memory, except that a host access of a device buffer faults, and a host buffer
/// passed where device memory is expected is refused (invalid_argument naming the operation).
struct emulated_device_memory {
  /// Where the buffers live (memory_policy requirement 1).
  static constexpr memory_space space = memory_space::device;

  /// Host storage handed out as an emulated device span.
  template <class T>
  class buffer {
   public:
    /// n elements (contents kept up to the old size).
    void resize(std::size_t n) { v_.resize(n); }
    /// Elements held.
    [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
    /// The elements, in the policy's memory.
    [[nodiscard]] std::span<T> span() { return emulated::to_device(std::span<T>(v_)); }
    /// The elements, read-only, in the policy's memory.
    [[nodiscard]] std::span<const T> span() const { return emulated::to_device(std::span<const T>(v_)); }

   private:
    std::vector<T> v_;
  };

  /// dst = src (equal sizes; invalid_argument otherwise).
  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    constexpr const char* who = "emulated_device_memory::copy";
    detail::cpu_ops::copy(emulated::to_host(dst, who), emulated::to_host(src, who), who);
  }
  /// Every element of dst = value.
  template <class T>
  void fill(std::span<T> dst, T value) const {
    const auto h = emulated::to_host(dst, "emulated_device_memory::fill");
    std::fill(h.begin(), h.end(), value);
  }
  /// dst += src element by element (equal sizes).
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    constexpr const char* who = "emulated_device_memory::add";
    detail::cpu_ops::add(emulated::to_host(dst, who), emulated::to_host(src, who), who);
  }
  /// dst = host_src (host memory), complete on return.
  template <class T>
  void upload(std::span<T> dst, std::span<const T> host_src) const {
    constexpr const char* who = "emulated_device_memory::upload";
    detail::cpu_ops::copy(emulated::to_host(dst, who), host_src, who);
  }
  /// host_dst (host memory) = src, complete on return.
  template <class T>
  void download(std::span<T> host_dst, std::span<const T> src) const {
    constexpr const char* who = "emulated_device_memory::download";
    detail::cpu_ops::copy(host_dst, emulated::to_host(src, who), who);
  }
  /// seq::merge_partial on the policy's memory (attention_memory requirement 2).
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    constexpr const char* who = "emulated_device_memory::merge_attention";
    seq::merge_partial(emulated::to_host(out, who), emulated::to_host(lse, who),
                       emulated::to_host(out_b, who), emulated::to_host(lse_b, who), dim);
  }
  /// seq::attention_delta on the policy's memory (attention_memory requirement 3).
  template <class T>
  void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta,
                       std::size_t dim) const {
    constexpr const char* who = "emulated_device_memory::attention_delta";
    seq::attention_delta(emulated::to_host(out, who), emulated::to_host(dout, who),
                         emulated::to_host(delta, who), dim);
  }
  /// The strided copy of memory_policy requirement 3 (pitches and width in elements).
  template <class T>
  void copy_2d(std::span<T> dst, std::size_t dst_pitch, std::span<const T> src, std::size_t src_pitch,
               std::size_t width, std::size_t height) const {
    constexpr const char* who = "emulated_device_memory::copy_2d";
    detail::cpu_ops::copy_2d(emulated::to_host(dst, who), dst_pitch, emulated::to_host(src, who), src_pitch,
                             width, height, who);
  }
  /// Nothing to wait for: every operation completed when it returned.
  void synchronize() const noexcept {}

  /// Host buffers of the emulated device (host_buffer_t): plain host memory, a type of their own so that
  /// tests see where a store keeps what leaves the device (pinned memory on a GPU).
  template <class T>
  class host_buffer : public host_memory::buffer<T> {};
};

static_assert(memory_policy<emulated_device_memory>);
static_assert(attention_memory<emulated_device_memory, float> &&
              attention_memory<emulated_device_memory, double>);

/// The host buffer type of policy M for T: `M::host_buffer<T>` when M declares one (host memory the device
/// copies to and from directly: pinned memory for cuda::device_memory), else a std::vector behind the buffer
/// interface (host_memory::buffer<T>).
template <class M, class T>
struct host_buffer_of {
  using type = host_memory::buffer<T>;  ///< the default: a std::vector
};
/// M declares its host buffers.
template <class M, class T>
requires requires { typename M::template host_buffer<T>; }
struct host_buffer_of<M, T> {
  using type = typename M::template host_buffer<T>;  ///< M's own
};
/// host_buffer_of<M, T>::type.
template <class M, class T>
using host_buffer_t = typename host_buffer_of<M, T>::type;

/// The host side of policy M: host_memory's operations over M's host buffers (host_buffer_t), the policy of
/// host stores that take data from M's device memory (train::offload_store's offloaded share).
template <class M>
struct host_side_memory : host_memory {
  /// M's host buffer for T.
  template <class T>
  using buffer = host_buffer_t<M, T>;
};

namespace detail {
/// One default-constructed policy of type M per program (for stateless host policies).
template <class M>
M& shared_policy() {
  static M m{};
  return m;
}
}  // namespace detail

/// The memory policy a runtime context is bound to: `*bound`, or, when none is bound and M is a host
/// policy, a shared default one (host policies are stateless). Throws invalid_argument with `unbound()`'s
/// message when a device policy is not bound (its stream is the caller's to choose).
template <memory_policy M, class Message>
M& bound_memory(M* bound, Message&& unbound) {
  if (bound != nullptr) return *bound;
  if constexpr (M::space == memory_space::host) {
    return detail::shared_policy<M>();
  } else {
    throw invalid_argument(unbound());
  }
}

}  // namespace hetmesh::model
