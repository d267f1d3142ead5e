// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: the loopback backend's reduction of one slice over every rank's buffer.
//
// The slice is reduced block by block: a block of every rank's buffer is combined into a small
// accumulator that stays in the L1 cache, in rank order (((r0 op r1) op r2) ...), and the block is then
// written to each destination once. Each source byte is read once and each destination byte written once,
// where reducing rank by rank over the whole slice would stream the accumulator through memory n times.
// The order of operations per element is the same as rank by rank, so the result is bitwise the same.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>

#include "../reduce_op.hpp"

namespace hetmesh::comm::loopback::detail {

/// Bytes of the accumulator block: small enough for L1 beside one block of a source.
inline constexpr std::size_t reduce_block_bytes = 8192;

/// For every destination d in `dsts`: d[i] = op over k = 0..n-1 of srcs[k][i] for i < count, combined
/// in rank order k = 0, 1, ... and finished once (avg divides by group_size), so every destination gets
/// the same bits. A destination may alias a source (each block of every source is read before that
/// block of any destination is written); destinations do not overlap each other. The pointers are to T.
/// Pre: srcs non-empty.
template <class T>
void reduce_slice(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t count,
                  reduce_op op, int group_size) noexcept {
  constexpr std::size_t block = std::max<std::size_t>(1, reduce_block_bytes / sizeof(T));
  alignas(64) T acc[block];
  for (std::size_t lo = 0; lo < count; lo += block) {
    const std::size_t len = std::min(block, count - lo);
    std::memcpy(acc, static_cast<const T*>(srcs[0]) + lo, len * sizeof(T));
    for (std::size_t k = 1; k < srcs.size(); ++k)
      comm::detail::reduce_into(acc, static_cast<const T*>(srcs[k]) + lo, len, op);
    comm::detail::finish_reduce(acc, len, op, group_size);
    for (void* d : dsts) std::memcpy(static_cast<T*>(d) + lo, acc, len * sizeof(T));
  }
}

}  // namespace hetmesh::comm::loopback::detail
