// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda::device_memory: the device memory policy (model::memory_policy, model/memory_policy.hpp, and
// model::attention_memory, model/attention_memory.hpp) on one CUDA stream. Buffers are cudaMalloc
// allocations; copies are async copies, and fills, accumulation, the merge of partial attention and the
// softmax-backward delta run as kernels, all on the policy's stream, which should be the stream the device
// communicator enqueues on (comm::nccl::communicator::stream(), or one stream both were set to), so the
// runtime's own work, the user's kernels and the collectives run in one order. upload/download wait for the
// stream.
//
// This header compiles with a plain C++ compiler (the CUDA runtime API only); the kernels live in
// <hetmesh/cuda/memory_kernels.cuh>, which one .cu file of the program includes (a program that uses
// fill/add/merge_attention/attention_delta without it fails to link, naming hetmesh::cuda::kernels::...).
// Kernel operations take float and double (add also std::int64_t, for counts); copies any trivially copyable
// type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"

namespace hetmesh::cuda {

/// The kernels behind device_memory, defined in memory_kernels.cuh (one .cu file of the program includes
/// it). Each enqueues on `s` and returns; launch failures throw backend_error.
namespace kernels {
void fill(float* dst, std::size_t n, float value, cudaStream_t s);
void fill(double* dst, std::size_t n, double value, cudaStream_t s);
void add(float* dst, const float* src, std::size_t n, cudaStream_t s);
void add(double* dst, const double* src, std::size_t n, cudaStream_t s);
void add(std::int64_t* dst, const std::int64_t* src, std::size_t n, cudaStream_t s);
void merge_attention(float* out, float* lse, const float* out_b, const float* lse_b, std::size_t rows,
                     std::size_t dim, cudaStream_t s);
void merge_attention(double* out, double* lse, const double* out_b, const double* lse_b, std::size_t rows,
                     std::size_t dim, cudaStream_t s);
void attention_delta(const float* out, const float* dout, float* delta, std::size_t rows, std::size_t dim,
                     cudaStream_t s);
void attention_delta(const double* out, const double* dout, double* delta, std::size_t rows, std::size_t dim,
                     cudaStream_t s);
}  // namespace kernels

namespace detail {

// Plain std::string messages: nvcc reads this header too, and fmt is for host translation units
// (core/error.hpp).
inline void check(cudaError_t status, const char* call, const char* who) {
  if (status != cudaSuccess)
    throw backend_error(std::string(who) + ": " + call + " failed: " + cudaGetErrorString(status) + " (" +
                            cudaGetErrorName(status) + ")",
                        static_cast<int>(status));
}

inline void require_equal(std::size_t a, std::size_t b, const char* who) {
  if (a != b)
    throw invalid_argument(std::string(who) + ": destination holds " + std::to_string(a) +
                           " elements, source " + std::to_string(b) + "; expected equal sizes");
}

/// cudaMalloc / cudaFree.
struct device_allocator {
  static cudaError_t allocate(void** p, std::size_t bytes) { return cudaMalloc(p, bytes); }
  static void free(void* p) noexcept { cudaFree(p); }
  static constexpr const char* call = "cudaMalloc";
};
/// cudaMallocHost / cudaFreeHost (pinned host memory).
struct pinned_allocator {
  static cudaError_t allocate(void** p, std::size_t bytes) { return cudaMallocHost(p, bytes); }
  static void free(void* p) noexcept { cudaFreeHost(p); }
  static constexpr const char* call = "cudaMallocHost";
};

/// n elements of T from Alloc, grown when a resize needs more than it holds (contents are then
/// unspecified), never shrunk. Move-only.
template <class T, class Alloc>
class allocation {
  static_assert(std::is_trivially_copyable_v<T>,
                "cuda::device_memory buffers hold trivially copyable elements");

 public:
  allocation() = default;
  /// Takes `o`'s allocation; `o` is left empty.
  allocation(allocation&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  /// Frees this allocation and takes `o`'s; `o` is left empty.
  allocation& operator=(allocation&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0), cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  allocation(const allocation&) = delete;
  allocation& operator=(const allocation&) = delete;
  ~allocation() { release(); }

  /// n elements; throws backend_error when the allocation fails (nothing changes then).
  void resize(std::size_t n) {
    if (n > cap_) {
      void* p = nullptr;
      check(Alloc::allocate(&p, n * sizeof(T)), Alloc::call, "cuda::device_memory buffer");
      release();
      p_ = static_cast<T*>(p), cap_ = n;
    }
    n_ = n;
  }
  /// Elements in use.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// The elements.
  [[nodiscard]] std::span<T> span() noexcept { return {p_, n_}; }
  /// The elements, read-only.
  [[nodiscard]] std::span<const T> span() const noexcept { return {p_, n_}; }

 private:
  void release() noexcept {
    if (p_) Alloc::free(p_);
    p_ = nullptr, n_ = 0, cap_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

}  // namespace detail

/// The device memory policy on one stream (model::memory_policy and model::attention_memory). Cheap to copy
/// (a stream handle); the stream outlives it.
class device_memory {
 public:
  /// Buffers are device memory (memory_policy requirement 1).
  static constexpr memory_space space = memory_space::device;

  /// n elements of T in device memory (cudaMalloc), grown when a resize needs more than it holds (contents
  /// are then unspecified), never shrunk. Move-only. Device memory: pass its span to kernels, copies and
  /// device communicators, never dereference it on the host.
  template <class T>
  using buffer = detail::allocation<T, detail::device_allocator>;
  /// n elements of T in pinned (page-locked) host memory (cudaMallocHost): host memory the device copies to
  /// and from by DMA, without a staging copy (model::host_buffer_t of this policy: where train::offload_store
  /// keeps the activations it moves off the device). Grown like buffer; move-only.
  template <class T>
  using host_buffer = detail::allocation<T, detail::pinned_allocator>;

  /// Operations run on the legacy default stream.
  device_memory() noexcept = default;
  /// Operations run on `s` (0: the legacy default stream).
  explicit device_memory(cudaStream_t s) noexcept : s_(s) {}
  /// The stream operations run on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_; }

  /// dst = src, device to device (cudaMemcpyAsync; equal sizes, else invalid_argument).
  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    detail::require_equal(dst.size(), src.size(), "cuda::device_memory::copy");
    if (!dst.empty())
      detail::check(cudaMemcpyAsync(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDeviceToDevice, s_),
                    "cudaMemcpyAsync", "cuda::device_memory::copy");
  }
  /// Every element of dst = value (a kernel; T float or double).
  template <class T>
  void fill(std::span<T> dst, T value) const {
    if (!dst.empty()) kernels::fill(dst.data(), dst.size(), value, s_);
  }
  /// dst += src (a kernel; T float, double or std::int64_t; equal sizes).
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    detail::require_equal(dst.size(), src.size(), "cuda::device_memory::add");
    if (!dst.empty()) kernels::add(dst.data(), src.data(), dst.size(), s_);
  }
  /// Host to device; returns when the copy (and everything before it on the stream) has completed.
  template <class T>
  void upload(std::span<T> dst, std::span<const T> host_src) const {
    detail::require_equal(dst.size(), host_src.size(), "cuda::device_memory::upload");
    if (dst.empty()) return;
    detail::check(cudaMemcpyAsync(dst.data(), host_src.data(), dst.size_bytes(), cudaMemcpyHostToDevice, s_),
                  "cudaMemcpyAsync", "cuda::device_memory::upload");
    synchronize();
  }
  /// Device to host; returns when the copy (and everything before it on the stream) has completed.
  template <class T>
  void download(std::span<T> host_dst, std::span<const T> src) const {
    detail::require_equal(host_dst.size(), src.size(), "cuda::device_memory::download");
    if (src.empty()) return;
    detail::check(cudaMemcpyAsync(host_dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, s_),
                  "cudaMemcpyAsync", "cuda::device_memory::download");
    synchronize();
  }
  /// seq::merge_partial on device rows (attention_memory requirement 2): (out, lse) absorbs (out_b, lse_b);
  /// rows = lse.size().
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    if (lse.size() != lse_b.size() || out.size() != lse.size() * dim || out_b.size() != out.size())
      throw invalid_argument("cuda::device_memory::merge_attention: rows " + std::to_string(lse.size()) +
                             " and " + std::to_string(lse_b.size()) + ", out " + std::to_string(out.size()) +
                             " and " + std::to_string(out_b.size()) + ", dim " + std::to_string(dim) +
                             "; expected equal rows and out = rows x dim");
    if (!lse.empty())
      kernels::merge_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), lse.size(), dim, s_);
  }
  /// seq::attention_delta on device rows (attention_memory requirement 3): delta[r] = dot(dout row r, out row
  /// r); rows = delta.size().
  template <class T>
  void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta,
                       std::size_t dim) const {
    if (out.size() != dout.size() || out.size() != delta.size() * dim)
      throw invalid_argument("cuda::device_memory::attention_delta: out " + std::to_string(out.size()) +
                             ", dout " + std::to_string(dout.size()) + ", rows " +
                             std::to_string(delta.size()) + ", dim " + std::to_string(dim) +
                             "; expected out = dout = rows x dim");
    if (!delta.empty())
      kernels::attention_delta(out.data(), dout.data(), delta.data(), delta.size(), dim, s_);
  }
  /// A strided copy (cudaMemcpy2DAsync): height rows of width elements, pitches in elements.
  template <class T>
  void copy_2d(std::span<T> dst, std::size_t dst_pitch, std::span<const T> src, std::size_t src_pitch,
               std::size_t width, std::size_t height) const {
    if (width == 0 || height == 0) return;
    auto fits = [&](std::size_t size, std::size_t pitch) {
      return pitch >= width && (height - 1) * pitch + width <= size;
    };
    if (!fits(dst.size(), dst_pitch) || !fits(src.size(), src_pitch))
      throw invalid_argument("cuda::device_memory::copy_2d: " + std::to_string(height) + " rows of " +
                             std::to_string(width) + " from " + std::to_string(src.size()) +
                             " elements (pitch " + std::to_string(src_pitch) + ") to " +
                             std::to_string(dst.size()) + " (pitch " + std::to_string(dst_pitch) +
                             "); expected pitch >= width and (rows - 1) * pitch + width <= size");
    detail::check(cudaMemcpy2DAsync(dst.data(), dst_pitch * sizeof(T), src.data(), src_pitch * sizeof(T),
                                    width * sizeof(T), height, cudaMemcpyDeviceToDevice, s_),
                  "cudaMemcpy2DAsync", "cuda::device_memory::copy_2d");
  }
  /// Waits for the stream.
  void synchronize() const {
    detail::check(cudaStreamSynchronize(s_), "cudaStreamSynchronize", "cuda::device_memory");
  }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace hetmesh::cuda
