// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda::device_reference_attention: the device counterpart of model::reference_attention, a model of
// model::attention_kernel for float and double whose tensors are device memory. Exact block attention
// under the per-document causal or full mask with grouped-query heads, correctness first (one thread per
// row, no tiling, no tensor cores): the kernel tests and small device runs compare against.
//
// Two headers, because nvcc cannot compile fmt (core/error.hpp): this one is plain C++ (g++ compiles it;
// it includes only the CUDA runtime API and core/) and declares the host launchers; the __global__
// kernels and the launchers' definitions are in attention_kernels.cuh, which a program includes in
// exactly ONE of its .cu files (the launchers are ordinary functions: a second inclusion is a
// duplicate-symbol link error). Every other translation unit includes only this header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"

namespace hetmesh::cuda {

/// One attention block as the launchers take it: device pointers and sizes. Layouts as
/// model::attention_block: q [nq][q_heads][head_dim], k and v [nk][kv_heads][head_dim]; q_doc, q_pos
/// [nq] and k_doc, k_pos [nk] are device copies of the block's metadata. Query row r = token * q_heads +
/// head reads KV head head / (q_heads / kv_heads).
template <class T>
struct attention_args {
  const T* q = nullptr;                 ///< [nq][q_heads][head_dim], device
  const T* k = nullptr;                 ///< [nk][kv_heads][head_dim], device
  const T* v = nullptr;                 ///< [nk][kv_heads][head_dim], device
  const std::int64_t* q_doc = nullptr;  ///< [nq] document ids, device
  const std::int64_t* q_pos = nullptr;  ///< [nq] positions in the document, device
  const std::int64_t* k_doc = nullptr;  ///< [nk] document ids, device
  const std::int64_t* k_pos = nullptr;  ///< [nk] positions in the document, device
  std::int64_t nq = 0;                  ///< query tokens
  std::int64_t nk = 0;                  ///< key tokens
  int q_heads = 1;                      ///< query heads
  int kv_heads = 1;                     ///< key/value heads, dividing q_heads
  int head_dim = 1;                     ///< elements per head
  bool causal = true;                   ///< causal by position within a document; false: full
  T scale = T(1);                       ///< softmax scale
};

/// Forward of one block: out [nq][q_heads][head_dim] and lse [nq][q_heads], device, overwritten.
template <class T>
struct attention_forward_args {
  attention_args<T> block;  ///< the block's tensors and metadata
  T* out = nullptr;         ///< [nq][q_heads][head_dim], overwritten
  T* lse = nullptr;         ///< [nq][q_heads], overwritten
};

/// Backward of one block: dout [nq][q_heads][head_dim], the merged lse and delta [nq][q_heads]; dq, dk,
/// dv accumulated. All device memory.
template <class T>
struct attention_backward_args {
  attention_args<T> block;   ///< the block's tensors and metadata
  const T* dout = nullptr;   ///< [nq][q_heads][head_dim]
  const T* lse = nullptr;    ///< [nq][q_heads], merged over every block of the query rows
  const T* delta = nullptr;  ///< [nq][q_heads]
  T* dq = nullptr;           ///< [nq][q_heads][head_dim], accumulated
  T* dk = nullptr;           ///< [nk][kv_heads][head_dim], accumulated
  T* dv = nullptr;           ///< [nk][kv_heads][head_dim], accumulated
};

/// The host launchers of the reference kernels, defined in attention_kernels.cuh. Each checks the
/// shape (invalid_argument: positive heads and head size, kv_heads dividing q_heads, nq, nk >= 0),
/// enqueues its kernels on `stream` and returns (backend_error when a launch fails). Not collective;
/// deterministic (no atomics: each output element is written by one thread, in the reference's order).
/// Cost: forward O(nq * nk * q_heads * head_dim); backward twice that (the scores are recomputed for dq
/// and for dk, dv).
namespace kernels {
void attention_forward(const attention_forward_args<float>& a, cudaStream_t stream);
void attention_forward(const attention_forward_args<double>& a, cudaStream_t stream);
void attention_backward(const attention_backward_args<float>& a, cudaStream_t stream);
void attention_backward(const attention_backward_args<double>& a, cudaStream_t stream);
}  // namespace kernels

namespace detail {

template <class T>
inline constexpr bool attention_element = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The element type of a model::attention_block-like B (its q span's element, without const).
template <class B>
using attention_element_t = std::remove_const_t<typename decltype(B::q)::element_type>;

inline std::string attention_str(std::size_t v) { return std::to_string(v); }

inline void attention_check(cudaError_t status, const char* call, const char* who) {
  if (status != cudaSuccess)
    throw backend_error(std::string(who) + ": " + call + " failed: " + cudaGetErrorString(status) + " (" +
                            cudaGetErrorName(status) + ")",
                        static_cast<int>(status));
}

}  // namespace detail

/// The reference attention kernel on the device: model::attention_kernel for float and double.
/// Contract: as model::reference_attention (model/reference_attention.hpp), for every block: a query
/// sees a key of the same document (under causal, at a position at most its own); forward overwrites
/// out = softmax(scale q k^T) v over the visible keys of KV head h / (q_heads / kv_heads) and lse = the
/// rows' natural log-sum-exp, a row that sees no key getting lse = -infinity and out = 0; backward, from
/// the merged lse and delta, ADDS dv += P^T dout, dq += scale dS k, dk += scale dS^T q (dS = P * (dout
/// v^T - delta)), rows with lse = -infinity contributing nothing, and never clears dq, dk, dv.
/// Memory: the tensors (q, k, v, out, lse, dout, delta, dq, dk, dv) are device memory; the metadata
/// (q_doc, q_pos, k_doc, k_pos) host memory, valid for the call only: each call copies it into a host
/// staging vector and uploads it to a device scratch buffer the object owns (grown, never shrunk), on
/// `stream`.
/// Stream-ordered: forward and backward return once their copies and kernels are enqueued on `stream`
/// (the stream the caller's memory policy and communicator share); results are complete when the stream
/// is. Calls on one object must share one stream, or the caller synchronises the previous stream before
/// changing it (the scratch is reused by the next call). One object per host thread.
/// Errors: invalid_argument for sizes that do not match (naming what was passed and what was expected) or
/// a mask that is neither full nor causal; backend_error when a CUDA call fails. Deterministic: the same
/// block on the same device gives bitwise the same results; close to the CPU reference (each output
/// element is accumulated in the CPU's order; exp, log and fused multiply-adds round differently).
/// Cost: as kernels::attention_forward / attention_backward, plus one upload of 2 * (nq + nk) int64.
/// Copying an object copies its stream, not its scratch. The members are templates on the block and
/// output types (cuda/ cannot name model/), so outputs are passed typed (model::attention_forward_out<T>
/// {out, lse}), not as braced lists.
struct device_reference_attention {
  cudaStream_t stream = nullptr;  ///< where copies and kernels are enqueued (null: the legacy stream)

  device_reference_attention() = default;
  /// A kernel that enqueues on `s`.
  explicit device_reference_attention(cudaStream_t s) noexcept : stream(s) {}
  /// A kernel on `o`'s stream, with scratch of its own.
  device_reference_attention(const device_reference_attention& o) : stream(o.stream) {}
  /// Takes `o`'s stream; keeps its own scratch.
  device_reference_attention& operator=(const device_reference_attention& o) {
    stream = o.stream;
    return *this;
  }
  /// Takes `o`'s stream and scratch.
  device_reference_attention(device_reference_attention&& o) noexcept
      : stream(o.stream),
        scratch_(std::exchange(o.scratch_, nullptr)),
        capacity_(std::exchange(o.capacity_, 0)),
        staging_(std::move(o.staging_)) {}
  /// Frees this kernel's scratch and takes `o`'s stream and scratch.
  device_reference_attention& operator=(device_reference_attention&& o) noexcept {
    if (this != &o) {
      release();
      stream = o.stream;
      scratch_ = std::exchange(o.scratch_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
      staging_ = std::move(o.staging_);
    }
    return *this;
  }
  ~device_reference_attention() { release(); }

  /// Forward of one block (B: model::attention_block<T>, O: model::attention_forward_out<T>, T float or
  /// double). Pre: spans sized as attention_block describes, out.out of nq*q_heads*head_dim and out.lse
  /// of nq*q_heads elements (invalid_argument otherwise); mask full or causal. Post: enqueued on stream.
  template <class B, class O>
  requires detail::attention_element<detail::attention_element_t<B>>
  void forward(const B& b, O out) {
    using T = detail::attention_element_t<B>;
    const char* who = "cuda::device_reference_attention::forward";
    attention_forward_args<T> a;
    a.block = prepare<T>(b, who);
    const std::size_t nq = b.q_doc.size(), hq = static_cast<std::size_t>(b.shape.q_heads);
    if (out.out.size() != b.q.size() || out.lse.size() != nq * hq)
      throw invalid_argument(std::string(who) + ": out of " + detail::attention_str(out.out.size()) +
                             " and lse of " + detail::attention_str(out.lse.size()) + " elements for " +
                             detail::attention_str(nq) + " query tokens; expected " +
                             detail::attention_str(b.q.size()) + " and " + detail::attention_str(nq * hq));
    a.out = out.out.data();
    a.lse = out.lse.data();
    upload(b, who);
    set_metadata(a.block, b.q_doc.size());
    kernels::attention_forward(a, stream);
  }

  /// Backward of one block (B: model::attention_block<T>, IO: model::attention_backward_io<T>). Pre:
  /// spans sized as attention_block and attention_backward_io describe (invalid_argument otherwise).
  /// Post: enqueued on stream; dq, dk, dv accumulated once it completes.
  template <class B, class IO>
  requires detail::attention_element<detail::attention_element_t<B>>
  void backward(const B& b, IO io) {
    using T = detail::attention_element_t<B>;
    const char* who = "cuda::device_reference_attention::backward";
    attention_backward_args<T> a;
    a.block = prepare<T>(b, who);
    const std::size_t rows = b.q_doc.size() * static_cast<std::size_t>(b.shape.q_heads);
    if (io.dout.size() != b.q.size() || io.dq.size() != b.q.size() || io.lse.size() != rows ||
        io.delta.size() != rows || io.dk.size() != b.k.size() || io.dv.size() != b.k.size())
      throw invalid_argument(
          std::string(who) + ": dout " + detail::attention_str(io.dout.size()) + ", dq " +
          detail::attention_str(io.dq.size()) + ", lse " + detail::attention_str(io.lse.size()) + ", delta " +
          detail::attention_str(io.delta.size()) + ", dk " + detail::attention_str(io.dk.size()) + ", dv " +
          detail::attention_str(io.dv.size()) + " elements; expected dout and dq " +
          detail::attention_str(b.q.size()) + ", lse and delta " + detail::attention_str(rows) +
          ", dk and dv " + detail::attention_str(b.k.size()));
    a.dout = io.dout.data();
    a.lse = io.lse.data();
    a.delta = io.delta.data();
    a.dq = io.dq.data();
    a.dk = io.dk.data();
    a.dv = io.dv.data();
    upload(b, who);
    set_metadata(a.block, b.q_doc.size());
    kernels::attention_backward(a, stream);
  }

 private:
  // Checks the block's shape, mask and sizes (as model::reference_attention does) and fills the tensor
  // part of the launch arguments.
  template <class T, class B>
  static attention_args<T> prepare(const B& b, const char* who) {
    const auto& s = b.shape;
    if (s.q_heads < 1 || s.kv_heads < 1 || s.head_dim < 1 || s.q_heads % s.kv_heads != 0)
      throw invalid_argument(std::string(who) + ": shape q_heads=" + std::to_string(s.q_heads) +
                             ", kv_heads=" + std::to_string(s.kv_heads) +
                             ", head_dim=" + std::to_string(s.head_dim) +
                             "; expected positive values with kv_heads dividing q_heads");
    using mask_t = decltype(b.mask);
    if (b.mask != mask_t::causal && b.mask != mask_t::full)
      throw invalid_argument(std::string(who) + ": called with block mask " +
                             std::to_string(static_cast<long long>(b.mask)) +
                             " (none); expected full or causal");
    const std::size_t nq = b.q_doc.size(), nk = b.k_doc.size(), hq = static_cast<std::size_t>(s.q_heads),
                      hk = static_cast<std::size_t>(s.kv_heads), dim = static_cast<std::size_t>(s.head_dim);
    if (b.q_pos.size() != nq || b.k_pos.size() != nk || b.q.size() != nq * hq * dim ||
        b.k.size() != nk * hk * dim || b.v.size() != b.k.size())
      throw invalid_argument(
          std::string(who) + ": " + detail::attention_str(nq) + " query tokens (" +
          detail::attention_str(b.q_pos.size()) + " positions, q of " + detail::attention_str(b.q.size()) +
          " elements), " + detail::attention_str(nk) + " key tokens (" +
          detail::attention_str(b.k_pos.size()) + " positions, k of " + detail::attention_str(b.k.size()) +
          ", v of " + detail::attention_str(b.v.size()) +
          " elements) for q_heads=" + std::to_string(s.q_heads) + ", kv_heads=" + std::to_string(s.kv_heads) +
          ", head_dim=" + std::to_string(s.head_dim) +
          "; expected q = tokens*q_heads*head_dim and k, v = tokens*kv_heads*head_dim");
    attention_args<T> a;
    a.q = b.q.data();
    a.k = b.k.data();
    a.v = b.v.data();
    a.nq = static_cast<std::int64_t>(nq);
    a.nk = static_cast<std::int64_t>(nk);
    a.q_heads = s.q_heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = s.head_dim;
    a.causal = b.mask == mask_t::causal;
    a.scale = b.scale;
    return a;
  }

  // Packs q_doc, q_pos, k_doc, k_pos into the host staging vector (so the copy never reads the caller's
  // metadata after the call, pinned or not: a pageable source is consumed before cudaMemcpyAsync returns)
  // and uploads it to the scratch, grown first if it is too small.
  template <class B>
  void upload(const B& b, const char* who) {
    staging_.clear();
    staging_.insert(staging_.end(), b.q_doc.begin(), b.q_doc.end());
    staging_.insert(staging_.end(), b.q_pos.begin(), b.q_pos.end());
    staging_.insert(staging_.end(), b.k_doc.begin(), b.k_doc.end());
    staging_.insert(staging_.end(), b.k_pos.begin(), b.k_pos.end());
    if (staging_.empty()) return;
    if (staging_.size() > capacity_) {
      // The previous call's kernels may still read the old scratch: wait for them before freeing it.
      if (scratch_) detail::attention_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", who);
      release();
      void* p = nullptr;
      detail::attention_check(cudaMalloc(&p, staging_.size() * sizeof(std::int64_t)), "cudaMalloc", who);
      scratch_ = static_cast<std::int64_t*>(p);
      capacity_ = staging_.size();
    }
    detail::attention_check(cudaMemcpyAsync(scratch_, staging_.data(), staging_.size() * sizeof(std::int64_t),
                                            cudaMemcpyHostToDevice, stream),
                            "cudaMemcpyAsync", who);
  }

  template <class T>
  void set_metadata(attention_args<T>& a, std::size_t nq) const noexcept {
    const auto nk = static_cast<std::size_t>(a.nk);
    a.q_doc = scratch_;
    a.q_pos = scratch_ ? scratch_ + nq : nullptr;
    a.k_doc = scratch_ ? scratch_ + 2 * nq : nullptr;
    a.k_pos = scratch_ ? scratch_ + 2 * nq + nk : nullptr;
  }

  void release() noexcept {
    if (scratch_) (void)cudaFree(scratch_);
    scratch_ = nullptr;
    capacity_ = 0;
  }

  std::int64_t* scratch_ = nullptr;    // device: q_doc | q_pos | k_doc | k_pos
  std::size_t capacity_ = 0;           // elements of scratch_
  std::vector<std::int64_t> staging_;  // host: the same, packed
};

}  // namespace hetmesh::cuda
