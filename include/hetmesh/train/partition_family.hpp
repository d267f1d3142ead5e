// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: what makes a type a partition family, a balancer or a family's typed plan part, as
// concepts with a `plan` contract, so a user adds one in their own code and nothing under include/ changes.
//
//   family F, balancer B   plan_partition(f, request, b) -> step_plan<Part>   (found by argument-dependent
//                          lookup: the library's families in train/families.hpp, a user's beside their type)
//   Part                   partition_part: regular, hashable, and names the attention mechanism the
//                          runtime binds for the stages: attention_over_rings (ring attention over the
//                          plan's rings: static CP, HDP, any family that lowers to rings) or
//                          attention_over_groups (heads exchanged all-to-all in fixed groups of the pool:
//                          Ulysses), with what that mechanism reads.
//
// The request names the documents, the pool and the cost model; the balancer is the family's to consult
// (a family documents which balancer operations it calls, e.g. place_groups or place_hdp of
// train/families.hpp). The runtime reads only the step_layout and the part through this concept.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../balance/planner.hpp"
#include "../core/hash.hpp"
#include "../seq/types.hpp"
#include "../seq/ulysses.hpp"
#include "step_plan.hpp"

namespace hetmesh::train {

/// What a partition family plans from: the step's documents (id, length, stream order), the pool's rank
/// count and the cost model a balancer prices work with. Holds references; lives for the call.
struct partition_request {
  std::span<const seq::seq_desc> documents;  ///< the step's documents
  int pool = 1;                              ///< ranks of the pool the family partitions over
  const balance::step_model& cost;           ///< what balancers price work with
};

/// The attention mechanism of a family whose micro-batches run attention over their plan rings
/// (run::ring_attention_forward/backward; a ring of one rank runs the kernel locally). It asks nothing more
/// of the part.
struct attention_over_rings {
  /// Whether part type P gives this mechanism what it reads: nothing beyond the layout.
  template <class P>
  static constexpr bool accepts = true;
};
/// The attention mechanism of a family whose pool splits into fixed groups that exchange heads all-to-all
/// around a local attention (Ulysses): the part says the group size and each micro-batch's exchange plan.
struct attention_over_groups {
  /// Whether part type P gives this mechanism what it reads: `p.group_size()` (consecutive pool ranks per
  /// group) and `p.exchange(source)` (the seq::ulysses_plan of the micro-batch with that source index).
  template <class P>
  static constexpr bool accepts = requires(const P& p, std::int64_t source) {
    { p.group_size() } -> std::convertible_to<int>;
    { p.exchange(source) } -> std::convertible_to<const seq::ulysses_plan&>;
  };
};

/// A family's typed plan part. Requirements on `P` (a value `p`):
///   1. `P` is regular (`std::regular`) and `p.hash_append(h)` feeds all of it to a hasher;
///   2. `P::attention` is the runtime's attention mechanism for it, attention_over_rings or
///      attention_over_groups, and `P::attention::accepts<P>` holds (what that mechanism reads of the part:
///      with attention_over_groups, `p.group_size()` and `p.exchange(source)`).
/// Optional: `P::name` (a string_view constant: plans print it). A part may hold anything else its family's
/// planner wants to keep.
template <class P>
concept partition_part = std::regular<P> && requires(const P& p, hasher& h) {
  p.hash_append(h);
} && requires {
  typename P::attention;
} && P::attention::template accepts<P>;

namespace detail {
template <class T>
inline constexpr bool is_step_plan_v = false;
template <class Part>
inline constexpr bool is_step_plan_v<step_plan<Part>> = partition_part<Part>;
}  // namespace detail

/// A partition family placed by balancer `B`. Requirements on `F` (a value `f`), with `r` a
/// partition_request and `b` a `B`:
///   1. `F` is regular and `f.hash_append(h)` feeds its parameters to a hasher;
///   2. `plan_partition(f, r, b)`, found by argument-dependent lookup, returns a step_plan<Part> of a
///      partition_part `Part`, whose layout (step_layout) is complete but for the pipeline part: world ==
///      r.pool, documents == r.documents, every token of every document in exactly one planned micro-batch
///      (padding aside), rings in a global order each rank's list follows, slots aligned (align_slots);
///   3. it is pure (equal on every rank for equal inputs) and throws invalid_argument naming what is wrong
///      for bad input (no document, a bad pool, a degree that does not divide it).
/// Optional: `f.group_size()` is not read; groups come from the part.
template <class F, class B>
concept partition_family = std::regular<F> && requires(const F& f, hasher& h) {
  f.hash_append(h);
} && requires(const F& f, const partition_request& r, const B& b) {
  {plan_partition(f, r, b)};
} && detail::is_step_plan_v<std::remove_cvref_t<decltype(plan_partition(
    std::declval<const F&>(), std::declval<const partition_request&>(), std::declval<const B&>()))>>;

/// The step plan type family `F` placed by `B` makes.
template <class F, class B>
using step_plan_t = std::remove_cvref_t<decltype(plan_partition(
    std::declval<const F&>(), std::declval<const partition_request&>(), std::declval<const B&>()))>;

}  // namespace hetmesh::train
