// SPDX-License-Identifier: Apache-2.0
// The GPU example's layer kernels (math.hpp): one __host__ __device__ body per kernel, run by
// detail::for_each as a CUDA kernel on the object's stream or as a loop on the host, and the linear maps
// through detail::gemm (cuBLAS or a host loop). Every reduction is a loop of one thread in a fixed order
// (no atomics), so results are deterministic and the host path adds in the order of the CPU reference
// (examples/mllm_train/layers.hpp).
#include "mllm_train_gpu/math.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <hetmesh/core/memory_space.hpp>

#include "mllm_train_gpu/kernels.cuh"

namespace mllm_gpu {

int cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

namespace detail {

using i64 = std::int64_t;

// T's exp and sqrt on both sides (expf / sqrtf for float, as std::exp / std::sqrt of a float on the host).
template <class T>
__host__ __device__ inline T exp_t(T a) {
  if constexpr (std::is_same_v<T, float>)
    return expf(a);
  else
    return exp(a);
}
template <class T>
__host__ __device__ inline T sqrt_t(T a) {
  if constexpr (std::is_same_v<T, float>)
    return sqrtf(a);
  else
    return sqrt(a);
}
template <class T>
__host__ __device__ inline T log_t(T a) {
  if constexpr (std::is_same_v<T, float>)
    return logf(a);
  else
    return log(a);
}

/// The kernels of math<T> (extended lambdas must live where nvcc can name them from outside: not in
/// math<T>'s private impl).
template <class T>
struct kernels {
  exec x;

  void fill(T* y, T value, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { y[i] = value; });
  }
  void add(T* y, const T* a, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { y[i] += a[i]; });
  }
  void copy(T* y, const T* a, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { y[i] = a[i]; });
  }
  void add_bias(T* xs, const T* b, i64 n, i64 w) const {
    if (w <= 0) return;
    for_each(x, n * w, [=] __host__ __device__(i64 i) { xs[i] += b[i % w]; });
  }
  // One thread per column, rows in order.
  void add_column_sums(const T* dx, T* db, i64 n, i64 w) const {
    if (n <= 0) return;
    for_each(x, w, [=] __host__ __device__(i64 j) {
      T acc = db[j];
      for (i64 i = 0; i < n; ++i) acc += dx[i * w + j];
      db[j] = acc;
    });
  }
  void silu_forward(const T* u, T* y, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { y[i] = u[i] / (T(1) + exp_t(-u[i])); });
  }
  void silu_backward(const T* u, const T* dy, T* du, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) {
      const T s = T(1) / (T(1) + exp_t(-u[i]));
      du[i] = dy[i] * s * (T(1) + u[i] * (T(1) - s));
    });
  }

  // One thread per row.
  void rmsnorm_forward(const T* xs, const T* g, T* y, T* rstd, i64 n, i64 w, double eps) const {
    const T e = static_cast<T>(eps);
    for_each(x, n, [=] __host__ __device__(i64 i) {
      T s = 0;
      for (i64 c = 0; c < w; ++c) s += xs[i * w + c] * xs[i * w + c];
      const T r = T(1) / sqrt_t(s / static_cast<T>(w) + e);
      rstd[i] = r;
      for (i64 c = 0; c < w; ++c) y[i * w + c] = xs[i * w + c] * r * g[c];
    });
  }
  // One thread per row.
  void rmsnorm_input_grad(const T* xs, const T* g, const T* rstd, const T* dy, T* dx, i64 n, i64 w) const {
    for_each(x, n, [=] __host__ __device__(i64 i) {
      const T r = rstd[i];
      T dot = 0;
      for (i64 c = 0; c < w; ++c) dot += g[c] * dy[i * w + c] * xs[i * w + c] * r;
      dot /= static_cast<T>(w);
      for (i64 c = 0; c < w; ++c) dx[i * w + c] += r * (g[c] * dy[i * w + c] - xs[i * w + c] * r * dot);
    });
  }
  // One thread per column, rows in order.
  void rmsnorm_gain_grad(const T* xs, const T* rstd, const T* dy, T* dg, i64 n, i64 w) const {
    if (n <= 0) return;
    for_each(x, w, [=] __host__ __device__(i64 c) {
      T acc = dg[c];
      for (i64 i = 0; i < n; ++i) acc += dy[i * w + c] * xs[i * w + c] * rstd[i];
      dg[c] = acc;
    });
  }
  // One thread per (token, head, pair); the angle in double as in mllm::rope.
  void rope(T* xs, const std::int64_t* pos, i64 n, i64 heads, i64 head_dim, double base, int sign) const {
    const i64 half = head_dim / 2;
    if (half <= 0 || heads <= 0) return;
    for_each(x, n * heads * half, [=] __host__ __device__(i64 idx) {
      const i64 t = idx / (heads * half), h = (idx / half) % heads, i = idx % half;
      const double freq = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double ang = static_cast<double>(pos[t]) * freq;
      const T c = static_cast<T>(cos(ang)), s = static_cast<T>(sign) * static_cast<T>(sin(ang));
      T* p = xs + (t * heads + h) * head_dim + 2 * i;
      const T a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    });
  }

  void embed(const std::int64_t* tokens, const T* emb, T* h, i64 n, i64 d) const {
    if (d <= 0) return;
    for_each(x, n * d, [=] __host__ __device__(i64 idx) {
      const i64 t = idx / d, c = idx % d;
      const std::int64_t v = tokens[t];
      if (v >= 0) h[idx] = emb[v * d + c];
    });
  }
  // One thread per (vocabulary row, column), tokens in order.
  void embed_grad(const std::int64_t* tokens, const T* dh, T* gemb, i64 n, i64 d, i64 vocab) const {
    if (n <= 0 || d <= 0) return;
    for_each(x, vocab * d, [=] __host__ __device__(i64 idx) {
      const i64 v = idx / d, c = idx % d;
      T acc = gemb[idx];
      for (i64 t = 0; t < n; ++t)
        if (tokens[t] == v) acc += dh[t * d + c];
      gemb[idx] = acc;
    });
  }
  void scatter_rows(const T* src, const std::int64_t* index, T* dst, i64 rows, i64 w) const {
    if (w <= 0) return;
    for_each(x, rows * w, [=] __host__ __device__(i64 idx) {
      const i64 r = idx / w, c = idx % w;
      dst[index[r] * w + c] = src[idx];
    });
  }
  void gather_rows(const T* src, const std::int64_t* index, T* dst, i64 rows, i64 w) const {
    if (w <= 0) return;
    for_each(x, rows * w, [=] __host__ __device__(i64 idx) {
      const i64 r = idx / w, c = idx % w;
      dst[idx] = src[index[r] * w + c];
    });
  }
  // One thread per token row: max, sum of exponentials, log-sum-exp, then the row of dlogits.
  void cross_entropy(const T* logits, const std::int64_t* targets, const T* weights, T scale, T* loss,
                     T* dlogits, i64 n, i64 vocab) const {
    if (vocab <= 0) {  // no logits: nothing is counted (a zero-width row has no target)
      fill(loss, T(0), n);
      return;
    }
    for_each(x, n, [=] __host__ __device__(i64 t) {
      const T* z = logits + t * vocab;
      T* dz = dlogits + t * vocab;
      const T wt = weights[t];
      if (wt == T(0)) {
        loss[t] = T(0);
        for (i64 j = 0; j < vocab; ++j) dz[j] = T(0);
        return;
      }
      const i64 tg = targets[t];
      const T cw = wt * scale;
      T m = z[0];
      for (i64 j = 1; j < vocab; ++j) m = z[j] > m ? z[j] : m;
      T sum = 0;
      for (i64 j = 0; j < vocab; ++j) sum += exp_t(z[j] - m);
      const T lse = m + log_t(sum);
      loss[t] = cw * (lse - z[tg]);
      for (i64 j = 0; j < vocab; ++j) dz[j] = cw * (exp_t(z[j] - m) / sum - (j == tg ? T(1) : T(0)));
    });
  }

  void adam(T* p, const T* g, T* m, T* v, i64 n, T lr, T b1, T b2, T eps, T wd, T c1, T c2) const {
    for_each(x, n, [=] __host__ __device__(i64 i) {
      m[i] = b1 * m[i] + (T(1) - b1) * g[i];
      v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
      const T mh = m[i] / c1, vh = v[i] / c2;
      p[i] -= lr * (mh / (sqrt_t(vh) + eps) + wd * p[i]);
    });
  }
};

/// Runs f, rethrowing a std::runtime_error with the call's name in front.
template <class F>
void named(const char* what, F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("mllm_gpu::math::") + what + ": " + e.what());
  }
}

}  // namespace detail

template <class T>
struct math<T>::impl {
  backend b = backend::host;
  detail::kernels<T> k{};
  /// A pointer argument in the memory the kernels read: itself, or on the emulated backend the host
  /// memory behind an emulated device pointer (hetmesh::emulated::to_host: a host pointer is refused,
  /// naming the call).
  template <class P>
  P* at(P* p, const char* who) const {
    return b == backend::emulated ? hetmesh::emulated::to_host(p, who) : p;
  }
};

template <class T>
math<T>::math(backend b, void* stream) : p_(std::make_unique<impl>()) {
  p_->b = b;
  if (b != backend::cuda) return;
  auto& x = p_->k.x;
  x.cuda = true;
  x.stream = static_cast<cudaStream_t>(stream);
  detail::named("math", [&] {
    detail::blas_check(cublasCreate(&x.blas), "cublasCreate");
    const cublasStatus_t s = cublasSetStream(x.blas, x.stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(x.blas);
      x.blas = nullptr;
      detail::blas_check(s, "cublasSetStream");
    }
  });
}

template <class T>
math<T>::~math() {
  if (!p_ || !p_->k.x.cuda) return;
  cudaStreamSynchronize(p_->k.x.stream);
  if (p_->k.x.blas) cublasDestroy(p_->k.x.blas);
}

template <class T>
math<T>::math(math&&) noexcept = default;

template <class T>
math<T>& math<T>::operator=(math&& o) noexcept {
  if (this != &o) {
    math dying(std::move(*this));  // releases this object's handle
    p_ = std::move(o.p_);
  }
  return *this;
}

template <class T>
backend math<T>::where() const noexcept {
  return p_ ? p_->b : backend::host;
}

template <class T>
void math<T>::synchronize() const {
  if (!p_->k.x.cuda) return;
  detail::named("synchronize",
                [&] { detail::cuda_check(cudaStreamSynchronize(p_->k.x.stream), "cudaStreamSynchronize"); });
}

// --- linear maps ------------------------------------------------------------------------------------

template <class T>
void math<T>::matmul(const T* x_arg, const T* w_arg, T* y_arg, i64 n, i64 k, i64 m) const {
  const T* x = p_->at(x_arg, "mllm_gpu::math::matmul");
  const T* w = p_->at(w_arg, "mllm_gpu::math::matmul");
  T* y = p_->at(y_arg, "mllm_gpu::math::matmul");
  detail::named("matmul", [&] {
    if (k == 0)
      p_->k.fill(y, T(0), n * m);
    else
      detail::gemm<T>(p_->k.x, false, false, n, m, k, x, w, T(0), y);
  });
}

template <class T>
void math<T>::add_xt_dy(const T* x_arg, const T* dy_arg, T* dw_arg, i64 n, i64 k, i64 m) const {
  const T* x = p_->at(x_arg, "mllm_gpu::math::add_xt_dy");
  const T* dy = p_->at(dy_arg, "mllm_gpu::math::add_xt_dy");
  T* dw = p_->at(dw_arg, "mllm_gpu::math::add_xt_dy");
  if (n == 0) return;  // adds nothing
  detail::named("add_xt_dy", [&] { detail::gemm<T>(p_->k.x, true, false, k, m, n, x, dy, T(1), dw); });
}

template <class T>
void math<T>::add_dy_wt(const T* dy_arg, const T* w_arg, T* dx_arg, i64 n, i64 k, i64 m) const {
  const T* dy = p_->at(dy_arg, "mllm_gpu::math::add_dy_wt");
  const T* w = p_->at(w_arg, "mllm_gpu::math::add_dy_wt");
  T* dx = p_->at(dx_arg, "mllm_gpu::math::add_dy_wt");
  if (m == 0) return;  // adds nothing
  detail::named("add_dy_wt", [&] { detail::gemm<T>(p_->k.x, false, true, n, k, m, dy, w, T(1), dx); });
}

// --- elementwise ------------------------------------------------------------------------------------

template <class T>
void math<T>::fill(T* y_arg, T value, i64 n) const {
  T* y = p_->at(y_arg, "mllm_gpu::math::fill");
  detail::named("fill", [&] { p_->k.fill(y, value, n); });
}
template <class T>
void math<T>::add(T* y_arg, const T* a_arg, i64 n) const {
  T* y = p_->at(y_arg, "mllm_gpu::math::add");
  const T* a = p_->at(a_arg, "mllm_gpu::math::add");
  detail::named("add", [&] { p_->k.add(y, a, n); });
}
template <class T>
void math<T>::copy(T* y_arg, const T* a_arg, i64 n) const {
  T* y = p_->at(y_arg, "mllm_gpu::math::copy");
  const T* a = p_->at(a_arg, "mllm_gpu::math::copy");
  detail::named("copy", [&] { p_->k.copy(y, a, n); });
}
template <class T>
void math<T>::add_bias(T* x_arg, const T* b_arg, i64 n, i64 w) const {
  T* x = p_->at(x_arg, "mllm_gpu::math::add_bias");
  const T* b = p_->at(b_arg, "mllm_gpu::math::add_bias");
  detail::named("add_bias", [&] { p_->k.add_bias(x, b, n, w); });
}
template <class T>
void math<T>::add_column_sums(const T* dx_arg, T* db_arg, i64 n, i64 w) const {
  const T* dx = p_->at(dx_arg, "mllm_gpu::math::add_column_sums");
  T* db = p_->at(db_arg, "mllm_gpu::math::add_column_sums");
  detail::named("add_column_sums", [&] { p_->k.add_column_sums(dx, db, n, w); });
}
template <class T>
void math<T>::silu_forward(const T* u_arg, T* y_arg, i64 n) const {
  const T* u = p_->at(u_arg, "mllm_gpu::math::silu_forward");
  T* y = p_->at(y_arg, "mllm_gpu::math::silu_forward");
  detail::named("silu_forward", [&] { p_->k.silu_forward(u, y, n); });
}
template <class T>
void math<T>::silu_backward(const T* u_arg, const T* dy_arg, T* du_arg, i64 n) const {
  const T* u = p_->at(u_arg, "mllm_gpu::math::silu_backward");
  const T* dy = p_->at(dy_arg, "mllm_gpu::math::silu_backward");
  T* du = p_->at(du_arg, "mllm_gpu::math::silu_backward");
  detail::named("silu_backward", [&] { p_->k.silu_backward(u, dy, du, n); });
}

// --- normalisation and positions --------------------------------------------------------------------

template <class T>
void math<T>::rmsnorm_forward(const T* x_arg, const T* g_arg, T* y_arg, T* rstd_arg, i64 n, i64 w,
                              double eps) const {
  const T* x = p_->at(x_arg, "mllm_gpu::math::rmsnorm_forward");
  const T* g = p_->at(g_arg, "mllm_gpu::math::rmsnorm_forward");
  T* y = p_->at(y_arg, "mllm_gpu::math::rmsnorm_forward");
  T* rstd = p_->at(rstd_arg, "mllm_gpu::math::rmsnorm_forward");
  detail::named("rmsnorm_forward", [&] { p_->k.rmsnorm_forward(x, g, y, rstd, n, w, eps); });
}
template <class T>
void math<T>::rmsnorm_input_grad(const T* x_arg, const T* g_arg, const T* rstd_arg, const T* dy_arg,
                                 T* dx_arg, i64 n, i64 w) const {
  const T* x = p_->at(x_arg, "mllm_gpu::math::rmsnorm_input_grad");
  const T* g = p_->at(g_arg, "mllm_gpu::math::rmsnorm_input_grad");
  const T* rstd = p_->at(rstd_arg, "mllm_gpu::math::rmsnorm_input_grad");
  const T* dy = p_->at(dy_arg, "mllm_gpu::math::rmsnorm_input_grad");
  T* dx = p_->at(dx_arg, "mllm_gpu::math::rmsnorm_input_grad");
  detail::named("rmsnorm_input_grad", [&] { p_->k.rmsnorm_input_grad(x, g, rstd, dy, dx, n, w); });
}
template <class T>
void math<T>::rmsnorm_gain_grad(const T* x_arg, const T* rstd_arg, const T* dy_arg, T* dg_arg, i64 n,
                                i64 w) const {
  const T* x = p_->at(x_arg, "mllm_gpu::math::rmsnorm_gain_grad");
  const T* rstd = p_->at(rstd_arg, "mllm_gpu::math::rmsnorm_gain_grad");
  const T* dy = p_->at(dy_arg, "mllm_gpu::math::rmsnorm_gain_grad");
  T* dg = p_->at(dg_arg, "mllm_gpu::math::rmsnorm_gain_grad");
  detail::named("rmsnorm_gain_grad", [&] { p_->k.rmsnorm_gain_grad(x, rstd, dy, dg, n, w); });
}
template <class T>
void math<T>::rope(T* x_arg, const std::int64_t* pos_arg, i64 n, i64 heads, i64 head_dim, double base,
                   int sign) const {
  T* x = p_->at(x_arg, "mllm_gpu::math::rope");
  const std::int64_t* pos = p_->at(pos_arg, "mllm_gpu::math::rope");
  detail::named("rope", [&] { p_->k.rope(x, pos, n, heads, head_dim, base, sign); });
}

// --- embedding, landings, loss ----------------------------------------------------------------------

template <class T>
void math<T>::embed(const std::int64_t* tokens_arg, const T* emb_arg, T* h_arg, i64 n, i64 d) const {
  const std::int64_t* tokens = p_->at(tokens_arg, "mllm_gpu::math::embed");
  const T* emb = p_->at(emb_arg, "mllm_gpu::math::embed");
  T* h = p_->at(h_arg, "mllm_gpu::math::embed");
  detail::named("embed", [&] { p_->k.embed(tokens, emb, h, n, d); });
}
template <class T>
void math<T>::embed_grad(const std::int64_t* tokens_arg, const T* dh_arg, T* gemb_arg, i64 n, i64 d,
                         i64 vocab) const {
  const std::int64_t* tokens = p_->at(tokens_arg, "mllm_gpu::math::embed_grad");
  const T* dh = p_->at(dh_arg, "mllm_gpu::math::embed_grad");
  T* gemb = p_->at(gemb_arg, "mllm_gpu::math::embed_grad");
  detail::named("embed_grad", [&] { p_->k.embed_grad(tokens, dh, gemb, n, d, vocab); });
}
template <class T>
void math<T>::scatter_rows(const T* src_arg, const std::int64_t* index_arg, T* dst_arg, i64 rows,
                           i64 w) const {
  const T* src = p_->at(src_arg, "mllm_gpu::math::scatter_rows");
  const std::int64_t* index = p_->at(index_arg, "mllm_gpu::math::scatter_rows");
  T* dst = p_->at(dst_arg, "mllm_gpu::math::scatter_rows");
  detail::named("scatter_rows", [&] { p_->k.scatter_rows(src, index, dst, rows, w); });
}
template <class T>
void math<T>::gather_rows(const T* src_arg, const std::int64_t* index_arg, T* dst_arg, i64 rows,
                          i64 w) const {
  const T* src = p_->at(src_arg, "mllm_gpu::math::gather_rows");
  const std::int64_t* index = p_->at(index_arg, "mllm_gpu::math::gather_rows");
  T* dst = p_->at(dst_arg, "mllm_gpu::math::gather_rows");
  detail::named("gather_rows", [&] { p_->k.gather_rows(src, index, dst, rows, w); });
}
template <class T>
void math<T>::cross_entropy(const T* logits_arg, const std::int64_t* targets_arg, const T* weights_arg,
                            T scale, T* loss_arg, T* dlogits_arg, i64 n, i64 vocab) const {
  const T* logits = p_->at(logits_arg, "mllm_gpu::math::cross_entropy");
  const std::int64_t* targets = p_->at(targets_arg, "mllm_gpu::math::cross_entropy");
  const T* weights = p_->at(weights_arg, "mllm_gpu::math::cross_entropy");
  T* loss = p_->at(loss_arg, "mllm_gpu::math::cross_entropy");
  T* dlogits = p_->at(dlogits_arg, "mllm_gpu::math::cross_entropy");
  detail::named("cross_entropy",
                [&] { p_->k.cross_entropy(logits, targets, weights, scale, loss, dlogits, n, vocab); });
}

// --- optimizer --------------------------------------------------------------------------------------

template <class T>
void math<T>::adam(T* p_arg, const T* g_arg, T* m_arg, T* v_arg, i64 n, T lr, T beta1, T beta2, T eps,
                   T weight_decay, std::int64_t t) const {
  T* p = p_->at(p_arg, "mllm_gpu::math::adam");
  const T* g = p_->at(g_arg, "mllm_gpu::math::adam");
  T* m = p_->at(m_arg, "mllm_gpu::math::adam");
  T* v = p_->at(v_arg, "mllm_gpu::math::adam");
  // The bias corrections as train::adam computes them: the power in double, cast to T.
  const T c1 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const T c2 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  detail::named("adam", [&] { p_->k.adam(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, c1, c2); });
}

template class math<float>;
template class math<double>;

}  // namespace mllm_gpu
