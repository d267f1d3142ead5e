// SPDX-License-Identifier: Apache-2.0
// hetmesh: small numeric helpers every room shares. Prefix sums turn block sizes into offsets:
// cu_seqlens of packed documents, displacements of an all-to-all-v, offsets of a sample's items.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace hetmesh {

/// Offsets of consecutive blocks of sizes `sizes`: out[0] = 0 and out[i + 1] = out[i] + sizes[i], so
/// out has sizes.size() + 1 entries and out.back() is the total (cu_seqlens; an all-to-all-v's
/// displacements are the first sizes.size() entries). Sums are taken in T (the caller's offset type).
/// Pure; O(n).
template <class T, class U>
[[nodiscard]] std::vector<T> prefix_sums(std::span<const U> sizes) {
  std::vector<T> out(sizes.size() + 1);
  out[0] = T{0};
  for (std::size_t i = 0; i < sizes.size(); ++i) out[i + 1] = out[i] + static_cast<T>(sizes[i]);
  return out;
}

/// prefix_sums with the offset type of the sizes.
template <class T>
[[nodiscard]] std::vector<T> prefix_sums(std::span<const T> sizes) {
  return prefix_sums<T, T>(sizes);
}
/// Exclusive prefix sums of `sizes`: size + 1 entries, starting at 0 (offsets of packed blocks). O(n).
template <class T>
[[nodiscard]] std::vector<T> prefix_sums(const std::vector<T>& sizes) {
  return prefix_sums<T, T>(std::span<const T>(sizes));
}

}  // namespace hetmesh
