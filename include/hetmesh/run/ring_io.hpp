// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: what a ring attention call takes and what a ring position holds: the local q, k, v of
// one position, the call's options, the per-ring tasks of the multi-ring entries, and the pure
// look-ups of a seq::ring_schedule (a rank's position, its token count, its tokens' documents and
// positions). The executor itself is ring_attention.hpp. The tensors (spans of T) are memory of the
// call's memory policy (host memory on a host communicator, device memory on a device one); the
// schedule and the token metadata (ring_token_meta) are host memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../seq/ring.hpp"

namespace hetmesh::run {

/// The local inputs of one ring position: q, k and v of the tokens this rank holds for the ring, in
/// the schedule's local order (chunk after chunk, seq::cp_chunk::local_offset), with the layouts of
/// model/attention.hpp: q [tokens][q_heads][head_dim], k and v [tokens][kv_heads][head_dim], in the
/// memory space of the call's memory policy (device memory for a device communicator).
template <class T>
struct ring_attention_input {
  model::attention_shape shape{};  ///< heads and head size (of this rank's head slice)
  T scale = T(1);                  ///< softmax scale, usually 1/sqrt(head_dim)
  std::span<const T> q;            ///< [tokens][q_heads][head_dim]
  std::span<const T> k;            ///< [tokens][kv_heads][head_dim]
  std::span<const T> v;            ///< [tokens][kv_heads][head_dim]
};

/// Options of a ring attention call.
struct ring_attention_options {
  /// First of the four point-to-point tags a call uses (tag .. tag+3: K, V, dK, dV); 0 <= tag <=
  /// comm::max_user_tag - 3. Calls that may be in flight together on one communicator need disjoint tags.
  int tag = 0x5a00;
  /// Overlap each hop with the step's compute: the K/V exchange runs on a helper thread while the
  /// kernel computes (backward: K/V overlap, the dK/dV accumulators follow the compute). The
  /// communicator is then used from that thread while the caller's thread does not touch it, so it
  /// must allow that (loopback does; MPI needs MPI_THREAD_SERIALIZED, which mpi::environment asks for).
  /// Results are bitwise the same either way.
  bool overlap = false;

  friend constexpr bool operator==(const ring_attention_options&, const ring_attention_options&) = default;
};

/// One ring of a sequence of forward calls (ring_attention_forward_all): the ring's schedule, this
/// rank's inputs for it and where its merged out and lse go (tensors in the call's memory space).
template <class T>
struct ring_forward_task {
  /// Element type.
  using value_type = T;
  const seq::ring_schedule* schedule = nullptr;  ///< the ring; the caller must be one of its ranks
  ring_attention_input<T> in{};                  ///< this rank's q, k, v for the ring
  std::span<T> out;                              ///< [tokens][q_heads][head_dim], written
  std::span<T> lse;                              ///< [tokens][q_heads], written
};

/// One ring of a sequence of backward calls (ring_attention_backward_all): the forward's inputs and
/// results, the output gradient, and where dq, dk, dv go (tensors in the call's memory space).
template <class T>
struct ring_backward_task {
  /// Element type.
  using value_type = T;
  const seq::ring_schedule* schedule = nullptr;  ///< the ring; the caller must be one of its ranks
  ring_attention_input<T> in{};                  ///< this rank's q, k, v for the ring (as in forward)
  std::span<const T> out;                        ///< merged forward output
  std::span<const T> lse;                        ///< merged forward lse
  std::span<const T> dout;                       ///< gradient of the loss with respect to out
  std::span<T> dq;                               ///< [tokens][q_heads][head_dim], written
  std::span<T> dk;                               ///< [tokens][kv_heads][head_dim], written
  std::span<T> dv;                               ///< [tokens][kv_heads][head_dim], written
};

/// The ring position of `rank` (a rank of the parent communicator) in `s`, or -1 when it is not a
/// member. Pure; O(D).
[[nodiscard]] HETMESH_COMPILED int ring_position(const seq::ring_schedule& s, int rank) noexcept
#if HETMESH_BODIES
{
  const auto it = std::find(s.ring.begin(), s.ring.end(), rank);
  return it == s.ring.end() ? -1 : static_cast<int>(it - s.ring.begin());
}
#else
    ;
#endif

/// Tokens position p of `s` holds (the sum of its chunk sizes). Pre: 0 <= p < s.chunks.size()
/// (invalid_argument otherwise). Pure; O(chunks).
[[nodiscard]] HETMESH_COMPILED std::int64_t ring_tokens(const seq::ring_schedule& s, int p)
#if HETMESH_BODIES
{
  if (p < 0 || static_cast<std::size_t>(p) >= s.chunks.size())
    throw_error<invalid_argument>("ring_tokens: position {} of a ring of {}; expected 0 <= position < {}", p,
                                  s.chunks.size(), s.chunks.size());
  std::int64_t n = 0;
  for (const auto& c : s.chunks.at(static_cast<std::size_t>(p))) n += c.positions.size();
  return n;
}
#else
    ;
#endif

/// Per-token document ids and positions of one ring position, in local order: what the kernel's mask
/// reads, and what a model needs for rotary embeddings (positions within the document, TE's rule).
/// Host memory, whatever the memory space of the tensors (a device model uploads what it needs).
struct ring_token_meta {
  std::vector<std::int64_t> doc;  ///< per local token: its document (seq::cp_chunk::doc)
  std::vector<std::int64_t> pos;  ///< per local token: its position in the document

  friend bool operator==(const ring_token_meta&, const ring_token_meta&) = default;
};

/// The document and position of every token position p of `s` holds, from its chunks. Pre: 0 <= p <
/// s.chunks.size() and chunks that tile the local buffer (invalid_argument otherwise). Pure; O(tokens).
[[nodiscard]] HETMESH_COMPILED ring_token_meta ring_meta(const seq::ring_schedule& s, int p)
#if HETMESH_BODIES
{
  ring_token_meta m;
  const auto n = static_cast<std::size_t>(ring_tokens(s, p));
  m.doc.assign(n, 0);
  m.pos.assign(n, 0);
  for (const auto& c : s.chunks.at(static_cast<std::size_t>(p)))
    for (auto t = c.positions.begin; t < c.positions.end; ++t) {
      const auto at = static_cast<std::size_t>(c.local_offset + (t - c.positions.begin));
      if (at >= n)
        throw_error<invalid_argument>(
            "ring_meta: chunk of document {} at local offset {} ends past the {} tokens of position {}; "
            "expected chunks that tile the local buffer",
            c.doc, c.local_offset, n, p);
      m.doc[at] = c.doc;
      m.pos[at] = t;
    }
  return m;
}
#else
    ;
#endif

}  // namespace hetmesh::run
