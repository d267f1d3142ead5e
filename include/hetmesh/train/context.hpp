// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: how a user's backbone stage calls attention. The stage never sees rings, schedules or
// the kernel: train::system hands it a train::step_context, a model::stage_context (tp, ep, its sequence
// ring, its activation slots) that also carries an attention entry, `ctx.attention_forward(...)` and
// `ctx.attention_backward(...)`, bound by the runtime to run::ring_attention_forward/backward over the
// micro-batch's ring (a static CP group, or an HDP ring of the pool's parent communicator; a ring of one
// rank runs the kernel locally) with the user's model::attention_kernel. The stage computes q, k, v for
// its local tokens in the micro-batch's local order and gets the attention over every key of the ring its
// queries see (per document, causal); documents and positions come from the micro-batch view, which the
// runtime built in the ring schedule's local order (checked). The binding lives here rather than in model/
// so that model/ stays free of run/ (design.md's rooms table): a model includes train/context.hpp only
// for the attention_context concept, or stays generic over its context type.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/activation.hpp"
#include "../model/attention.hpp"
#include "../model/attention_context.hpp"
#include "../model/context.hpp"
#include "../model/host_memory.hpp"
#include "../model/reference_attention.hpp"
#include "../run/ring_attention.hpp"
#include "../run/ulysses_attention.hpp"
#include "../seq/ring.hpp"
#include "offload.hpp"

namespace hetmesh::train {

/// The activation store of train::system's stages for element T in memory M: selective offload over slots
/// in M's buffers (host memory: train::offload_store<T>).
template <class T, class M = model::host_memory>
using step_store = offload_store<T, model::memory_activation_store<T, M>>;

/// The context train::system hands a backbone stage for one (stage, micro-batch) call: everything a
/// model::stage_context holds (tp, ep, the micro-batch's ring, activation slots in a store of T in memory
/// M), plus the attention entry bound to ring attention over that ring with the system's kernel. Spans the
/// stage passes are memory of M (device memory for a device policy). Holds pointers (schedule, kernel,
/// store, communicators, memory policy) that the runtime keeps alive across the call.
template <class Comm, class Kernel, class T, class M = model::host_memory>
struct step_context : model::stage_context<Comm, step_store<T, M>> {
  /// Element type of activations and parameters.
  using value_type = T;
  /// The attention kernel type.
  using kernel_type = Kernel;
  /// The memory policy of the stage's buffers.
  using memory_type = M;

  const seq::ring_schedule* schedule = nullptr;  ///< the micro-batch's ring (its position: ring.position)
  const seq::ulysses_plan* ulysses = nullptr;    ///< Ulysses: the group's exchange plan (then no ring)
  Comm* group = nullptr;                         ///< Ulysses: the group's communicator, in stream order
  std::span<const std::int64_t> stream_doc;      ///< Ulysses: document of every token of the group
  std::span<const std::int64_t> stream_pos;      ///< Ulysses: position of every token of the group
  Kernel* kernel = nullptr;                      ///< the system's kernel
  run::ring_attention_options options{};         ///< tags and overlap of the ring calls
  M* memory = nullptr;                           ///< the system's memory policy (null: M{}; host only)

  /// Causal per-document attention of the micro-batch's local queries over every key of its ring:
  /// out [tokens][q_heads][head_dim] and lse [tokens][q_heads] (natural log), for q [tokens][q_heads]
  /// [head_dim] and k, v [tokens][kv_heads][head_dim] of the local tokens in the micro-batch's order.
  /// Collective over the ring's ranks (each calls it the same number of times, in the same order); a
  /// ring of one rank only runs the kernel. Pre: spans sized as above (invalid_argument otherwise).
  /// The stage saves q, k, v, out and lse (its activation slots) for attention_backward.
  /// Cost: as run::ring_attention_forward.
  void attention_forward(model::attention_shape shape, T scale, std::span<const T> q, std::span<const T> k,
                         std::span<const T> v, std::span<T> out, std::span<T> lse) const {
    if (ulysses != nullptr) {
      check_ulysses("attention_forward");
      run::ulysses_attention_forward(
          *group, *ulysses, *kernel,
          run::ulysses_attention_input<T>{shape, scale, q, k, v, stream_doc, stream_pos}, out, lse, mem());
      return;
    }
    check_bound("attention_forward");
    run::ring_attention_forward(*this->ring.parent, *schedule, *kernel,
                                run::ring_attention_input<T>{shape, scale, q, k, v}, out, lse, mem(),
                                options);
  }

  /// Backward of attention_forward: given its inputs, its out and lse, and dout (the loss gradient with
  /// respect to out), writes (overwrites) dq, dk, dv of the local tokens, including the contributions of
  /// the other ring members' queries to the local keys and values. Collective over the ring's ranks, in
  /// the same order as the forwards. Cost: as run::ring_attention_backward.
  void attention_backward(model::attention_shape shape, T scale, std::span<const T> q, std::span<const T> k,
                          std::span<const T> v, std::span<const T> out, std::span<const T> lse,
                          std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) const {
    if (ulysses != nullptr) {
      check_ulysses("attention_backward");
      run::ulysses_attention_backward(
          *group, *ulysses, *kernel,
          run::ulysses_attention_input<T>{shape, scale, q, k, v, stream_doc, stream_pos}, out, lse, dout, dq,
          dk, dv, mem());
      return;
    }
    check_bound("attention_backward");
    run::ring_attention_backward(*this->ring.parent, *schedule, *kernel,
                                 run::ring_attention_input<T>{shape, scale, q, k, v}, out, lse, dout, dq, dk,
                                 dv, mem(), options);
  }

 private:
  M& mem() const {
    return model::bound_memory(memory, [&] {
      return hetmesh::format(
          "train::step_context: stage {} micro-batch {} has no memory policy bound; expected a "
          "context made by train::system::run (a device memory policy is the system's)",
          this->stage, this->micro_batch);
    });
  }
  void check_ulysses(const char* who) const {
    if (group == nullptr || kernel == nullptr)
      throw_error<invalid_argument>(
          "train::step_context::{}: stage {} micro-batch {} has a Ulysses plan but no group or kernel; "
          "expected a "
          "context made by train::system::run",
          who, this->stage, this->micro_batch);
  }
  void check_bound(const char* who) const {
    if (schedule == nullptr || kernel == nullptr || this->ring.parent == nullptr)
      throw_error<invalid_argument>(
          "train::step_context::{}: stage {} micro-batch {} has no ring attention bound; expected a context "
          "made by train::system::run",
          who, this->stage, this->micro_batch);
  }
};

/// The attention context concept (model/attention_context.hpp), under its earlier name.
using model::attention_context;

static_assert(model::attention_context<
                  step_context<model::communicator_archetype, model::reference_attention, float>, float> &&
              model::attention_context<step_context<model::communicator_archetype, model::reference_attention,
                                                    double, model::emulated_device_memory>,
                                       double>);

}  // namespace hetmesh::train
