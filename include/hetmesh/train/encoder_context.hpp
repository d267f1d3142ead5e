// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: what train::system hands an encoder for one (shard, slot) call. Under long-short SP
// (train/encoder_domain.hpp) a long item is split over a Ulysses group of the shard's row; the
// encoder reaches its item's group through the context: `ctx.item_group(piece)` is the group's
// communicator (ranks in group order, so a user's layer can run its own collectives over the item), and
// `ctx.attention_forward(view, ...)` / `ctx.attention_backward(view, ...)` run attention inside every item
// of the call's batch (run/long_short_attention.hpp: whole items locally, pieces by Ulysses over their
// groups) with the system's attention kernel. Groups are created on first use (collective over their
// members) and cached for later steps.
#pragma once

#include <span>
#include <vector>

#include "../comm/group_cache.hpp"
#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/activation.hpp"
#include "../model/context.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/host_memory.hpp"
#include "../run/long_short_attention.hpp"

#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/reference_attention.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::train {

/// The context train::system hands an encoder for element type T: a model::stage_context (stage = the
/// encoder shard, micro_batch = the slot, the encoder's own activation slots) with its items' groups and
/// an attention entry. Spans are memory of M (device memory for a device policy). Holds pointers the
/// runtime keeps alive across the call.
template <class Comm, class Kernel, class T, class M = model::host_memory>
struct encoder_context : model::stage_context<Comm, model::memory_activation_store<T, M>> {
  /// Element type of activations and parameters.
  using value_type = T;
  /// The attention kernel type.
  using kernel_type = Kernel;
  /// The memory policy of the encoder's buffers.
  using memory_type = M;

  comm::group_cache<Comm>* groups = nullptr;  ///< groups of the shard's row (its row communicator)
  int row_first = 0;                          ///< domain rank of row position 0 at this shard (shard x row)
  Kernel* kernel = nullptr;                   ///< the system's kernel
  M* memory = nullptr;                        ///< the system's memory policy (null: M{}; host only)

  /// The communicator of the Ulysses group that split piece `p` of the call's batch (`view.pieces`) runs
  /// over: its item's group, ranks in group order (p.group_rank is this rank's). The first call for a
  /// group is collective over its members; later ones are look-ups. Errors: a whole item (degree 1) or no
  /// groups bound (invalid_argument).
  [[nodiscard]] Comm& item_group(const model::encoder_piece& p, const model::encoder_batch_view& view) const;

  /// Attention inside every item of `view` (full mask: each token sees every token of its item): out
  /// [tokens][q_heads][head_dim] and lse [tokens][q_heads] for q [tokens][q_heads][head_dim] and k, v
  /// [tokens][kv_heads][head_dim] of the call's tokens in buffer order. Collective over the groups of the
  /// batch's split pieces, in their order (every member calls it the same number of times). The encoder
  /// saves q, k, v, out and lse (its activation slots) for attention_backward. Cost: as
  /// run::long_short_attention_forward.
  void attention_forward(const model::encoder_batch_view& view, model::attention_shape shape, T scale,
                         std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> out,
                         std::span<T> lse) const;

  /// Backward of attention_forward: writes (overwrites) dq, dk, dv of the call's tokens. Collective as
  /// the forward, in the same order.
  void attention_backward(const model::encoder_batch_view& view, model::attention_shape shape, T scale,
                          std::span<const T> q, std::span<const T> k, std::span<const T> v,
                          std::span<const T> out, std::span<const T> lse, std::span<const T> dout,
                          std::span<T> dq, std::span<T> dk, std::span<T> dv) const;

 private:
  M& mem() const {
    return model::bound_memory(memory, [&] {
      return hetmesh::format(
          "train::encoder_context: shard {} slot {} has no memory policy bound; expected a "
          "context made by train::system::run (a device memory policy is the system's)",
          this->stage, this->micro_batch);
    });
  }
  void check_bound(const char* who) const {
    if (kernel == nullptr)
      throw_error<invalid_argument>(
          "train::encoder_context::{}: shard {} slot {} has no attention kernel; expected a context made by "
          "train::system::run",
          who, this->stage, this->micro_batch);
  }
};

template <class Comm, class Kernel, class T, class M>
Comm& encoder_context<Comm, Kernel, T, M>::item_group(const model::encoder_piece& p,
                                                      const model::encoder_batch_view& view) const {
  if (groups == nullptr || p.degree < 2)
    throw_error<invalid_argument>(
        "train::encoder_context::item_group: item {} ({} ranks) at shard {} slot {}; expected a split "
        "piece "
        "of a call made by train::system::run",
        p.item, p.degree, this->stage, this->micro_batch);
  std::vector<int> members;
  const int first = view.rank - p.group_rank - row_first;  // the group's first row position
  for (int t = 0; t < p.degree; ++t) members.push_back(first + t);
  if constexpr (comm::subgroup_communicator<Comm>) {
    return groups->get(std::span<const int>(members));
  } else {  // NCCL: groups come only from a split collective over the whole parent
    throw_error<invalid_argument>(
        "train::encoder_context::item_group: item {} is split over {} ranks at shard {} slot {}, but {} "
        "makes no group of a few ranks on demand (no subgroup); expected whole items on this backend: "
        "raise system_options::encoder_sp.max_tokens_per_rank above the longest item",
        p.item, p.degree, this->stage, this->micro_batch, comm::describe(groups->parent()));
  }
}

template <class Comm, class Kernel, class T, class M>
void encoder_context<Comm, Kernel, T, M>::attention_forward(const model::encoder_batch_view& view,
                                                            model::attention_shape shape, T scale,
                                                            std::span<const T> q, std::span<const T> k,
                                                            std::span<const T> v, std::span<T> out,
                                                            std::span<T> lse) const {
  check_bound("attention_forward");
  run::long_short_attention_forward(
      [&](const model::encoder_piece& p) -> Comm& { return item_group(p, view); }, view, *kernel,
      run::long_short_attention_input<T>{shape, scale, q, k, v}, out, lse, mem());
}

template <class Comm, class Kernel, class T, class M>
void encoder_context<Comm, Kernel, T, M>::attention_backward(
    const model::encoder_batch_view& view, model::attention_shape shape, T scale, std::span<const T> q,
    std::span<const T> k, std::span<const T> v, std::span<const T> out, std::span<const T> lse,
    std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) const {
  check_bound("attention_backward");
  run::long_short_attention_backward(
      [&](const model::encoder_piece& p) -> Comm& { return item_group(p, view); }, view, *kernel,
      run::long_short_attention_input<T>{shape, scale, q, k, v}, out, lse, dout, dq, dk, dv, mem());
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the context over the loopback communicator with the reference
// kernel in host memory, float and double (its item groups and long-short attention; MPI's with
// HETMESH_COMPILED_MPI). HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of
// <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
HETMESH_INSTANTIATE struct encoder_context<comm::loopback::communicator, model::reference_attention, float>;
HETMESH_INSTANTIATE struct encoder_context<comm::loopback::communicator, model::reference_attention, double>;
#if HETMESH_COMPILED_MPI
HETMESH_INSTANTIATE struct encoder_context<comm::mpi::communicator, model::reference_attention, float>;
HETMESH_INSTANTIATE struct encoder_context<comm::mpi::communicator, model::reference_attention, double>;
#endif
#endif

namespace detail {

/// Encoder k's context for one (shard, slot) call of train::system::run: `stores[k]` its activations, the
/// shard's row groups and the kernel. One type per (Comm, Kernel, T, Stores), whatever the system's
/// other policies, so the encoder calls (detail::encode) compile once per translation unit.
template <class Comm, class Kernel, class T, class Stores, class M = model::host_memory>
struct encoder_context_maker {
  Stores* stores = nullptr;                   ///< per encoder, its activation store
  comm::group_cache<Comm>* groups = nullptr;  ///< the shard's row
  Kernel* kernel = nullptr;                   ///< the system's kernel
  int shard = 0;                              ///< the encoder shard
  int slot = 0;                               ///< the slot (micro-batch index)
  int row_first = 0;                          ///< domain rank of row position 0 at the shard
  M* memory = nullptr;                        ///< the system's memory policy

  encoder_context<Comm, Kernel, T, M> operator()(int k) const {
    encoder_context<Comm, Kernel, T, M> ctx;
    ctx.memory = memory;
    ctx.activations = &(*stores)[static_cast<std::size_t>(k)];
    ctx.stage = shard;
    ctx.micro_batch = slot;
    ctx.groups = groups;
    ctx.row_first = row_first;
    ctx.kernel = kernel;
    return ctx;
  }
};

}  // namespace detail

}  // namespace hetmesh::train
