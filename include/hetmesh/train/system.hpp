// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: train::system, the first vertical slice of the training system (issue 12 item 3) at
// pipeline depth 1: one LLM partition family (a seq:: policy type), the user's attention kernel (a type), a
// host communicator over the data-parallel pool (dp x cp ranks, or the HDP pool), and a balancer (a
// balance:: policy type placing HDP work, or train::family_placement, the default). `plan` is pure; `run`
// builds this rank's micro-batches from the plan, runs the user's backbone stage forward and backward
// (attention through the context's ring attention entry), reduces the gradients over the pool with a sum
// (each rank's loss is already normalised by the step's global target count, so the sum is the gradient
// of the global loss: a single-rank run of the same batch gives the same gradient), and calls the
// optimizer hook. Pipelines, encoders, delivery and offload come later.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/activation.hpp"
#include "../model/attention.hpp"
#include "../model/micro_batch.hpp"
#include "../model/stage.hpp"
#include "../run/agreement.hpp"
#include "../run/ring_attention.hpp"
#include "context.hpp"
#include "plan.hpp"

namespace hetmesh::train {

/// The micro-batches `rank` runs under `plan`, in execution order, for the step `batch` (every rank
/// holds the whole batch in this slice; delivery by plan is later work). Static CP: the rank's CP share
/// of its group's piece (make_cp_micro_batch over the piece's documents, stream indices of the whole
/// step); HDP: make_hdp_micro_batch of the rank's HDP micro-batch. Every micro-batch carries the step's
/// token and target counts. Pre: `s` is summarize_step(batch), the plan was made from
/// document_descs(batch) (invalid_argument otherwise), 0 <= rank < plan.world. Post: over every rank,
/// each stream token and each counting target appears exactly once. Pure; O(local tokens + documents).
[[nodiscard]] inline std::vector<model::micro_batch> build_micro_batches(const step_plan& plan,
                                                                         const model::step_batch& batch,
                                                                         const model::step_summary& s,
                                                                         int rank) {
  if (model::document_descs(batch) != plan.documents)
    throw_error<invalid_argument>(
        "train::build_micro_batches: the step's documents do not match the plan's {} documents; expected "
        "the batch the plan was made from",
        plan.documents.size());
  if (rank < 0 || rank >= plan.world)
    throw_error<invalid_argument>("train::build_micro_batches: rank {}; expected 0 <= rank < {}", rank,
                                  plan.world);
  std::vector<model::micro_batch> out;
  const auto& mine = plan.per_rank[static_cast<std::size_t>(rank)];
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto& pm = mine[i];
    const int index = static_cast<int>(i);
    if (plan.kind == partition_kind::hdp) {
      const auto& hmb =
          plan.hdp.per_rank[static_cast<std::size_t>(rank)][static_cast<std::size_t>(pm.source)];
      out.push_back(model::make_hdp_micro_batch(batch, s, hmb, rank, index));
      continue;
    }
    const auto& piece = plan.cp_pieces[static_cast<std::size_t>(pm.source)];
    model::step_batch sub;
    sub.pad_token = batch.pad_token;
    for (auto id : piece.doc_ids)
      sub.documents.push_back(batch.documents[static_cast<std::size_t>(s.find(id))]);
    auto mb =
        model::make_cp_micro_batch(sub, model::summarize_step(sub), piece.partition, pm.position, index);
    mb.rank = rank;
    mb.step_tokens = s.tokens;
    mb.step_targets = s.targets;
    for (std::size_t t = 0; t < mb.stream_index.size(); ++t)  // stream indices of the whole step
      if (mb.stream_index[t] >= 0)
        mb.stream_index[t] = s.offsets[static_cast<std::size_t>(s.find(mb.doc_ids[t]))] + mb.positions[t];
    out.push_back(std::move(mb));
  }
  return out;
}

/// What one step did, the same on every rank (reduced over the pool), plus this rank's own times.
struct step_stats {
  double loss = 0.0;               ///< the step's loss: sum over ranks of the stages' loss terms
  std::int64_t targets = 0;        ///< sum over ranks of loss weights: the step's target count, exactly once
  std::int64_t tokens = 0;         ///< real (non-padding) tokens run over every rank: the step's tokens
  std::int64_t micro_batches = 0;  ///< micro-batches run over every rank
  std::uint64_t plan_hash = 0;     ///< the plan's hash
  double forward_seconds = 0.0;    ///< this rank: forward time
  double backward_seconds = 0.0;   ///< this rank: backward time
  double reduce_seconds = 0.0;     ///< this rank: gradient reduction time
};

/// An optimizer hook for a stage of type S: called once per step, after the gradient reduction, as
/// `o(s.parameters(), s.gradients())` (ranges of spans; it updates the parameters in place).
template <class O, class S>
concept optimizer_hook = requires(O& o, S& s) {
  o(s.parameters(), s.gradients());
};

/// The element type of a stage's parameters (the span element of s.parameters()).
template <class S>
using stage_value_t =
    typename std::ranges::range_value_t<decltype(std::declval<S&>().parameters())>::element_type;

/// Options of train::system that are run-time values.
struct system_options {
  run::ring_attention_options attention{};  ///< tags and overlap of ring attention calls
  balance::step_model cost{};  ///< what a balance:: balancer prices HDP work with (unused otherwise)
};

/// The training system at pipeline depth 1. Partition: an LLM partition family, a seq:: policy type
/// (seq::llm_partition) that train lowers to a step plan (trains_family_v): seq::cp_zigzag, seq::cp_thd
/// (static CP over dp = world / cp groups) or seq::hdp<Offload> (HDP over the pool); Kernel: the user's
/// model::attention_kernel; Comm: a host comm::communicator over the whole data-parallel pool; Balancer:
/// who places the family's work (places_family_v), family_placement by default (the family's own
/// placement: static_cp_groups, or seq::plan_hdp with its placement kind), or balance::bytescale /
/// balance::gap_filling_hdp for seq::hdp, priced by system_options::cost. E.g.
/// `system<seq::cp_zigzag, K, C>`, `system<seq::hdp<seq::selective_offload>, K, C, balance::bytescale>`.
/// One object per rank; the communicator and kernel outlive it.
template <seq::llm_partition Partition, class Kernel, comm::communicator Comm,
          class Balancer = family_placement>
class system {
  static_assert(check_trainable<Partition, Balancer>());

 public:
  /// The context the stage receives for element type T.
  template <class T>
  using context_type = step_context<Comm, Kernel, T>;

  /// A system over `world` with the partition family's parameters, the kernel and options.
  system(Partition partition, Comm& world, Kernel kernel = {}, system_options options = {})
      : partition_(std::move(partition)), world_(&world), kernel_(std::move(kernel)), options_(options) {}
  /// A system over `world` with the partition family's and the balancer's parameters, the kernel and
  /// options.
  system(Partition partition, Balancer balancer, Comm& world, Kernel kernel = {}, system_options options = {})
      : partition_(std::move(partition)),
        balancer_(std::move(balancer)),
        world_(&world),
        kernel_(std::move(kernel)),
        options_(options) {}

  /// The step plan for documents `docs` (id, length in stream order) over the pool. Pure: equal on every
  /// rank for equal inputs; not collective: plan_step(partition(), docs, world size, balancer(),
  /// options' cost). Errors: plan_step's (invalid_argument).
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs) const {
    return plan_step(partition_, docs, world_->size(), balancer_, options_.cost);
  }
  /// plan(document_descs(batch)).
  [[nodiscard]] step_plan plan(const model::step_batch& batch) const {
    return plan(model::document_descs(batch));
  }

  /// Runs one step of `plan` over `batch` with the user's backbone stage and optimizer hook; collective
  /// over the pool. In order: checks (collective assertion level) that every rank holds the same plan;
  /// zeroes the stage's gradients; per micro-batch of this rank, in plan order, runs the stage forward
  /// (empty input: text only; output: its per-token loss terms, which it scales by the loss weights over
  /// step_targets) and backward (empty grad_out and grad_in), the stage calling attention through the
  /// context; all-reduces (sum) every gradient span and the step's stats over the pool; calls
  /// `optimizer(stage.parameters(), stage.gradients())`. Post: the gradients equal those of a single-rank
  /// run of the same batch (up to rounding). Requires (static_asserts naming what is missing): Stage is a
  /// model::backbone_stage with context_type<T>, Kernel a model::attention_kernel<T>, Optimizer an
  /// optimizer_hook. Errors: plan disagreement (mismatch_error), a batch other than the plan's, a
  /// micro-batch whose tokens are not in its ring's order, a stage that leaves activation slots behind
  /// (invalid_argument); ring attention's errors. Deterministic for a deterministic stage and kernel.
  /// Cost: the stage on the rank's tokens, ring attention's hops, one all-reduce per gradient span.
  template <class Stage, class Optimizer, class T = stage_value_t<Stage>>
  step_stats run(const step_plan& plan, const model::step_batch& batch, Stage& stage, Optimizer&& optimizer) {
    static_assert(
        model::attention_kernel<Kernel, T>,
        "train::system: Kernel must model model::attention_kernel<Kernel, T> for the stage's element "
        "type T: `forward(const attention_block<T>&, attention_forward_out<T>)` and "
        "`backward(const attention_block<T>&, attention_backward_io<T>)`");
    static_assert(model::check_backbone_stage<Stage, T, context_type<T>>());
    static_assert(optimizer_hook<Optimizer, Stage>,
                  "train::system::run: the optimizer hook must be callable as "
                  "`optimizer(stage.parameters(), stage.gradients())`");
    using clock = std::chrono::steady_clock;
    auto& world = *world_;
    run::assert_plan_agreement(world, plan, "train step plan");
    if (plan.world != world.size())
      throw_error<invalid_argument>(
          "train::system::run: a plan for {} ranks on a pool of {}; expected equal sizes", plan.world,
          world.size());
    const auto s = model::summarize_step(batch);
    const auto mbs = build_micro_batches(plan, batch, s, world.rank());
    for (auto g : stage.gradients())
      for (auto& x : std::span<T>(g)) x = T(0);

    step_stats st;
    st.plan_hash = plan.hash();
    double sums[2] = {0.0, 0.0};  // loss, weights
    std::int64_t counts[3] = {0, 0, static_cast<std::int64_t>(mbs.size())};
    model::host_activation_store<T> store;
    const auto& mine = plan.per_rank[static_cast<std::size_t>(world.rank())];
    for (std::size_t i = 0; i < mbs.size(); ++i) {
      const auto view = mbs[i].view();
      const auto& sched = plan.rings[static_cast<std::size_t>(mine[i].ring)];
      check_ring_order(sched, mine[i].position, view);
      context_type<T> ctx;
      ctx.activations = &store;
      ctx.ring = {world_, std::span<const int>(sched.ring), mine[i].position};
      ctx.stage = 0;
      ctx.micro_batch = static_cast<int>(i);
      ctx.schedule = &sched;
      ctx.kernel = &kernel_;
      ctx.options = options_.attention;
      std::vector<T> out(static_cast<std::size_t>(stage.output_size(view)));
      const auto t0 = clock::now();
      stage.forward(ctx, view, std::span<const T>{}, std::span<T>(out));
      const auto t1 = clock::now();
      stage.backward(ctx, view, std::span<const T>{}, std::span<T>{});
      const auto t2 = clock::now();
      st.forward_seconds += std::chrono::duration<double>(t1 - t0).count();
      st.backward_seconds += std::chrono::duration<double>(t2 - t1).count();
      for (auto x : out) sums[0] += static_cast<double>(x);
      for (auto w : view.loss_weights) sums[1] += w;
      for (auto si : view.stream_index) counts[0] += si >= 0 ? 1 : 0;
      if (const int left = store.release_all(0, static_cast<int>(i)); left != 0)
        throw_error<invalid_argument>(
            "train::system::run: the stage left {} activation slots of micro-batch {} after its backward; "
            "expected backward to release what forward saved",
            left, i);
    }
    const auto t3 = clock::now();
    for (auto g : stage.gradients()) comm::all_reduce(world, std::span<T>(g), comm::reduce_op::sum);
    comm::all_reduce(world, std::span<double>(sums), comm::reduce_op::sum);
    comm::all_reduce(world, std::span<std::int64_t>(counts), comm::reduce_op::sum);
    st.reduce_seconds = std::chrono::duration<double>(clock::now() - t3).count();
    st.loss = sums[0];
    st.targets = static_cast<std::int64_t>(sums[1] + 0.5);
    st.tokens = counts[0];
    st.micro_batches = counts[2];
    optimizer(stage.parameters(), stage.gradients());
    return st;
  }

  /// The partition family's parameters.
  [[nodiscard]] const Partition& partition() const noexcept { return partition_; }
  /// The balancer's parameters.
  [[nodiscard]] const Balancer& balancer() const noexcept { return balancer_; }
  /// The pool's communicator.
  [[nodiscard]] Comm& world() const noexcept { return *world_; }

 private:
  /// The micro-batch's tokens must be the ring position's tokens in the schedule's local order: the
  /// stage's q, k, v rows are the ring's rows.
  static void check_ring_order(const seq::ring_schedule& s, int position, const model::micro_batch_view& v) {
    const auto meta = run::ring_meta(s, position);
    const auto n = static_cast<std::size_t>(v.size());
    bool ok = meta.pos.size() == n;
    for (std::size_t t = 0; ok && t < n; ++t) ok = meta.pos[t] == v.positions[t];
    if (!ok)
      throw_error<invalid_argument>(
          "train::system::run: micro-batch {} has {} tokens that do not follow its ring's {} tokens at "
          "position {} "
          "in order; expected the plan's micro-batches",
          v.index, n, meta.pos.size(), position);
  }

  Partition partition_;
  Balancer balancer_{};
  Comm* world_;
  Kernel kernel_;
  system_options options_;
};

/// A plain SGD optimizer hook: p -= lr * g for every parameter. Deterministic; O(parameters).
template <class T>
struct sgd {
  T lr = T(0.01);  ///< learning rate

  /// Updates every parameter span in place from its gradient span (same order and sizes).
  template <class Params, class Grads>
  void operator()(Params&& params, Grads&& grads) const {
    auto g = std::ranges::begin(grads);
    for (auto p : params) {
      std::span<T> ps(p);
      std::span<T> gs(*g);
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i] -= lr * gs[i];
      ++g;
    }
  }
};

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::step_stats> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_stats& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "step{{loss={:.6g}, targets={}, tokens={}, micro_batches={}, plan={:#018x}, "
                              "forward={:.3g}s, backward={:.3g}s, reduce={:.3g}s}}",
                              s.loss, s.targets, s.tokens, s.micro_batches, s.plan_hash, s.forward_seconds,
                              s.backward_seconds, s.reduce_seconds);
  }
};
