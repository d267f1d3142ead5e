// SPDX-License-Identifier: Apache-2.0
// The GPU example's execution layer: one body per kernel, run as a CUDA kernel on the device or as a
// plain loop on the host (`for_each`), and row-major GEMMs through cuBLAS or
// a host loop. Compiled by nvcc with --extended-lambda (bodies are __host__ __device__ lambdas).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace mllm_gpu::detail {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

/// Where kernels run: the host (a loop) or a CUDA stream with its cuBLAS handle.
struct exec {
  bool cuda = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};

template <class F>
__global__ void for_each_kernel(std::int64_t n, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    f(i);
}

/// f(i) for i in [0, n): one device thread each on cuda, a loop on the host.
template <class F>
void for_each(const exec& x, std::int64_t n, F f) {
  if (n <= 0) return;
  if (x.cuda) {
    constexpr int block = 128;
    const std::int64_t blocks = (n + block - 1) / block;
    for_each_kernel<<<static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8), block, 0, x.stream>>>(
        n, f);
    cuda_check(cudaGetLastError(), "kernel launch");
  } else {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
}

inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                int k, const float* alpha, const float* a, int lda, const float* b, int ldb,
                                const float* beta, float* c, int ldc) {
  return cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                int k, const double* alpha, const double* a, int lda, const double* b,
                                int ldb, const double* beta, double* c, int ldc) {
  return cublasDgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Row-major C[m][n] = op(A) op(B) + beta C, op(A) m x k (A is k x m when ta), op(B) k x n (B is n x k
/// when tb). cuBLAS (column-major) computes C^T = op(B)^T op(A)^T with the operands swapped.
template <class T>
void gemm(const exec& x, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          const T* b, T beta, T* c) {
  if (m == 0 || n == 0) return;
  if (x.cuda) {
    const T one = 1;
    blas_check(
        gemm_call(x.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                  static_cast<int>(m), static_cast<int>(k), &one, b, static_cast<int>(tb ? k : n), a,
                  static_cast<int>(ta ? m : k), &beta, c, static_cast<int>(n)),
        "cublas gemm");
    return;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    T* ci = c + i * n;
    for (std::int64_t j = 0; j < n; ++j) ci[j] = beta == T(0) ? T(0) : beta * ci[j];
    for (std::int64_t e = 0; e < k; ++e) {
      const T av = ta ? a[e * m + i] : a[i * k + e];
      if (tb) {
        for (std::int64_t j = 0; j < n; ++j) ci[j] += av * b[j * k + e];
      } else {
        const T* be = b + e * n;
        for (std::int64_t j = 0; j < n; ++j) ci[j] += av * be[j];
      }
    }
  }
}

}  // namespace mllm_gpu::detail
