// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: an owning device allocation of n elements of T, with host<->device copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "check.hpp"

namespace hetmesh::cuda {

/// n elements of T in device memory (cudaMalloc), uninitialised. Move-only. The span it hands out
/// holds device pointers: pass it to device communicators and kernels, never dereference it on the host.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device_buffer holds trivially copyable elements");

 public:
  device_buffer() = default;
  /// Allocates `n` uninitialised elements (nothing when n is 0). Throws backend_error when cudaMalloc fails.
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n != 0)
      check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc", "cuda::device_buffer");
  }
  /// Moves the allocation; `o` is left empty.
  device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  /// Frees this allocation and takes `o`'s; `o` is left empty.
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  /// Device pointer to the first element (nullptr when empty). Never dereference it on the host.
  [[nodiscard]] T* data() const noexcept { return p_; }
  /// Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// The elements as a span of device memory, for device communicators and kernels.
  [[nodiscard]] std::span<T> span() const noexcept { return {p_, n_}; }

  /// Copies host data in (stream-ordered on `s`; synchronous on the legacy stream when s is null).
  void copy_from(std::span<const T> host, cudaStream_t s = nullptr) {
    require_size(host.size(), "copy_from");
    if (n_ != 0)
      check(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync",
            "cuda::device_buffer");
    if (!s) check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize", "cuda::device_buffer");
  }
  /// Copies device data out (stream-ordered on `s`; synchronous when s is null).
  void copy_to(std::span<T> host, cudaStream_t s = nullptr) const {
    require_size(host.size(), "copy_to");
    if (n_ != 0)
      check(cudaMemcpyAsync(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync",
            "cuda::device_buffer");
    if (!s) check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize", "cuda::device_buffer");
  }

 private:
  void require_size(std::size_t host, const char* what) const {
    if (host != n_)
      throw invalid_argument(
          fmt::format("cuda::device_buffer::{}: host span of {} elements; expected {}", what, host, n_));
  }
  void reset() noexcept {
    if (p_) cudaFree(p_);
    p_ = nullptr, n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace hetmesh::cuda
