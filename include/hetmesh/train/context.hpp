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
// so that model/ stays free of run/ (the rooms of docs/architecture.md): a model stays generic over its
// context type, or constrains it on model::attention_context (model/attention_context.hpp).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/activation.hpp"
#include "../model/attention.hpp"
#include "../model/attention_context.hpp"
#include "../model/context.hpp"
#include "../model/host_memory.hpp"
#include "../model/reference_attention.hpp"
#include "../model/token_mixing.hpp"
#include "../run/halo.hpp"
#include "../run/ring_attention.hpp"
#include "../run/ulysses_attention.hpp"
#include "../seq/halo.hpp"
#include "../seq/ring.hpp"
#include "offload.hpp"
#include "partition_family.hpp"

namespace hetmesh::train {

/// The activation store of train::system's stages for element T in memory M: selective offload over slots
/// in M's buffers (host memory: train::offload_store<T>).
template <class T, class M = model::host_memory>
using step_store = offload_store<T, model::memory_activation_store<T, M>>;

namespace detail {

/// What a step context holds for its family's attention mechanism (partition_part::attention), and how it
/// calls attention: ring attention over the micro-batch's ring (attention_over_rings), or Ulysses attention
/// over its group (attention_over_groups). `group_size(part)`: consecutive pool ranks per group the system
/// splits for it (0: none); `bind(part, pm, ring, stream_doc, stream_pos, group, options)` fills it for one
/// planned micro-batch; `bound()` says it was; `forward`/`backward` run the calls.
template <class Mechanism, class Comm>
struct attention_binding;

template <class Comm>
struct attention_binding<attention_over_rings, Comm> {
  const seq::ring_schedule* schedule = nullptr;  ///< the micro-batch's ring (its position: ring.position)
  run::ring_attention_options options{};         ///< tags and overlap of the ring calls

  /// The mechanism's name, for messages.
  static constexpr std::string_view mechanism = "ring";
  /// No group: rings come with the plan.
  template <class Part>
  static int group_size(const Part&) noexcept {
    return 0;
  }
  /// Binds the micro-batch's ring.
  template <class Part>
  void bind(const Part&, const planned_micro_batch&, const seq::ring_schedule& ring,
            std::span<const std::int64_t>, std::span<const std::int64_t>, Comm*,
            const run::ring_attention_options& o) {
    schedule = &ring;
    options = o;
  }
  /// Whether a ring is bound (over `ring`, the context's ring group).
  [[nodiscard]] bool bound(const model::ring_group<Comm>& ring) const noexcept {
    return schedule != nullptr && ring.parent != nullptr;
  }
  template <class Kernel, class T, class M>
  void forward(const model::ring_group<Comm>& ring, Kernel& k, const run::ring_attention_input<T>& in,
               std::span<T> out, std::span<T> lse, M& mem) const {
    run::ring_attention_forward(*ring.parent, *schedule, k, in, out, lse, mem, options);
  }
  template <class Kernel, class T, class M>
  void backward(const model::ring_group<Comm>& ring, Kernel& k, const run::ring_attention_input<T>& in,
                std::span<const T> out, std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                std::span<T> dk, std::span<T> dv, M& mem) const {
    run::ring_attention_backward(*ring.parent, *schedule, k, in, out, lse, dout, dq, dk, dv, mem, options);
  }
  /// The halo plan of the caller's ring position for k tokens: the members are the ring's positions, each
  /// holding its chunks in local order.
  [[nodiscard]] seq::halo_plan halo_plan(const model::ring_group<Comm>& ring, int k) const {
    std::vector<std::vector<seq::position_run>> members(schedule->chunks.size());
    for (std::size_t m = 0; m < members.size(); ++m)
      for (const auto& c : schedule->chunks[m])
        if (c.positions.size() > 0) members[m].push_back({c.doc, c.positions});
    return seq::make_halo_plan(members, ring.position, k);
  }
  /// The communicator of the halo exchange and each member's rank in it: the ring's parent and its ranks.
  [[nodiscard]] std::pair<Comm*, std::vector<int>> halo_group(const model::ring_group<Comm>& ring) const {
    return {ring.parent, std::vector<int>(schedule->ring.begin(), schedule->ring.end())};
  }
};

template <class Comm>
struct attention_binding<attention_over_groups, Comm> {
  const seq::ulysses_plan* ulysses = nullptr;  ///< the group's exchange plan
  Comm* group = nullptr;                       ///< the group's communicator, in stream order
  std::span<const std::int64_t> stream_doc;    ///< document of every token of the group
  std::span<const std::int64_t> stream_pos;    ///< position of every token of the group

  /// The mechanism's name, for messages.
  static constexpr std::string_view mechanism = "group (Ulysses)";
  /// The part's group size (consecutive pool ranks).
  template <class Part>
  static int group_size(const Part& p) {
    return p.group_size();
  }
  /// Binds the micro-batch's exchange plan, its group's communicator and stream.
  template <class Part>
  void bind(const Part& part, const planned_micro_batch& pm, const seq::ring_schedule&,
            std::span<const std::int64_t> doc, std::span<const std::int64_t> pos, Comm* g,
            const run::ring_attention_options&) {
    ulysses = &part.exchange(pm.source);
    group = g;
    stream_doc = doc;
    stream_pos = pos;
  }
  /// Whether a group is bound.
  [[nodiscard]] bool bound(const model::ring_group<Comm>&) const noexcept {
    return group != nullptr && ulysses != nullptr;
  }
  template <class Kernel, class T, class M>
  void forward(const model::ring_group<Comm>&, Kernel& k, const run::ring_attention_input<T>& in,
               std::span<T> out, std::span<T> lse, M& mem) const {
    run::ulysses_attention_forward(*group, *ulysses, k, as_group_input(in), out, lse, mem);
  }
  template <class Kernel, class T, class M>
  void backward(const model::ring_group<Comm>&, Kernel& k, const run::ring_attention_input<T>& in,
                std::span<const T> out, std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                std::span<T> dk, std::span<T> dv, M& mem) const {
    run::ulysses_attention_backward(*group, *ulysses, k, as_group_input(in), out, lse, dout, dq, dk, dv, mem);
  }
  /// The halo plan of the caller's group rank for k tokens: member m holds the m-th slice of the group's
  /// stream (the exchange plan's token counts).
  [[nodiscard]] seq::halo_plan halo_plan(const model::ring_group<Comm>&, int k) const {
    std::vector<std::vector<seq::position_run>> members;
    std::size_t offset = 0;
    for (const auto n : ulysses->tokens) {
      const auto c = static_cast<std::size_t>(n);
      members.push_back(seq::runs_of(stream_doc.subspan(offset, c), stream_pos.subspan(offset, c)));
      offset += c;
    }
    return seq::make_halo_plan(members, group->rank(), k);
  }
  /// The communicator of the halo exchange and each member's rank in it: the group, ranks 0 .. size - 1.
  [[nodiscard]] std::pair<Comm*, std::vector<int>> halo_group(const model::ring_group<Comm>&) const {
    std::vector<int> ranks(static_cast<std::size_t>(group->size()));
    for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
    return {group, std::move(ranks)};
  }

 private:
  template <class T>
  run::ulysses_attention_input<T> as_group_input(const run::ring_attention_input<T>& in) const {
    return {in.shape, in.scale, in.q, in.k, in.v, stream_doc, stream_pos};
  }
};

}  // namespace detail

/// The context train::system hands a backbone stage for one (stage, micro-batch) call: everything a
/// model::stage_context holds (tp, ep, the micro-batch's ring, activation slots in a store of T in memory
/// M), plus the attention entry bound, by the partition family's mechanism `Attention`
/// (train::attention_over_rings: ring attention over the micro-batch's ring; train::attention_over_groups:
/// Ulysses attention over its group), to the system's kernel. Spans the stage passes are memory of M (device
/// memory for a device policy). Holds pointers (schedule or exchange plan, kernel, store, communicators,
/// memory policy) that the runtime keeps alive across the call.
template <class Comm, class Kernel, class T, class M = model::host_memory,
          class Attention = attention_over_rings>
struct step_context : model::stage_context<Comm, step_store<T, M>>,
                      detail::attention_binding<Attention, Comm> {
  /// Element type of activations and parameters.
  using value_type = T;
  /// The attention kernel type.
  using kernel_type = Kernel;
  /// The memory policy of the stage's buffers.
  using memory_type = M;
  /// The attention mechanism (train::attention_over_rings or train::attention_over_groups).
  using attention_type = Attention;

  Kernel* kernel = nullptr;  ///< the system's kernel
  M* memory = nullptr;       ///< the system's memory policy (null: M{}; host only)
  /// What the stage declared of its token mixing (model/token_mixing.hpp): halo() allows up to its halo.
  model::token_mixing mixing = model::through_attention;

  /// Causal per-document attention of the micro-batch's local queries over every key of its ring (or, under
  /// groups, of its group's stream): out [tokens][q_heads][head_dim] and lse [tokens][q_heads] (natural
  /// log), for q [tokens][q_heads][head_dim] and k, v [tokens][kv_heads][head_dim] of the local tokens in
  /// the micro-batch's order. Collective over the ring's (group's) ranks (each calls it the same number of
  /// times, in the same order); a ring of one rank only runs the kernel. Pre: spans sized as above
  /// (invalid_argument otherwise). The stage saves q, k, v, out and lse (its activation slots) for
  /// attention_backward. Cost: as run::ring_attention_forward (run::ulysses_attention_forward).
  void attention_forward(model::attention_shape shape, T scale, std::span<const T> q, std::span<const T> k,
                         std::span<const T> v, std::span<T> out, std::span<T> lse) const {
    if (q.empty() && !this->bound(this->ring)) return;  // an empty slot's call (ep > 1): nothing to attend
    check_bound("attention_forward");
    this->forward(this->ring, *kernel, run::ring_attention_input<T>{shape, scale, q, k, v}, out, lse, mem());
  }

  /// Backward of attention_forward: given its inputs, its out and lse, and dout (the loss gradient with
  /// respect to out), writes (overwrites) dq, dk, dv of the local tokens, including the contributions of
  /// the other members' queries to the local keys and values. Collective over the ring's (group's) ranks,
  /// in the same order as the forwards. Cost: as run::ring_attention_backward.
  void attention_backward(model::attention_shape shape, T scale, std::span<const T> q, std::span<const T> k,
                          std::span<const T> v, std::span<const T> out, std::span<const T> lse,
                          std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) const {
    if (q.empty() && !this->bound(this->ring)) return;  // an empty slot's call (ep > 1)
    check_bound("attention_backward");
    this->backward(this->ring, *kernel, run::ring_attention_input<T>{shape, scale, q, k, v}, out, lse, dout,
                   dq, dk, dv, mem());
  }

  /// The causal halo of `k` tokens of this call's micro-batch: for every local token (in the micro-batch's
  /// order) and lag 1..k, where the token `lag` positions earlier in its document is (plan.source(token,
  /// lag): a local row, a row of the halo buffer, or zero before the document's start), and what the
  /// exchange moves. Not collective (planned from the micro-batch's ring or group layout). Errors: k above
  /// what the stage declared (model::causal_halo(k) as its token_mixing), an unbound context
  /// (invalid_argument). O(ring tokens x k) at worst.
  [[nodiscard]] seq::halo_plan halo(int k) const {
    if (kernel != nullptr && !this->bound(this->ring))  // an empty slot's call (ep > 1): no tokens
      return seq::make_halo_plan(std::vector<std::vector<seq::position_run>>(1), 0, std::max(k, 0));
    check_bound("halo");
    if (k < 1 || mixing.how != model::token_mixing::kind::halo || k > mixing.halo)
      throw_error<invalid_argument>(
          "train::step_context::halo: stage {} asks for a halo of {} tokens but declares token_mixing = {}; "
          "expected 1 <= k <= the stage's `static constexpr model::token_mixing token_mixing = "
          "model::causal_halo(k);`",
          this->stage, k, mixing);
    return this->halo_plan(this->ring, k);
  }
  /// Fills `halo` [p.halo_rows][width] with the rows of x [p.tokens][width] (this call's local rows, e.g.
  /// a layer's input) that other ranks hold, as plan `p` (halo(k)) names them. Collective over the
  /// micro-batch's ring (group): every member calls it for the same micro-batch in the same order (as
  /// attention_forward). Cost: run::halo_forward (one p2p batch; nothing when every row is local).
  void halo_forward(const seq::halo_plan& p, std::int64_t width, std::span<const T> x,
                    std::span<T> halo) const {
    if (p.local_only()) return;
    check_bound("halo_forward");
    const auto [c, ranks] = this->halo_group(this->ring);
    run::halo_forward(*c, std::span<const int>(ranks), p, width, x, halo, mem());
  }
  /// Backward of halo_forward: sends `dhalo` (the loss gradient with respect to the halo rows) to the ranks
  /// that own those rows, and adds what the others send for this call's rows into `dx` [p.tokens][width]
  /// (which already holds the stage's local contributions, including through halo_source::kind::local
  /// sources). Collective as halo_forward. Cost: run::halo_backward.
  void halo_backward(const seq::halo_plan& p, std::int64_t width, std::span<const T> dhalo,
                     std::span<T> dx) const {
    if (p.local_only()) return;
    check_bound("halo_backward");
    const auto [c, ranks] = this->halo_group(this->ring);
    run::halo_backward(*c, std::span<const int>(ranks), p, width, dhalo, dx, mem());
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
  void check_bound(const char* who) const {
    if (kernel == nullptr || !this->bound(this->ring))
      throw_error<invalid_argument>(
          "train::step_context::{}: stage {} micro-batch {} has no {} attention bound; expected a context "
          "made "
          "by train::system::run",
          who, this->stage, this->micro_batch, this->mechanism);
  }
};

/// The attention context concept (model/attention_context.hpp), under its earlier name.
using model::attention_context;

static_assert(model::halo_context<
              step_context<model::communicator_archetype, model::reference_attention, float>, float>);
static_assert(model::attention_context<
                  step_context<model::communicator_archetype, model::reference_attention, float>, float> &&
              model::attention_context<step_context<model::communicator_archetype, model::reference_attention,
                                                    double, model::emulated_device_memory>,
                                       double>);

}  // namespace hetmesh::train
