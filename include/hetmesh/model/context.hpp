// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the context a stage runs in. A user's tensor-parallel or MoE layer runs its own
// collectives through the generic wrappers (comm/collectives.hpp), so the runtime hands each stage call
// the communicators of its groups: tp, ep, and its sequence ring (a static CP group, or an HDP ring: an
// ordered list of ranks of a parent communicator, since HDP rings reuse the pool's communicator rather
// than creating one per ring). model/ does not include comm/: the communicator type is a template
// parameter (a comm::communicator), held by pointer, and the runtime that builds contexts owns them.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "../core/error.hpp"
#include "../seq/hdp.hpp"
#include "activation.hpp"

namespace hetmesh::model {

/// A sequence ring: the ordered ranks of `parent` that hold one sequence's chunks (HDP ring, or the CP
/// group with ranks 0..cp-1 of the CP communicator), and the caller's place in it. Ring attention sends
/// KV to next() and receives from prev(). A ring of size 1 means the sequence is whole on this rank.
template <class Comm>
struct ring_group {
  Comm* parent = nullptr;      ///< the communicator whose ranks `ranks` names (null: no ring)
  std::span<const int> ranks;  ///< ordered ranks of parent; ranks[position] is the caller's parent rank
  int position = 0;            ///< the caller's index in `ranks`

  /// Ranks in the ring (1 when there is none). O(1).
  [[nodiscard]] int size() const noexcept { return ranks.empty() ? 1 : static_cast<int>(ranks.size()); }
  /// Whether the sequence is split over more than one rank. O(1).
  [[nodiscard]] bool split() const noexcept { return size() > 1; }
  /// Parent rank of the ring's next member (the caller's own rank in a ring of 1). Pre: parent set.
  [[nodiscard]] int next() const noexcept { return at(position + 1); }
  /// Parent rank of the ring's previous member (the caller's own rank in a ring of 1). Pre: parent set.
  [[nodiscard]] int prev() const noexcept { return at(position + size() - 1); }
  /// Parent rank of ring member `i mod size()`. Pre: ranks not empty. O(1).
  [[nodiscard]] int at(int i) const noexcept { return ranks[static_cast<std::size_t>(i % size())]; }
};

/// The ring of an HDP micro-batch: the item's ordered pool ranks (plan.ring(mb)) on the pool's
/// communicator `pool`, and this rank's place in it. The ring's span points into `plan`, which must outlive
/// it. Pre: `mb` is one of plan.per_rank's micro-batches. O(1).
template <class Comm>
[[nodiscard]] ring_group<Comm> hdp_ring(Comm& pool, const seq::hdp_plan& plan,
                                        const seq::hdp_micro_batch& mb) {
  return {&pool, std::span<const int>(plan.ring(mb)), mb.ring_position};
}

namespace detail {
template <class Store>
struct context_store {
  Store* activations = nullptr;  // the runtime's activation store
};
template <>
struct context_store<void> {};
}  // namespace detail

/// What the runtime hands a stage with each call: the communicators of the stage's groups (null where
/// the group has one rank, or where the mesh has no such dim), its sequence ring, which stage and
/// micro-batch the call is for, and (when Store is not void) the activation store its saved tensors go
/// to. Comm is the run's comm::communicator type; Store a model::activation_store (or void). The context
/// holds pointers: the runtime owns communicators and store and keeps them alive across the call.
/// Copying a context is cheap (pointers and a span).
template <class Comm, class Store = void>
struct stage_context : detail::context_store<Store> {
  /// The run's communicator type.
  using communicator_type = Comm;
  /// The activation store type (void: none).
  using store_type = Store;

  /// Tensor-parallel group (null: tp = 1). Every tp rank runs the same micro-batches; a first stage that
  /// reads encoder rows gets them whole on every tp rank and must hand back the same input gradient on each
  /// (as a column-parallel input does after its all-reduce): train::system takes it from one of them.
  Comm* tp = nullptr;
  Comm* ep = nullptr;       ///< expert-parallel group (null: ep = 1)
  ring_group<Comm> ring{};  ///< the sequence's CP or HDP ring
  int stage = 0;            ///< pipeline stage (encoder: encoder shard) of the call
  int micro_batch = 0;      ///< micro-batch of the call

  /// The stage's activation slots for this call's (stage, micro-batch). Only when Store is not void;
  /// throws invalid_argument when no store is set. O(1).
  [[nodiscard]] activation_slot<Store> slots() const requires(!std::is_void_v<Store>) {
    if (this->activations == nullptr)
      throw_error<invalid_argument>("stage_context: stage {} micro-batch {} has no activation store", stage,
                                    micro_batch);
    return activation_slot<Store>(*this->activations, stage, micro_batch);
  }
};

/// Stands for "any comm::communicator" where a stage concept is checked without a concrete backend (the
/// default context of encoder_stage and friends). It has a group of one rank and no operations, so a
/// stage written generically over its context's communicator checks against it; a stage written for one
/// backend checks against stage_context of that backend instead.
struct communicator_archetype {
  /// The caller's rank: 0.
  [[nodiscard]] int rank() const noexcept { return 0; }
  /// Ranks in the group: 1.
  [[nodiscard]] int size() const noexcept { return 1; }
};

/// The context the stage concepts check with by default: the archetype communicator and a host store.
template <class T>
using default_stage_context = stage_context<communicator_archetype, host_activation_store<T>>;

}  // namespace hetmesh::model
