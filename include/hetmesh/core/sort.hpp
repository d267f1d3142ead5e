// SPDX-License-Identifier: Apache-2.0
// hetmesh: sorting with one instantiation of std::sort for the whole library. The planners sort many
// element types by many comparators; each std::sort<It, Less> is about 15 function templates that
// C++20 makes constexpr, so every one used by an inline function was instantiated in every translation
// unit (36 of them were about 1 s of `#include <hetmesh/hetmesh.hpp>`). Here a range is sorted through
// an array of indices by a type-erased comparator, which is one std::sort instantiation in all.
#pragma once

/// \file
/// indirect_sort and indirect_stable_sort: std::sort and std::stable_sort with the same
/// results, compiled once.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <iterator>
#include <numeric>
#include <utility>
#include <vector>
#include "../config.hpp"

namespace hetmesh {
namespace detail {

/// A comparator of indices through a function pointer and a context.
struct index_less {
  const void* context;  ///< what `less` reads the elements through
  bool (*less)(const void* context, std::size_t a, std::size_t b);  ///< element a before element b
  /// Element `a` before element `b`.
  bool operator()(std::size_t a, std::size_t b) const { return less(context, a, b); }
};

/// std::sort of the indices [first, last) by `less`: the library's one instantiation of std::sort over
/// a comparator.
HETMESH_COMPILED void sort_indices(std::size_t* first, std::size_t* last, index_less less);

/// Moves the elements of [first, first + order.size()) so that element i becomes the one that was at
/// order[i]; `order` (a permutation) is left as the identity. O(n) moves.
template <class It>
void apply_order(It first, std::vector<std::size_t>& order) {
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] == i) continue;
    auto held = std::move(first[static_cast<std::ptrdiff_t>(i)]);
    std::size_t j = i;
    while (order[j] != i) {
      const std::size_t k = order[j];
      first[static_cast<std::ptrdiff_t>(j)] = std::move(first[static_cast<std::ptrdiff_t>(k)]);
      order[j] = j;
      j = k;
    }
    first[static_cast<std::ptrdiff_t>(j)] = std::move(held);
    order[j] = j;
  }
}

/// Sorts [first, last) through an index array ordered by `less` of the elements (Stable: ties by index),
/// then moves the elements into that order: the body of indirect_sort and indirect_stable_sort.
template <bool Stable, class It, class Less>
void sort_through_indices(It first, It last, const Less& less) {
  const auto n = static_cast<std::size_t>(last - first);
  if (n < 2) return;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  struct context {
    It first;
    const Less* less;
  } c{first, &less};
  sort_indices(order.data(), order.data() + n,
               index_less{&c, [](const void* p, std::size_t a, std::size_t b) {
                            const auto& ctx = *static_cast<const context*>(p);
                            const auto& x = ctx.first[static_cast<std::ptrdiff_t>(a)];
                            const auto& y = ctx.first[static_cast<std::ptrdiff_t>(b)];
                            if constexpr (Stable) {
                              if ((*ctx.less)(x, y)) return true;
                              if ((*ctx.less)(y, x)) return false;
                              return a < b;
                            } else {
                              return static_cast<bool>((*ctx.less)(x, y));
                            }
                          }});
  apply_order(first, order);
}

}  // namespace detail

/// std::sort(first, last, less), with the same result: introsort only compares and moves, so sorting
/// indices by `less` of the elements they name performs the same comparisons and ends in the same
/// permutation, ties included. The sort itself is compiled once for all element types and comparators
/// (sort_indices); per call site only this small function is instantiated. Costs n indices of memory and
/// an indirect call per comparison. Precondition: random-access iterators; `less` a strict weak order.
template <class It, class Less = std::less<>>
void indirect_sort(It first, It last, const Less& less = {}) {
  detail::sort_through_indices<false>(first, last, less);
}

/// std::stable_sort(first, last, less), with the same result (a stable order is unique): the indices are
/// sorted by (`less` of their elements, index), through the same single std::sort as indirect_sort.
template <class It, class Less = std::less<>>
void indirect_stable_sort(It first, It last, const Less& less = {}) {
  detail::sort_through_indices<true>(first, last, less);
}

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh::detail {

HETMESH_COMPILED void sort_indices(std::size_t* first, std::size_t* last, index_less less) {
  std::sort(first, last, less);
}

}  // namespace hetmesh::detail
#endif  // HETMESH_BODIES
