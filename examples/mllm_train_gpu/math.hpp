// SPDX-License-Identifier: Apache-2.0
// The GPU example's layer kernels behind a plain C++ interface (no CUDA types: the stages and main.cpp are
// compiled by the host compiler, math.cu by nvcc). One object runs every kernel on one backend: the CUDA
// device (stream-ordered on one stream, GEMMs through cuBLAS), the host (the same kernel bodies as loops),
// or the host loops over emulated device memory. Every pointer is in the backend's memory. The operations
// mirror examples/mllm_train/layers.hpp one for one, so a stage written over them computes what the CPU
// example's stage computes (up to the order of floating-point sums). Row-major [rows][cols] throughout.
#pragma once

#include <cstdint>
#include <memory>

namespace mllm_gpu {

/// Where the kernels run.
enum class backend {
  host,      ///< loops on the calling thread, over host memory
  cuda,      ///< CUDA kernels and cuBLAS on one stream, over device memory
  emulated,  ///< the host loops over emulated device memory (hetmesh::emulated, core/memory_space.hpp):
             ///< every pointer must be an emulated device pointer (a host pointer is refused with
             ///< invalid_argument naming the call); the kernels read the host memory behind it. What a
             ///< CPU-only machine runs to show a stage hands its kernels device memory only.
};

/// The layer kernels of the example on one backend; T is float or double. Calls enqueue on the stream
/// (cuda) or run to completion (host); errors (a failed launch, a cuBLAS status) throw std::runtime_error
/// naming the call. Move-only; const calls may be made from one thread at a time per object.
template <class T>
class math {
 public:
  using i64 = std::int64_t;

  /// Kernels on `b`: for cuda, on the cudaStream_t `stream` (nullptr: the legacy default stream) of the
  /// current device, with a cuBLAS handle of its own bound to it; otherwise `stream` is ignored.
  explicit math(backend b, void* stream = nullptr);
  ~math();
  math(math&&) noexcept;
  math& operator=(math&&) noexcept;
  math(const math&) = delete;
  math& operator=(const math&) = delete;

  /// The backend.
  [[nodiscard]] backend where() const noexcept;
  /// Waits for every call enqueued so far (a no-op on host).
  void synchronize() const;

  // --- linear maps (mllm::matmul, add_xt_dy, add_dy_wt) ---------------------------------------------
  /// y[n][m] = x[n][k] w[k][m].
  void matmul(const T* x, const T* w, T* y, i64 n, i64 k, i64 m) const;
  /// dw[k][m] += x[n][k]^T dy[n][m].
  void add_xt_dy(const T* x, const T* dy, T* dw, i64 n, i64 k, i64 m) const;
  /// dx[n][k] += dy[n][m] w[k][m]^T.
  void add_dy_wt(const T* dy, const T* w, T* dx, i64 n, i64 k, i64 m) const;

  // --- elementwise -----------------------------------------------------------------------------------
  /// y[i] = value for i < n.
  void fill(T* y, T value, i64 n) const;
  /// y[i] += a[i] for i < n.
  void add(T* y, const T* a, i64 n) const;
  /// y[i] = a[i] for i < n.
  void copy(T* y, const T* a, i64 n) const;
  /// x[i][j] += b[j] over n rows of w.
  void add_bias(T* x, const T* b, i64 n, i64 w) const;
  /// db[j] += sum_i dx[i][j] over n rows of w.
  void add_column_sums(const T* dx, T* db, i64 n, i64 w) const;
  /// y = u sigmoid(u) (mllm::silu_forward).
  void silu_forward(const T* u, T* y, i64 n) const;
  /// du = dy silu'(u) (overwrites du; mllm::silu_backward).
  void silu_backward(const T* u, const T* dy, T* du, i64 n) const;

  // --- normalisation and positions -------------------------------------------------------------------
  /// RMSNorm of n rows of w: y = x rstd g, rstd[i] = 1 / sqrt(mean(x_i^2) + eps) (mllm::rmsnorm_forward).
  void rmsnorm_forward(const T* x, const T* g, T* y, T* rstd, i64 n, i64 w, double eps) const;
  /// dx += the input gradient of rmsnorm_forward for output gradient dy (mllm::rmsnorm_input_grad).
  void rmsnorm_input_grad(const T* x, const T* g, const T* rstd, const T* dy, T* dx, i64 n, i64 w) const;
  /// dg[e] += sum_i dy[i][e] x[i][e] rstd[i] (mllm::rmsnorm_gain_grad; one thread per column on cuda,
  /// summing rows in order: deterministic).
  void rmsnorm_gain_grad(const T* x, const T* rstd, const T* dy, T* dg, i64 n, i64 w) const;
  /// Rotary embedding in place on x [n][heads][head_dim] at positions pos[n] (device memory on cuda),
  /// `sign` -1 turns back (mllm::rope).
  void rope(T* x, const std::int64_t* pos, i64 n, i64 heads, i64 head_dim, double base, int sign) const;

  // --- embedding, landings, loss ---------------------------------------------------------------------
  /// h[t] = emb[tokens[t]] (rows of d) where tokens[t] >= 0; rows with tokens[t] < 0 are left as they are.
  /// Pre: tokens[t] < vocab (the caller checks).
  void embed(const std::int64_t* tokens, const T* emb, T* h, i64 n, i64 d) const;
  /// gemb[v] += sum over t with tokens[t] == v of dh[t] (rows of d), for every v < vocab; tokens < 0 add
  /// nothing. One thread per (v, column) on cuda, summing tokens in order: deterministic.
  void embed_grad(const std::int64_t* tokens, const T* dh, T* gemb, i64 n, i64 d, i64 vocab) const;
  /// dst[index[r]] = src[r] for r < rows (rows of w).
  void scatter_rows(const T* src, const std::int64_t* index, T* dst, i64 rows, i64 w) const;
  /// dst[r] = src[index[r]] for r < rows (rows of w).
  void gather_rows(const T* src, const std::int64_t* index, T* dst, i64 rows, i64 w) const;
  /// Per token t < n over logits[n][vocab]: where weights[t] != 0, loss[t] = weights[t] scale (lse_t -
  /// logits[t][targets[t]]) and dlogits[t][j] = weights[t] scale (softmax_t[j] - [j == targets[t]]); where
  /// weights[t] == 0, loss[t] = 0 and the row of dlogits is 0 (targets[t] is then not read). Pre: targets of
  /// counted tokens in [0, vocab) (the caller checks).
  void cross_entropy(const T* logits, const std::int64_t* targets, const T* weights, T scale, T* loss,
                     T* dlogits, i64 n, i64 vocab) const;

  // --- optimizer -------------------------------------------------------------------------------------
  /// One Adam(W) update of n parameters (train::adam's formula): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2)
  /// g^2, p -= lr (m / c1 / (sqrt(v / c2) + eps) + wd p) with c1 = 1 - b1^t, c2 = 1 - b2^t (t counts
  /// from 1).
  void adam(T* p, const T* g, T* m, T* v, i64 n, T lr, T beta1, T beta2, T eps, T weight_decay,
            std::int64_t t) const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

extern template class math<float>;
extern template class math<double>;

/// CUDA devices visible (0 where the runtime finds none or fails).
[[nodiscard]] int cuda_devices();

}  // namespace mllm_gpu
