// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: memory policies (model/memory_policy.hpp, refined by model/attention_memory.hpp) whose
// buffers are torch tensors and whose operations are torch ops: libtorch::tensor_memory (CPU tensors, host
// memory: the policy of host communicators) and libtorch::cuda_tensor_memory (CUDA tensors, device memory,
// operations on torch's current CUDA stream of the policy's device). The runtime then allocates its
// activations, ring buffers and scratch as tensors a torch module can use without copies (buffer::tensor()).
// The CUDA variant compiles against any torch but needs one built with CUDA at run time (its constructor
// throws otherwise); the torch installed here is CPU-only, so it is untested here. A CUDA communicator
// (NCCL) must enqueue on the same stream: make torch's current stream the communicator's stream
// (c10::cuda::getStreamFromExternal) or synchronize between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/where.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"
#include "../model/attention_memory.hpp"
#include "../model/memory_policy.hpp"

namespace hetmesh::libtorch {

namespace detail {

/// The torch dtype of T (float, double or std::int64_t, the element types the runtime allocates).
template <class T>
at::ScalarType tensor_dtype() {
  using E = std::remove_const_t<T>;
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, double> || std::is_same_v<E, std::int64_t>,
                "libtorch memory: float, double or std::int64_t elements");
  return c10::CppTypeToScalarType<E>::value;
}

/// A 1-D tensor over `s` (not owned) on `device`.
template <class T>
at::Tensor flat_view(std::span<T> s, const at::Device& device) {
  return at::from_blob(const_cast<std::remove_const_t<T>*>(s.data()), {static_cast<std::int64_t>(s.size())},
                       at::TensorOptions().dtype(tensor_dtype<T>()).device(device));
}

/// A [rows][width] tensor over `s` whose rows start `pitch` elements apart.
template <class T>
at::Tensor pitched_view(std::span<T> s, std::size_t pitch, std::size_t width, std::size_t rows,
                        const at::Device& device) {
  return at::from_blob(const_cast<std::remove_const_t<T>*>(s.data()),
                       {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(width)},
                       {static_cast<std::int64_t>(pitch), 1},
                       at::TensorOptions().dtype(tensor_dtype<T>()).device(device));
}

/// Throws invalid_argument (prefixed by `who`) unless a and b are equal.
inline void check_sizes(std::size_t a, std::size_t b, const char* who) {
  if (a != b)
    throw_error<invalid_argument>("{}: destination holds {} elements, source {}; expected equal sizes", who,
                                  a, b);
}

/// seq::merge_partial on tensors: out [rows][dim] and lse [rows] fold in out_b and lse_b (lse_b =
/// -infinity changes nothing; lse = -infinity takes block b as it is).
inline void merge_tensors(at::Tensor out, at::Tensor lse, const at::Tensor& out_b, const at::Tensor& lse_b) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto m = at::maximum(lse, lse_b);
  const auto shift = at::where(m.eq(-inf), 0.0, m);
  const auto merged = lse.sub(shift).exp().add(lse_b.sub(shift).exp()).log().add(shift);
  const auto skip = lse_b.eq(-inf), take = lse.eq(-inf).logical_and(skip.logical_not());
  const auto wa = at::where(skip, 1.0, at::where(take, 0.0, lse.sub(merged).exp())).unsqueeze(1);
  const auto wb = at::where(skip, 0.0, at::where(take, 1.0, lse_b.sub(merged).exp())).unsqueeze(1);
  out.copy_(at::where(take.unsqueeze(1), out_b, out.mul(wa).add(out_b.mul(wb))));
  lse.copy_(at::where(skip, lse, merged));
}

}  // namespace detail

/// A memory policy over torch tensors of one device type (model::memory_policy, model::attention_memory for
/// float and double): host memory for Space = memory_space::host (CPU tensors), device memory for
/// Space = memory_space::device (CUDA tensors). Use the aliases tensor_memory and cuda_tensor_memory.
/// Operations are torch ops on views of the spans; on CPU they are complete when they return, on CUDA they
/// are enqueued on torch's current stream of the policy's device and synchronize() waits for that stream.
/// A policy is a cheap handle (its device); copies share nothing else.
template <memory_space Space>
class basic_tensor_memory {
 public:
  /// Where the buffers live (memory_policy requirement 1).
  static constexpr memory_space space = Space;

  /// The CPU policy, or the CUDA policy on the current CUDA device. Throws invalid_argument for the CUDA
  /// policy when torch has no CUDA.
  basic_tensor_memory() : device_(make_device(-1)) {}
  /// The CUDA policy on CUDA device `index` (ignored by the CPU policy). Throws as the default constructor.
  explicit basic_tensor_memory(int index) : device_(make_device(index)) {}

  /// The device of the policy's tensors.
  [[nodiscard]] const at::Device& device() const noexcept { return device_; }

  /// A buffer: one contiguous 1-D tensor of T on the policy's device type (CUDA buffers on the current
  /// device when first resized).
  template <class T>
  class buffer {
   public:
    /// n elements: a new tensor when the size changes, the first min(old, n) elements kept.
    void resize(std::size_t n) {
      if (t_.defined() && static_cast<std::size_t>(t_.numel()) == n) return;
      const c10::NoGradGuard no_grad;
      auto t = at::empty({static_cast<std::int64_t>(n)},
                         at::TensorOptions().dtype(detail::tensor_dtype<T>()).device(make_device(-1)));
      if (t_.defined()) {
        const auto keep = std::min<std::int64_t>(t_.numel(), t.numel());
        t.narrow(0, 0, keep).copy_(t_.narrow(0, 0, keep));
      }
      t_ = std::move(t);
    }
    /// Elements held.
    [[nodiscard]] std::size_t size() const noexcept {
      return t_.defined() ? static_cast<std::size_t>(t_.numel()) : 0;
    }
    /// The elements, in the policy's memory (valid until the next resize).
    [[nodiscard]] std::span<T> span() {
      return t_.defined() ? std::span<T>(t_.data_ptr<T>(), size()) : std::span<T>();
    }
    /// The elements, read-only.
    [[nodiscard]] std::span<const T> span() const {
      return t_.defined() ? std::span<const T>(t_.data_ptr<T>(), size()) : std::span<const T>();
    }
    /// The tensor itself (1-D; undefined before the first resize): a module reshapes and uses it in place.
    [[nodiscard]] const at::Tensor& tensor() const noexcept { return t_; }

   private:
    at::Tensor t_;
  };

  /// dst = src (equal sizes; invalid_argument otherwise).
  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    detail::check_sizes(dst.size(), src.size(), "libtorch::tensor_memory::copy");
    if (!dst.empty()) view(dst).copy_(view(src));
  }
  /// For r < height, c < width: dst[r dst_pitch + c] = src[r src_pitch + c] (pitches and width in elements).
  template <class T>
  void copy_2d(std::span<T> dst, std::size_t dst_pitch, std::span<const T> src, std::size_t src_pitch,
               std::size_t width, std::size_t height) const {
    if (width == 0 || height == 0) return;
    check_extent(dst.size(), dst_pitch, width, height, "destination");
    check_extent(src.size(), src_pitch, width, height, "source");
    const c10::NoGradGuard no_grad;
    detail::pitched_view(dst, dst_pitch, width, height, device_)
        .copy_(detail::pitched_view(src, src_pitch, width, height, device_));
  }
  /// Every element of dst = value.
  template <class T>
  void fill(std::span<T> dst, T value) const {
    if (!dst.empty()) view(dst).fill_(value);
  }
  /// dst += src element by element (equal sizes).
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    detail::check_sizes(dst.size(), src.size(), "libtorch::tensor_memory::add");
    if (!dst.empty()) view(dst).add_(view(src));
  }
  /// dst = host_src (host memory), complete on return.
  template <class T>
  void upload(std::span<T> dst, std::span<const T> host_src) const {
    detail::check_sizes(dst.size(), host_src.size(), "libtorch::tensor_memory::upload");
    if (dst.empty()) return;
    view(dst).copy_(detail::flat_view(host_src, at::Device(at::kCPU)));
    synchronize();
  }
  /// host_dst (host memory) = src, complete on return.
  template <class T>
  void download(std::span<T> host_dst, std::span<const T> src) const {
    detail::check_sizes(host_dst.size(), src.size(), "libtorch::tensor_memory::download");
    if (host_dst.empty()) return;
    detail::flat_view(host_dst, at::Device(at::kCPU)).copy_(view(src));
    synchronize();
  }
  /// seq::merge_partial as torch ops (attention_memory requirement 2): rows = lse.size(), out of rows x dim.
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    if (lse_b.size() != lse.size() || out.size() != lse.size() * dim || out_b.size() != out.size())
      throw_error<invalid_argument>(
          "libtorch::tensor_memory::merge_attention: out {}, lse {}, out_b {}, lse_b {} elements for dim {}; "
          "expected out and out_b = rows x dim, lse and lse_b = rows",
          out.size(), lse.size(), out_b.size(), lse_b.size(), dim);
    if (lse.empty()) return;
    const c10::NoGradGuard no_grad;
    const auto rows = static_cast<std::int64_t>(lse.size()), w = static_cast<std::int64_t>(dim);
    detail::merge_tensors(view(out).view({rows, w}), view(lse), view(out_b).view({rows, w}), view(lse_b));
  }
  /// seq::attention_delta as torch ops (attention_memory requirement 3): delta[r] = row r of dout . out.
  template <class T>
  void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta,
                       std::size_t dim) const {
    if (out.size() != dout.size() || out.size() != delta.size() * dim)
      throw_error<invalid_argument>(
          "libtorch::tensor_memory::attention_delta: out {}, dout {}, delta {} elements for dim {}; expected "
          "out and dout = rows x dim, delta = rows",
          out.size(), dout.size(), delta.size(), dim);
    if (delta.empty()) return;
    const c10::NoGradGuard no_grad;
    const auto rows = static_cast<std::int64_t>(delta.size()), w = static_cast<std::int64_t>(dim);
    view(delta).copy_(view(dout).view({rows, w}).mul(view(out).view({rows, w})).sum(1));
  }
  /// Returns when every operation issued so far has completed: nothing to wait for on CPU; on CUDA, waits
  /// for torch's current stream of the policy's device.
  void synchronize() const {
    if constexpr (Space == memory_space::device) {
      const auto* impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
      impl->synchronizeStream(impl->getStream(device_));
    }
  }

 private:
  template <class T>
  at::Tensor view(std::span<T> s) const {
    return detail::flat_view(s, device_);
  }
  static void check_extent(std::size_t size, std::size_t pitch, std::size_t width, std::size_t height,
                           const char* what) {
    if (pitch < width || (height - 1) * pitch + width > size)
      throw_error<invalid_argument>(
          "libtorch::tensor_memory::copy_2d: {} of {} elements, pitch {}, rows {} of {}; expected pitch >= "
          "width and (rows - 1) * pitch + width <= size",
          what, size, pitch, height, width);
  }
  static at::Device make_device(int index) {
    if constexpr (Space == memory_space::host) {
      (void)index;
      return at::Device(at::kCPU);
    } else {
      if (!at::hasCUDA())
        throw_error<invalid_argument>(
            "libtorch::cuda_tensor_memory: this torch has no CUDA (a CPU-only build, or no GPU); use "
            "libtorch::tensor_memory");
      if (index < 0) index = c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index();
      return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
  }

  at::Device device_;
};

/// The CPU policy: torch CPU tensors, host memory (the policy of loopback and MPI communicators).
using tensor_memory = basic_tensor_memory<memory_space::host>;
/// The CUDA policy: torch CUDA tensors on the current stream (needs torch built with CUDA; untested here).
using cuda_tensor_memory = basic_tensor_memory<memory_space::device>;

static_assert(model::memory_policy<tensor_memory>);
static_assert(model::attention_memory<tensor_memory, float> &&
              model::attention_memory<tensor_memory, double>);
static_assert(model::memory_policy<cuda_tensor_memory>);

}  // namespace hetmesh::libtorch
