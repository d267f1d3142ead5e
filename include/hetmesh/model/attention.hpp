// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the attention kernel a user supplies, as the library drives it. Ring attention (CP and
// HDP rings), Ulysses and packed sequences all reduce to block products: the queries of one chunk of
// tokens against the keys and values of another chunk, under a mask that follows from each token's
// document and position. The kernel computes one block; the library merges blocks (seq::merge_partial)
// and moves chunks between ranks. Layouts are row-major: q and out [tokens][q_heads][head_dim], k and v
// (and dk, dv) [tokens][kv_heads][head_dim], lse and delta [tokens][q_heads].
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "../core/error.hpp"
#include "../seq/ring.hpp"

namespace hetmesh::model {

/// Heads and head size of one attention call. Grouped-query attention: query head h reads KV head
/// h / (q_heads / kv_heads); q_heads is a multiple of kv_heads. A rank holding a slice of heads
/// (Ulysses, tensor parallelism) passes the shape of its slice.
struct attention_shape {
  int q_heads = 1;   ///< query heads
  int kv_heads = 1;  ///< key/value heads, dividing q_heads
  int head_dim = 1;  ///< elements per head

  friend constexpr bool operator==(const attention_shape&, const attention_shape&) = default;
};

/// Throws invalid_argument, prefixed by `who`, unless `s` has positive heads and head size with kv_heads
/// dividing q_heads. O(1).
HETMESH_COMPILED void check_attention_shape(const attention_shape& s, const char* who)
#if HETMESH_BODIES
{
  if (s.q_heads < 1 || s.kv_heads < 1 || s.head_dim < 1 || s.q_heads % s.kv_heads != 0)
    throw_error<invalid_argument>(
        "{}: shape q_heads={}, kv_heads={}, head_dim={}; expected positive values with kv_heads dividing "
        "q_heads",
        who, s.q_heads, s.kv_heads, s.head_dim);
}
#else
    ;
#endif

/// One block: queries of one token chunk against keys/values of another. A query sees a key when both
/// belong to the same document (equal doc ids) and, under block_mask::causal, when the key's position is
/// at most the query's; under block_mask::full, every key of its document. (block_mask::none is never
/// passed: the library skips such blocks.) Positions are positions within the document, as
/// TransformerEngine assigns them under CP, so the mask is the same on every rank that holds the tokens.
/// Memory: the tensors (q, k, v here; out, lse, dout, dq, dk, dv, delta of attention_forward_out and
/// attention_backward_io) live in the memory space of the caller's memory policy (model/memory_policy.hpp):
/// host memory on a host path, device memory on a device path. The per-token metadata (q_doc, q_pos,
/// k_doc, k_pos) is always host memory, valid for the call only: a device kernel reads it on the host
/// and uploads what it needs (e.g. as cu_seqlens and position offsets) to the stream it computes on.
template <class T>
struct attention_block {
  attention_shape shape{};                         ///< heads and head size
  std::span<const T> q;                            ///< [nq][q_heads][head_dim]
  std::span<const T> k;                            ///< [nk][kv_heads][head_dim]
  std::span<const T> v;                            ///< [nk][kv_heads][head_dim]
  std::span<const std::int64_t> q_doc;             ///< [nq] document id of each query token
  std::span<const std::int64_t> q_pos;             ///< [nq] position of each query token in its document
  std::span<const std::int64_t> k_doc;             ///< [nk] document id of each key token
  std::span<const std::int64_t> k_pos;             ///< [nk] position of each key token in its document
  seq::block_mask mask = seq::block_mask::causal;  ///< full or causal
  T scale = T(1);                                  ///< softmax scale, usually 1/sqrt(head_dim)
};

/// Forward outputs of one block, overwritten by the kernel: the block's partial output (softmax over
/// this block's keys only) and its natural-log row log-sum-exp; a row that sees no key gets
/// lse = -infinity and out = 0.
template <class T>
struct attention_forward_out {
  std::span<T> out;  ///< [nq][q_heads][head_dim]
  std::span<T> lse;  ///< [nq][q_heads]
};

/// Backward of one block, given the *merged* forward results of the query rows (their final lse over
/// every block, and delta = rowsum(dout * out), seq::attention_delta). The kernel adds this block's
/// contributions into dq, dk and dv (it never clears them), so blocks may run in any order.
template <class T>
struct attention_backward_io {
  std::span<const T> dout;   ///< [nq][q_heads][head_dim]
  std::span<const T> lse;    ///< [nq][q_heads], merged
  std::span<const T> delta;  ///< [nq][q_heads]
  std::span<T> dq;           ///< [nq][q_heads][head_dim], accumulated
  std::span<T> dk;           ///< [nk][kv_heads][head_dim], accumulated
  std::span<T> dv;           ///< [nk][kv_heads][head_dim], accumulated
};

/// An attention kernel for element type T: the user's block attention, which the library drives across
/// rings, Ulysses groups and packed sequences. Requirements:
///  1. `k.forward(block, out)` with `const attention_block<T>&` and `attention_forward_out<T>`: writes the
///     block's partial output and row lse as attention_forward_out describes; reads nothing else;
///  2. `k.backward(block, io)` with `const attention_block<T>&` and `attention_backward_io<T>`: adds the
///     block's gradient contributions into io.dq, io.dk, io.dv;
///  3. both are deterministic: the same block gives bitwise the same results (gradient parity and plan
///     replay rely on it);
///  4. the tensors of a block are in the memory space of the caller's memory policy (host spans on a
///     host path; a device kernel is called with device spans and enqueues its work on the stream the
///     caller's policy and communicator share); the per-token metadata is host memory on either path
///     (attention_block).
/// model::reference_attention is a CPU model (float and double).
template <class K, class T>
concept attention_kernel = requires(K& k, const attention_block<T>& b, attention_forward_out<T> o,
                                    attention_backward_io<T> g) {
  k.forward(b, o);
  k.backward(b, g);
};

}  // namespace hetmesh::model
