// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda::device_memory: the device memory policy (model::memory_policy, model/memory.hpp) on one
// CUDA stream. Buffers are cudaMalloc allocations; copies, fills, accumulation, the merge of partial
// attention and the softmax-backward delta run as kernels or async copies on the policy's stream, which
// should be the stream the device communicator enqueues on (comm::nccl::communicator::stream(), or a stream
// both were set to), so the runtime's own work, the user's kernels and the collectives run in one order.
// upload/download wait for the stream. Needs nvcc (kernels); the cuda room includes only core, so
// model::memory_policy is checked where both are visible (tests/cuda).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include <string>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"

namespace hetmesh::cuda {

namespace detail {

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, std::size_t n, T value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = value;
}

template <class T>
__global__ void add_kernel(T* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] += src[i];
}

// One warp per row: lane 0 reads both log-sum-exps, every lane rescales its share of the row, lane 0
// writes the merged lse. Rows whose block saw no key (lse_b = -inf) are left alone.
template <class T>
__global__ void merge_attention_kernel(T* __restrict__ out, T* __restrict__ lse, const T* __restrict__ out_b,
                                       const T* __restrict__ lse_b, std::size_t rows, std::size_t dim,
                                       T neg_inf) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const T a = lse[r], b = lse_b[r];
    if (b == neg_inf) continue;
    T* o = out + r * dim;
    const T* ob = out_b + r * dim;
    if (a == neg_inf) {
      for (std::size_t d = lane; d < dim; d += 32) o[d] = ob[d];
    } else {
      const T m = a > b ? a : b;
      const T merged = m + log(exp(a - m) + exp(b - m));
      const T wa = exp(a - merged), wb = exp(b - merged);
      for (std::size_t d = lane; d < dim; d += 32) o[d] = o[d] * wa + ob[d] * wb;
      __syncwarp();
      if (lane == 0) lse[r] = merged;
      continue;
    }
    __syncwarp();
    if (lane == 0) lse[r] = b;
  }
}

// One warp per row: delta[r] = sum_d dout[r, d] * out[r, d], reduced across the warp by shuffles.
template <class T>
__global__ void attention_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                       T* __restrict__ delta, std::size_t rows, std::size_t dim) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    T s = 0;
    for (std::size_t d = lane; d < dim; d += 32) s += dout[r * dim + d] * out[r * dim + d];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) delta[r] = s;
  }
}

inline unsigned blocks_for(std::size_t work, unsigned per_block) {
  const std::size_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Plain std::string messages: nvcc reads this header, and fmt is for host translation units (core/error.hpp).
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

}  // namespace detail

/// The device memory policy on one stream (model::memory_policy). Cheap to copy (a stream handle); the
/// stream outlives it.
class device_memory {
 public:
  static constexpr memory_space space = memory_space::device;

  /// n elements of T in device memory, grown by cudaMalloc when a resize needs more than it holds
  /// (contents are then unspecified), never shrunk. Move-only.
  template <class T>
  class buffer {
    static_assert(std::is_trivially_copyable_v<T>,
                  "cuda::device_memory::buffer holds trivially copyable elements");

   public:
    buffer() = default;
    buffer(buffer&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        release();
        p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0), cap_ = std::exchange(o.cap_, 0);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { release(); }

    /// n elements; throws backend_error when cudaMalloc fails (nothing changes then).
    void resize(std::size_t n) {
      if (n > cap_) {
        T* p = nullptr;
        detail::check(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc",
                      "cuda::device_memory::buffer");
        release();
        p_ = p, cap_ = n;
      }
      n_ = n;
    }
    [[nodiscard]] std::size_t size() const noexcept { return n_; }
    /// Device memory: pass it to kernels, copies and device communicators, never dereference it on the host.
    [[nodiscard]] std::span<T> span() noexcept { return {p_, n_}; }
    [[nodiscard]] std::span<const T> span() const noexcept { return {p_, n_}; }

   private:
    void release() noexcept {
      if (p_) cudaFree(p_);
      p_ = nullptr, n_ = 0, cap_ = 0;
    }
    T* p_ = nullptr;
    std::size_t n_ = 0, cap_ = 0;
  };

  /// Operations run on `s` (0: the legacy default stream).
  explicit device_memory(cudaStream_t s = nullptr) noexcept : s_(s) {}
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_; }

  template <class T>
  void copy(std::span<T> dst, std::span<const T> src) const {
    detail::require_equal(dst.size(), src.size(), "cuda::device_memory::copy");
    if (!dst.empty())
      detail::check(cudaMemcpyAsync(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDeviceToDevice, s_),
                    "cudaMemcpyAsync", "cuda::device_memory::copy");
  }
  template <class T>
  void fill(std::span<T> dst, T value) const {
    if (dst.empty()) return;
    detail::fill_kernel<<<detail::blocks_for(dst.size(), 256), 256, 0, s_>>>(dst.data(), dst.size(), value);
    detail::check(cudaGetLastError(), "fill_kernel launch", "cuda::device_memory::fill");
  }
  template <class T>
  void add(std::span<T> dst, std::span<const T> src) const {
    detail::require_equal(dst.size(), src.size(), "cuda::device_memory::add");
    if (dst.empty()) return;
    detail::add_kernel<<<detail::blocks_for(dst.size(), 256), 256, 0, s_>>>(dst.data(), src.data(),
                                                                            dst.size());
    detail::check(cudaGetLastError(), "add_kernel launch", "cuda::device_memory::add");
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
  /// seq::merge_partial on device rows: (out, lse) absorbs (out_b, lse_b); rows = lse.size().
  template <class T>
  void merge_attention(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                       std::size_t dim) const {
    if (lse.size() != lse_b.size() || out.size() != lse.size() * dim || out_b.size() != out.size())
      throw invalid_argument("cuda::device_memory::merge_attention: rows " + std::to_string(lse.size()) +
                             " and " + std::to_string(lse_b.size()) + ", out " + std::to_string(out.size()) +
                             " and " + std::to_string(out_b.size()) + ", dim " + std::to_string(dim) +
                             "; expected equal rows and out = rows x dim");
    if (lse.empty()) return;
    detail::merge_attention_kernel<<<detail::blocks_for(lse.size(), 8), 256, 0, s_>>>(
        out.data(), lse.data(), out_b.data(), lse_b.data(), lse.size(), dim,
        -std::numeric_limits<T>::infinity());
    detail::check(cudaGetLastError(), "merge_attention_kernel launch",
                  "cuda::device_memory::merge_attention");
  }
  /// seq::attention_delta on device rows: delta[r] = dot(dout row r, out row r); rows = delta.size().
  template <class T>
  void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta,
                       std::size_t dim) const {
    if (out.size() != dout.size() || out.size() != delta.size() * dim)
      throw invalid_argument("cuda::device_memory::attention_delta: out " + std::to_string(out.size()) +
                             ", dout " + std::to_string(dout.size()) + ", rows " +
                             std::to_string(delta.size()) + ", dim " + std::to_string(dim) +
                             "; expected out = dout = rows x dim");
    if (delta.empty()) return;
    detail::attention_delta_kernel<<<detail::blocks_for(delta.size(), 8), 256, 0, s_>>>(
        out.data(), dout.data(), delta.data(), delta.size(), dim);
    detail::check(cudaGetLastError(), "attention_delta_kernel launch",
                  "cuda::device_memory::attention_delta");
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
