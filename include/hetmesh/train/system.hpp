// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: train::system, the training system over policy types: an LLM partition family (a seq::
// policy type), the user's attention kernel, a host communicator over the world, a balancer (a balance::
// policy type placing HDP work, or train::family_placement), a pipeline schedule family and an encoder
// placement. `plan` is pure (train/plan.hpp, train/pipeline_plan.hpp); `run` builds this pipeline's
// micro-batches from the plan, runs the plan's schedule with run::execute_pipeline (encoders, the user's
// backbone stages forward and backward, attention through the context's ring attention entry over the
// pool at this pipeline rank), reduces the stages' gradients over the pool and the encoders' over the
// world with a sum (each rank's loss is already normalised by the step's global target count, so the sum is
// the gradient of the global loss: a single-rank run of the same batch gives the same gradient), and calls
// the optimizer hook. `run` takes the whole step's batch, or this rank's share of it under delivery by plan
// (train/delivery.hpp, train/build.hpp).
#pragma once

#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <optional>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../comm/group_cache.hpp"
#include "../core/cpu_time.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/activation.hpp"
#include "../model/attention.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/host_memory.hpp"
#include "../model/micro_batch.hpp"
#include "../model/stage.hpp"
#include "../pipeline/schedule_family.hpp"
#include "../run/agreement.hpp"
#include "../run/pipeline_executor.hpp"
#include "../run/ring_attention.hpp"
#include "../seq/long_short.hpp"
#include "build.hpp"
#include "context.hpp"
#include "delivery.hpp"
#include "encoder_context.hpp"
#include "encoder_domain.hpp"
#include "encoders.hpp"
#include "memory.hpp"
#include "optimizer.hpp"
#include "pipeline_plan.hpp"
#include "plan.hpp"

namespace hetmesh::train {

/// What one step did, the same on every rank (reduced over the world), plus this rank's own times.
struct step_stats {
  double loss = 0.0;               ///< the step's loss: sum over ranks of the last stage's loss terms
  std::int64_t targets = 0;        ///< sum over ranks of loss weights: the step's target count, exactly once
  std::int64_t tokens = 0;         ///< real (non-padding) tokens run over every pipeline: the step's tokens
  std::int64_t micro_batches = 0;  ///< non-empty micro-batches run over every pipeline
  std::int64_t encoder_items = 0;  ///< encoder items encoded over every rank (an item split over ranks
                                   ///< of its document counts on each)
  std::uint64_t plan_hash = 0;     ///< the plan's hash
  double forward_seconds = 0.0;    ///< this rank: time in forward actions (encoders included)
  double backward_seconds = 0.0;   ///< this rank: time in backward actions (I and W included)
  double busy_seconds = 0.0;       ///< this rank: time in compute actions (forward + backward)
  double cpu_busy_seconds = 0.0;   ///< this rank: thread CPU time in the stages and encoders (its own work,
                                   ///< whatever else shares the cores)
  double step_seconds = 0.0;       ///< this rank: the pipeline's wall time, communication included
  double reduce_seconds = 0.0;     ///< this rank: gradient reduction time
  double cpu_step_seconds = 0.0;   ///< this rank: thread CPU time of the whole run() call
  double cpu_comm_seconds = 0.0;   ///< this rank: thread CPU time moving bytes: the pipeline's SEND/RECV
                                   ///< actions, the step's barrier, the gradient and stats reductions
  double cpu_optimizer_seconds = 0.0;  ///< this rank: thread CPU time in the optimizer hook
  std::int64_t activation_peak_bytes =
      0;                             ///< this rank: peak resident bytes of the stages' saved activations
  std::int64_t offloaded_bytes = 0;  ///< this rank: activation bytes offloaded (selective offload)
  /// This rank's executed actions with their wall times (seconds since the step began), the simulator's
  /// trace format (pipeline::timed_action; its rank is this rank's world rank).
  std::vector<pipeline::timed_action> timeline;
  /// This rank's calls into the stages and encoders with their thread CPU times (start and end: CPU
  /// seconds since the step began), for cost calibration where ranks share cores.
  std::vector<pipeline::timed_action> cpu_actions;

  /// This rank's thread CPU time in the library during run(): the whole call less the user's stage and
  /// encoder calls (cpu_busy_seconds), the bytes on the wire (cpu_comm_seconds) and the optimizer hook;
  /// what remains is plan agreement, micro-batch building, dispatch and bookkeeping. Never negative.
  [[nodiscard]] double library_cpu_seconds() const noexcept {
    const double d = cpu_step_seconds - cpu_busy_seconds - cpu_comm_seconds - cpu_optimizer_seconds;
    return d > 0.0 ? d : 0.0;
  }
};

/// An optimizer hook for a stage of type S: called once per step, after the gradient reduction, as
/// `o(s.parameters(), s.gradients())` (ranges of spans; it updates the parameters in place). The encoders'
/// parameters get the same call after the stage's.
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
  /// Reduce gradients and stats in rank order (an all-gather, then rank 0 + rank 1 + ...): bitwise the
  /// same result on every backend (loopback's all-reduce already adds in rank order, MPI's and NCCL's
  /// need not), at the cost of moving every rank's buffer to every rank. Off: the backend's all-reduce.
  bool reproducible = false;
  /// Long-short sequence parallelism for encoder items (MegaScale-Omni), per encoder and slot over the
  /// encoder domain (train/encoder_domain.hpp: every pipeline's encoder shards): an item above
  /// max_tokens_per_rank (or too costly to balance) is split over a Ulysses group inside one shard's pool
  /// row (`heads`: the encoder's attention heads), shorter ones run whole, balanced by the policy's cost.
  seq::long_short_policy encoder_sp{};
};

/// The pipeline of train::system: its depth (a run-time value: the cluster's), the schedule family and
/// the encoder placement (policy types; their members are parameters).
template <pipeline::schedule_family Schedule = pipeline::one_f_one_b,
          class Placement = pipeline::encoder_on_first_stage>
struct pipeline_config {
  int pp = 1;            ///< pipeline depth: the world is (pp + encoder-pool ranks) x pool ranks
  Schedule schedule{};   ///< the schedule family (e.g. pipeline::zero_bubble)
  Placement encoders{};  ///< where the encoders run (pipeline::colocated_encoder: the joint pipeline)
};

/// The step plan train::system<Partition, Kernel, Comm, Balancer, Schedule, Placement>::plan makes, as a
/// function of its parameters alone: plan_step(partition, docs, pool, balancer, cost), then
/// attach_pipeline(plan, pipeline.schedule, pipeline.encoders, pipeline.pp, batch) (`batch`: the batch
/// the documents came from, for its encoder items; null for none). Needs no communicator, so tools and
/// benchmarks plan at any scale; the system calls it with its pool (world / (pp + encoder-pool ranks)). Pure:
/// a function of (policies, pool, documents, batch), equal on every rank; not collective. Errors: plan_step's
/// and attach_pipeline's. Cost: the partition's planner plus the schedule's generation and verification.
template <class Partition, class Balancer, pipeline::schedule_family Schedule, class Placement>
[[nodiscard]] step_plan plan_system_step(const Partition& partition, const Balancer& balancer,
                                         const pipeline_config<Schedule, Placement>& pipeline,
                                         const balance::step_model& cost, int pool,
                                         std::span<const seq::seq_desc> docs,
                                         const model::step_batch* batch = nullptr) {
  auto p = plan_step(partition, docs, pool, balancer, cost);
  attach_pipeline(p, pipeline.schedule, pipeline.encoders, pipeline.pp, batch);
  return p;
}

/// An encoder of the model, as train::system::run takes it: the user's model::encoder_stage and a callable
/// `input(const model::encoder_batch_view&, std::span<T>)` that writes the encoder's input for the items
/// of the view (e.g. their image patches), input_size(view) elements. Item k of a document (encoder
/// index e) runs on the e-th encoder passed to run.
template <class Encoder, class Input>
struct encoder_binding {
  Encoder* stage = nullptr;  ///< the user's encoder; outlives the step
  Input input;               ///< its input source
};

/// encoder_binding for `e` and `input`.
template <class Encoder, class Input>
[[nodiscard]] encoder_binding<Encoder, std::decay_t<Input>> bind_encoder(Encoder& e, Input&& input) {
  return {&e, std::forward<Input>(input)};
}

namespace detail {

template <class S, class T>
concept sizes_stage_output = requires(const S& s, const model::micro_batch_view& v, int stage) {
  { s.output_size(v, stage) } -> std::convertible_to<std::int64_t>;
};

}  // namespace detail

/// The training system. Partition: an LLM partition family, a seq:: policy type (seq::llm_partition) that
/// train lowers to a step plan (trains_family_v): seq::cp_zigzag, seq::cp_thd (static CP over dp = pool /
/// cp groups) or seq::hdp<Offload> (HDP over the pool); Kernel: the user's model::attention_kernel; Comm:
/// a host comm::communicator over the world (pp x pool ranks; pipeline rank slowest), which must split
/// (comm::split) when pp > 1; Balancer: who places the family's work (places_family_v), family_placement by
/// default, or balance::bytescale / balance::gap_filling_hdp for seq::hdp, priced by system_options::cost;
/// Schedule: a pipeline::schedule_family (gpipe, one_f_one_b, interleaved_1f1b, zero_bubble, ...; a family
/// with split backward requires model::split_backward_stage, checked at compile time); Placement: where
/// encoders run (pipeline::encoder_on_first_stage, or pipeline::colocated_encoder: the joint pipeline, a
/// shard on every pipeline rank filling the LLM's bubbles; or pipeline::encoder_pool: `ranks` encoder-only
/// ranks per pipeline after its pp LLM ranks, so the world is (pp + ranks) x pool). E.g.
/// `system<seq::cp_zigzag, K, C>`, `system<seq::hdp<seq::selective_offload>, K, C, balance::bytescale,
/// pipeline::zero_bubble, pipeline::colocated_encoder>`. One object per rank; constructing it is collective
/// over the world (it splits the pipeline's communicators); the communicator and kernel outlive it.
template <seq::llm_partition Partition, class Kernel, comm::communicator Comm,
          class Balancer = family_placement, pipeline::schedule_family Schedule = pipeline::one_f_one_b,
          class Placement = pipeline::encoder_on_first_stage, class Memory = default_memory_t<Comm>>
class system {
  static_assert(check_trainable<Partition, Balancer>());
  static_assert(model::memory_policy<Memory>,
                "train::system over a device communicator: name its memory policy as the last template "
                "argument (a model::memory_policy of memory_space::device: cuda::device_memory on the "
                "communicator's stream for NCCL)");
  static_assert(
      !model::memory_policy<Memory> || Memory::space == Comm::memory,
      "train::system: the memory policy's space must be the communicator's (model::host_memory for a "
      "host communicator, a device memory policy for a device communicator)");

 public:
  /// The memory policy of activations, gradients and the runtime's buffers.
  using memory_type = Memory;
  /// The context the backbone stage receives for element type T.
  template <class T>
  using context_type = step_context<Comm, Kernel, T, Memory>;
  /// The context an encoder receives for element type T (its items' groups, attention inside items).
  template <class T>
  using encoder_context_type = encoder_context<Comm, Kernel, T, Memory>;
  /// The pipeline configuration type.
  using pipeline_type = pipeline_config<Schedule, Placement>;

  /// A system over `world` (pipeline depth 1) with the partition family's parameters, the kernel and
  /// options.
  system(Partition partition, Comm& world, Kernel kernel = {}, system_options options = {})
      : system(std::move(partition), Balancer{}, pipeline_type{}, world, std::move(kernel), options) {}
  /// A system over `world` (pipeline depth 1) with the partition family's and the balancer's parameters.
  system(Partition partition, Balancer balancer, Comm& world, Kernel kernel = {}, system_options options = {})
      : system(std::move(partition), std::move(balancer), pipeline_type{}, world, std::move(kernel),
               options) {}
  /// A system over `world` with every policy's parameters. Collective over the world (it splits the
  /// pipeline's communicators). Errors: pp < 1 or not dividing the world size (invalid_argument).
  system(Partition partition, Balancer balancer, pipeline_type pipeline, Comm& world, Kernel kernel = {},
         system_options options = {})
      : partition_(std::move(partition)),
        balancer_(std::move(balancer)),
        pipeline_(std::move(pipeline)),
        world_(&world),
        kernel_(std::move(kernel)),
        options_(options) {
    const int pp = pipeline_.pp;
    const int enc = encoder_ranks();
    if (enc < 0)
      throw_error<invalid_argument>(
          "train::system: a separate encoder pool (pipeline::encoder_pool) of fewer than one rank per "
          "pipeline; expected ranks >= 1");
    if (pp < 1 || world.size() % (pp + enc) != 0)
      throw_error<invalid_argument>(
          "train::system: pipeline depth pp = {}{} over a world of {} ranks; expected pp >= 1 and pp + "
          "encoder-pool ranks dividing the world (pool = world / (pp + encoder ranks) ranks per pipeline "
          "rank)",
          pp, enc > 0 ? hetmesh::format(" with {} encoder-pool ranks per pipeline", enc) : std::string(),
          world.size());
    pool_size_ = world.size() / (pp + enc);
    // A device policy on the communicator's stream by default (e.g. cuda::device_memory(world.stream())):
    // the runtime's copies then run in order with the collectives and the stages' kernels.
    if constexpr (requires { Memory(world.stream()); }) mem_ = Memory(world.stream());
    static_assert(
        requires { comm::split(world, 0, 0); },
        "train::system: Comm must split (comm::split: a backend split or subgroup) for the pipeline's "
        "communicators");
    // The pipeline's communicator (its pp LLM ranks, then its encoder-pool ranks) and, when the world has
    // more than one pipeline rank, the pool at this pipeline rank.
    pipe_.emplace(comm::split(world, world.rank() % pool_size_, world.rank() / pool_size_));
    if (pp + enc > 1) pool_.emplace(comm::split(world, world.rank() / pool_size_, world.rank() % pool_size_));
    if constexpr (std::same_as<Partition,
                               seq::ulysses>) {  // the Ulysses groups: `degree` consecutive pool ranks
      const int d = partition_.degree;
      if (d < 1 || pool_size_ % d != 0)
        throw_error<invalid_argument>(
            "train::system: Ulysses degree {} over a pool of {} ranks; expected a degree >= 1 dividing the "
            "pool",
            d, pool_size_);
      Comm& pool = pool_ ? *pool_ : world;
      group_.emplace(comm::split(pool, pool.rank() / d, pool.rank() % d));
    }
  }

  /// The step plan for documents `docs` (id, length in stream order) over the pool, with the pipeline
  /// (no encoders). Pure: equal on every rank for equal inputs; not collective. Errors: plan_step's and
  /// attach_pipeline's (invalid_argument).
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs) const { return plan_impl(docs, nullptr); }
  /// The step plan of `batch`: plan(document_descs(batch)), with the batch's encoder items placed in the
  /// pipeline by the Placement policy.
  [[nodiscard]] step_plan plan(const model::step_batch& batch) const {
    const auto docs = model::document_descs(batch);
    return plan_impl(docs, &batch);
  }

  /// Runs one step of `plan` over `batch` with the user's backbone stage (this rank's stages: the stages
  /// local_stages() names, told apart by ctx.stage), optimizer hook and encoders (bind_encoder; the e-th
  /// serves items of encoder index e); collective over the world. In order: checks (collective assertion
  /// level) that every rank holds the same plan; zeroes gradients; builds the pipeline's micro-batches (one
  /// per slot; a slot this pool rank has none in runs empty, without calling the stage); runs the plan's
  /// schedule: encoder forward (shard e in slot m encodes its part of the slot's encoder domain, exchanges
  /// rows over its pool row and sends its pipeline's landing rows to stage 0), stage forward (stage 0's
  /// input: the landings' rows in view.encoder_outputs order; the last stage's output: its per-token loss
  /// terms, which it scales by the loss weights over step_targets), backward (or I then W under
  /// split-backward schedules), encoder backward; all-reduces (sum) the stage's gradients over its pool and
  /// the encoders' over the world, and the stats; calls `optimizer(stage.parameters(), stage.gradients())`,
  /// then the same for each encoder. Output sizes come from `stage.output_size(view, stage_index)` when the
  /// stage has it, else `stage.output_size(view)`. Post: the gradients equal those of a single-rank run of
  /// the same batch (up to rounding). Errors: plan disagreement (mismatch_error), a plan for another world or
  /// batch, a micro-batch whose tokens are not in its ring's order, an item of an encoder not passed, a stage
  /// that leaves activation slots behind, encoder items the plan does not know (invalid_argument); an item no
  /// group of a pool row can hold (capacity_error); ring attention's, the executor's and the stages'
  /// errors, with the action as context. Deterministic for deterministic stages and kernel.
  template <class Stage, class Optimizer, class... Encoders>
  step_stats run(const step_plan& plan, const model::step_batch& batch, Stage& stage, Optimizer&& optimizer,
                 Encoders... encoders) {
    const double cpu0 = thread_cpu_seconds();  // the whole call, its checks and summary included
    if (model::document_descs(batch) != plan.documents)
      throw_error<invalid_argument>(
          "train::system::run: the step's documents do not match the plan's {} documents; expected the batch "
          "the plan was made from",
          plan.documents.size());
    return run_step(cpu0, plan, batch, model::summarize_step(batch), stage,
                    std::forward<Optimizer>(optimizer), std::move(encoders)...);
  }

  /// Runs one step of `plan` over this rank's share of it (delivery by plan: train::plan_delivery routes
  /// each sample's bytes to the ranks that read them, run::receive_routed brings them, train::share_of
  /// makes the share): the same as run over the whole batch, reading only the share's documents. An encoder's
  /// input callable reads the items this rank encodes (plan_delivery routes them here). Collective from
  /// the start: the ranks first agree that each could build its micro-batches from its share
  /// (run::agree_on_failure), so a rank whose share is wrong fails the others at once. Errors: run's;
  /// invalid_argument when the share lacks a document this rank's micro-batches read (on that rank; the
  /// others throw invalid_argument naming it).
  template <class Stage, class Optimizer, class... Encoders>
  step_stats run(const step_plan& plan, const rank_share& share, Stage& stage, Optimizer&& optimizer,
                 Encoders... encoders) {
    const double cpu0 = thread_cpu_seconds();
    std::pair<model::step_batch, model::step_summary> local;
    std::exception_ptr failure;
    try {
      if (plan.world != pool_size_)  // before indexing the plan by this rank
        throw_error<invalid_argument>("train::system::run: a plan for a pool of {} ranks; expected {}",
                                      plan.world, pool_size_);
      local = detail::sparse_step(plan, share, world_->rank() % pool_size_);
    } catch (...) {
      failure = std::current_exception();
    }
    run::agree_on_failure(*world_, mem_, failure, "train::system::run (its share)");
    return run_step(cpu0, plan, local.first, local.second, stage, std::forward<Optimizer>(optimizer),
                    std::move(encoders)...);
  }

 private:
  template <class Stage, class Optimizer, class... Encoders, class T = stage_value_t<Stage>>
  step_stats run_step(double run_cpu0, const step_plan& plan, const model::step_batch& batch,
                      const model::step_summary& s, Stage& stage, Optimizer&& optimizer,
                      Encoders... encoders) {
    static_assert(
        model::attention_kernel<Kernel, T>,
        "train::system: Kernel must model model::attention_kernel<Kernel, T> for the stage's element "
        "type T: `forward(const attention_block<T>&, attention_forward_out<T>)` and "
        "`backward(const attention_block<T>&, attention_backward_io<T>)`");
    static_assert(model::check_backbone_stage<Stage, T, context_type<T>>());
    static_assert(
        pipeline::check_schedule_accepts<Schedule, model::split_backward_stage<Stage, T, context_type<T>>>());
    static_assert(optimizer_hook<Optimizer, Stage>,
                  "train::system::run: the optimizer hook must be callable as "
                  "`optimizer(stage.parameters(), stage.gradients())`");
    static_assert((model::check_encoder_stage<std::remove_pointer_t<decltype(encoders.stage)>, T,
                                              encoder_context_type<T>>() &&
                   ...));
    using clock = std::chrono::steady_clock;
    auto& world = *world_;
    run::assert_plan_agreement(world, mem_, plan, "train step plan");
    if (plan.world != pool_size_ || plan.pp != pipeline_.pp)
      throw_error<invalid_argument>(
          "train::system::run: a plan for pp = {} x {} ranks on a world of pp = {} x {}; expected the "
          "system's plan",
          plan.pp, plan.world, pipeline_.pp, pool_size_);
    const int pool_rank = world.rank() % pool_size_;
    const int pipe_rank = world.rank() / pool_size_;
    Comm& pool = pool_ ? *pool_ : world;
    const auto& sched = plan.pipeline;
    const int S = sched.num_stages;
    const int E = sched.num_encoder_shards();

    const auto built = detail::build_rank_micro_batches(plan, batch, s, pool_rank);
    std::vector<const model::micro_batch*> by_slot(static_cast<std::size_t>(std::max(plan.slots, 1)),
                                                   nullptr);
    const auto& mine = plan.per_rank[static_cast<std::size_t>(pool_rank)];
    for (std::size_t i = 0; i < built.size(); ++i)
      by_slot[static_cast<std::size_t>(mine[i].slot)] = &built[i];
    std::vector<const planned_micro_batch*> planned(by_slot.size(), nullptr);
    for (const auto& pm : mine) planned[static_cast<std::size_t>(pm.slot)] = &pm;
    for (std::size_t i = 0; i < built.size(); ++i)
      check_ring_order(plan.rings[static_cast<std::size_t>(mine[i].ring)], mine[i].position, built[i].view());
    detail::check_landings(plan, by_slot, pool_rank);

    // Ulysses: per slot, the document and position of every token of the group's stream, in rank order.
    std::vector<std::vector<std::int64_t>> stream_doc(by_slot.size()), stream_pos(by_slot.size());
    if (plan.kind == partition_kind::ulysses) {
      const int d = plan.cp, first = pool_rank / d * d;
      for (int member = first; member < first + d; ++member)
        for (const auto& mb : detail::build_rank_micro_batches(plan, batch, s, member)) {
          const auto m = static_cast<std::size_t>(mb.index);
          stream_doc[m].insert(stream_doc[m].end(), mb.doc_ids.begin(), mb.doc_ids.end());
          stream_pos[m].insert(stream_pos[m].end(), mb.positions.begin(), mb.positions.end());
        }
    }

    auto zero = [&](auto&& spans) {
      for (auto g : spans) mem_.fill(std::span<T>(g), T(0));
    };
    zero(stage.gradients());
    (zero(encoders.stage->gradients()), ...);

    // The encoder domain's plan (long-short SP over every pipeline's shards), this rank's part of it and the
    // reshard to stage 0's order.
    constexpr int num_encoders = static_cast<int>(sizeof...(Encoders));
    const auto domain = plan_encoder_domain(plan, E, num_encoders, options_.encoder_sp);
    std::vector<std::int64_t> widths(static_cast<std::size_t>(num_encoders), 0);
    for (const auto& slot : plan.encoder_landings)  // each encoder's output elements per token
      for (const auto& l : slot)
        if (auto& w = widths[static_cast<std::size_t>(l.encoder)]; w == 0) {
          const model::encoder_batch probe{
              l.encoder, 0, 0, {{l.item, l.item_tokens, {0, l.item_tokens}, 0, 1, 0}}, l.item_tokens};
          w = detail::row_width(l.encoder, probe, encoders...);
        }
    std::vector<char> runs_shard(static_cast<std::size_t>(E), 0);
    for (int e = 0; e < E; ++e)
      runs_shard[static_cast<std::size_t>(e)] =
          sched.encoder_shard_to_rank[static_cast<std::size_t>(e)] == pipe_rank;
    const auto enc = detail::plan_encoder_work(plan, domain, E, pool_rank, widths, runs_shard);
    const auto& enc_sizes = enc.sizes;
    const auto& reshard = enc.reshard;
    const auto& landing_size = enc.landing_size;
    if (!item_groups_) item_groups_.emplace(pool);
    // Stage 0's input in landing order from the shards' concatenation, and the way back for gradients.
    // (Through the memory policy: one copy or add per run of rows, in run order, on any memory.)
    auto gather_landings = [&](int mb, std::span<const T> in) {
      buffer<T> out;
      out.resize(static_cast<std::size_t>(landing_size[static_cast<std::size_t>(mb)]));
      mem_.fill(out.span(), T(0));
      for (const auto& r : reshard[static_cast<std::size_t>(mb)])
        mem_.copy(out.span().subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)),
                  in.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)));
      return out;
    };
    auto scatter_landings = [&](int mb, std::span<const T> g, std::span<T> gin) {
      mem_.fill(gin, T(0));
      for (const auto& r : reshard[static_cast<std::size_t>(mb)])
        mem_.add(gin.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)),
                 g.subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)));
    };

    step_stats st;
    st.plan_hash = plan.hash();
    double sums[2] = {0.0, 0.0};         // loss, weights
    std::int64_t counts[3] = {0, 0, 0};  // tokens, micro-batches, encoder items
    step_store<T, Memory> store{
        model::memory_activation_store<T, Memory>(mem_)};  // the plan's offload ratios
                                                           // (HDP selective offload)
    if (plan.kind == partition_kind::hdp)
      for (const auto& pm : mine) {
        const double r =
            plan.hdp.per_rank[static_cast<std::size_t>(pool_rank)][static_cast<std::size_t>(pm.source)]
                .offload_ratio;
        if (r > 0)
          for (int stg = 0; stg < S; ++stg) store.set_ratio(stg, pm.slot, r);
      }
    auto enc_stores = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::array<model::memory_activation_store<T, Memory>, sizeof...(I)>{
          ((void)I, model::memory_activation_store<T, Memory>(mem_))...};
    }
    (std::make_index_sequence<sizeof...(Encoders) + 1>{});
    const model::micro_batch empty_mb{};

    auto view_of = [&](int mb) {
      return (by_slot[static_cast<std::size_t>(mb)] ? *by_slot[static_cast<std::size_t>(mb)] : empty_mb)
          .view();
    };
    auto out_size = [&](int stg, const model::micro_batch_view& v) -> std::int64_t {
      if (v.size() == 0) return 0;
      if constexpr (detail::sizes_stage_output<Stage, T>)
        return static_cast<std::int64_t>(stage.output_size(v, stg));
      else
        return static_cast<std::int64_t>(stage.output_size(v));
    };
    auto context = [&](int stg, int mb) {
      context_type<T> ctx;
      ctx.activations = &store;
      ctx.stage = stg;
      ctx.micro_batch = mb;
      ctx.kernel = &kernel_;
      ctx.options = options_.attention;
      ctx.memory = &mem_;
      if (const auto* pm = planned[static_cast<std::size_t>(mb)]) {
        const auto& ring = plan.rings[static_cast<std::size_t>(pm->ring)];
        ctx.ring = {&pool, std::span<const int>(ring.ring), pm->position};
        ctx.schedule = &ring;
        if (plan.kind == partition_kind::ulysses) {
          ctx.ulysses = &plan.ulysses[static_cast<std::size_t>(pm->source)];
          ctx.group = &*group_;
          ctx.stream_doc = stream_doc[static_cast<std::size_t>(mb)];
          ctx.stream_pos = stream_pos[static_cast<std::size_t>(mb)];
        }
      }
      return ctx;
    };

    double cpu = 0.0;  // thread CPU seconds in the user's stages and encoders
    const double cpu0 = thread_cpu_seconds();
    struct cpu_scope {  // adds one call's CPU time to the total and records it as an action
      double& total;
      std::vector<pipeline::timed_action>& log;
      pipeline::action what;
      double origin;
      double start = thread_cpu_seconds();
      ~cpu_scope() {
        const double end = thread_cpu_seconds();
        total += end - start;
        log.push_back({0, what, start - origin, end - origin});
      }
    };
    auto forward = [&](int stg, int mb, std::span<const T> in, std::span<T> out) {
      const auto v = view_of(mb);
      if (v.size() == 0) return;
      cpu_scope timed{cpu, st.cpu_actions, {stg, pipeline::action_type::forward, mb}, cpu0};
      auto ctx = context(stg, mb);
      buffer<T> landed;  // stage 0 with encoders: the shards' outputs resharded to landing order
      if (stg == 0 && E > 0) {
        landed = gather_landings(mb, in);
        in = std::as_const(landed).span();
      }
      if (stg + 1 < S) {
        stage.forward(ctx, v, in, out);
        return;
      }
      buffer<T> loss;
      loss.resize(static_cast<std::size_t>(out_size(stg, v)));
      stage.forward(ctx, v, in, loss.span());
      for (auto x : host_copy(std::span<const T>(loss.span()))) sums[0] += static_cast<double>(x);
      for (auto w : v.loss_weights) sums[1] += w;
      for (auto si : v.stream_index) counts[0] += si >= 0 ? 1 : 0;
      ++counts[1];
    };
    auto backward = [&](int stg, int mb, std::span<const T> gout, std::span<T> gin) {
      const auto v = view_of(mb);
      if (v.size() == 0) return;
      cpu_scope timed{cpu, st.cpu_actions, {stg, pipeline::action_type::backward, mb}, cpu0};
      auto ctx = context(stg, mb);
      if (stg == 0 && E > 0) {  // the landing rows' gradients, back to the shards' layout
        buffer<T> g;
        g.resize(static_cast<std::size_t>(landing_size[static_cast<std::size_t>(mb)]));
        stage.backward(ctx, v, gout, g.span());
        scatter_landings(mb, std::as_const(g).span(), gin);
        return;
      }
      stage.backward(ctx, v, gout, gin);
    };
    constexpr bool split = model::split_backward_stage<Stage, T, context_type<T>>;
    auto backward_input = [&] {
      if constexpr (split) {
        return [&](int stg, int mb, std::span<const T> gout, std::span<T> gin) {
          const auto v = view_of(mb);
          if (v.size() == 0) return;
          cpu_scope timed{cpu, st.cpu_actions, {stg, pipeline::action_type::backward_input, mb}, cpu0};
          auto ctx = context(stg, mb);
          if (stg == 0 && E > 0) {
            buffer<T> g;
            g.resize(static_cast<std::size_t>(landing_size[static_cast<std::size_t>(mb)]));
            stage.backward_input(ctx, v, gout, g.span());
            scatter_landings(mb, std::as_const(g).span(), gin);
            return;
          }
          stage.backward_input(ctx, v, gout, gin);
        };
      } else {
        return run::no_call{};
      }
    }();
    auto backward_weight = [&] {
      if constexpr (split) {
        return [&](int stg, int mb) {
          const auto v = view_of(mb);
          if (v.size() == 0) return;
          cpu_scope timed{cpu, st.cpu_actions, {stg, pipeline::action_type::backward_weight, mb}, cpu0};
          auto ctx = context(stg, mb);
          stage.backward_weight(ctx, v);
        };
      } else {
        return run::no_call{};
      }
    }();
    auto encoder_ctx = [&](int e, int mb) {  // the encoders' contexts at shard e, slot mb
      return detail::encoder_context_maker<Comm, Kernel, T, decltype(enc_stores), Memory>{
          &enc_stores, &*item_groups_, &kernel_, e, mb, e * pool_size_, &mem_};
    };
    // The slot's exchange over the shard's pool row: `send` by destination, `recv` by source.
    auto exchange = [&](std::span<const T> send, std::span<const std::int64_t> send_counts, std::span<T> recv,
                        std::span<const std::int64_t> recv_counts) {
      const double c0 = thread_cpu_seconds();
      auto displs = [](std::span<const std::int64_t> counts) {
        std::vector<std::int64_t> d(counts.size(), 0);
        for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
        return d;
      };
      const auto sd = displs(send_counts), rd = displs(recv_counts);
      comm::all_to_all_v(pool, send, send_counts, std::span<const std::int64_t>(sd), recv, recv_counts,
                         std::span<const std::int64_t>(rd));
      st.cpu_comm_seconds += thread_cpu_seconds() - c0;
    };
    auto encoder_forward = [&](int e, int mb, std::span<T> out) {
      const auto m = static_cast<std::size_t>(mb);
      if (!enc.active[m]) return;
      const auto& ex = enc.exchange[static_cast<std::size_t>(e)][m];
      buffer<T> local, send;
      local.resize(static_cast<std::size_t>(ex.local_size));
      if (local.size() != 0) {
        mem_.fill(local.span(), T(0));
        cpu_scope timed{cpu, st.cpu_actions, {e, pipeline::action_type::encoder_forward, mb}, cpu0};
        detail::encode<T, Memory>(enc.work[static_cast<std::size_t>(e)][m], local.span(), e, mb,
                                  encoder_ctx(e, mb), counts[2], encoders...);
      }
      send.resize(static_cast<std::size_t>(ex.send_size()));
      ex.pack_into(mem_, std::span<const T>(local.span()), send.span());
      exchange(std::span<const T>(send.span()), ex.send_counts, out, ex.recv_counts);
    };
    auto encoder_backward = [&](int e, int mb, std::span<const T> g) {
      const auto m = static_cast<std::size_t>(mb);
      if (!enc.active[m]) return;
      const auto& ex = enc.exchange[static_cast<std::size_t>(e)][m];
      buffer<T> back, local;  // back: in the send buffer's layout
      back.resize(static_cast<std::size_t>(ex.send_size()));
      exchange(g, ex.recv_counts, back.span(), ex.send_counts);
      if (ex.local_size == 0) return;
      local.resize(static_cast<std::size_t>(ex.local_size));
      mem_.fill(local.span(), T(0));
      ex.unpack_add(mem_, std::span<const T>(back.span()), local.span());
      cpu_scope timed{cpu, st.cpu_actions, {e, pipeline::action_type::encoder_backward, mb}, cpu0};
      detail::encode_backward<T>(enc.work[static_cast<std::size_t>(e)][m], std::span<const T>(local.span()),
                                 encoder_ctx(e, mb), encoders...);
    };
    auto output_sizes = [&](int stg, int mb) { return out_size(stg, view_of(mb)); };
    auto encoder_sizes = [&](int e, int mb) {
      return enc_sizes[static_cast<std::size_t>(e)][static_cast<std::size_t>(mb)];
    };
    run::stage_calls<T, decltype(forward), decltype(backward), decltype(backward_input),
                     decltype(backward_weight), decltype(encoder_forward), decltype(encoder_backward)>
        fn{forward, backward, backward_input, backward_weight, encoder_forward, encoder_backward};
    const run::sizes_of<decltype(output_sizes), decltype(encoder_sizes)> sizes{output_sizes, encoder_sizes};

    const double barrier_cpu0 = thread_cpu_seconds();
    comm::barrier(world);  // the ranks' timelines share an origin, up to the barrier's skew
    st.cpu_comm_seconds += thread_cpu_seconds() - barrier_cpu0;
    const auto t0 = clock::now();
    run::execute_pipeline(*pipe_, sched, fn, sizes, mem_, &st.timeline, &st.cpu_comm_seconds);
    const auto t1 = clock::now();
    st.step_seconds = std::chrono::duration<double>(t1 - t0).count();
    for (auto& ta : st.cpu_actions) ta.rank = world.rank();
    for (auto& ta : st.timeline) {
      ta.rank = world.rank();
      const double d = ta.end - ta.start;
      using pipeline::action_type;
      if (ta.what.type == action_type::forward || ta.what.type == action_type::encoder_forward)
        st.forward_seconds += d;
      else if (pipeline::is_compute(ta.what.type))
        st.backward_seconds += d;
    }
    st.busy_seconds = st.forward_seconds + st.backward_seconds;
    st.cpu_busy_seconds = cpu;
    st.activation_peak_bytes = store.peak_bytes();
    st.offloaded_bytes = store.offloaded_bytes();
    if (const auto left = store.slots() + detail::slots_left(enc_stores); left != 0)
      throw_error<invalid_argument>(
          "train::system::run: the stages left {} activation slots after the step; expected every backward "
          "to release what its forward saved",
          left);

    const auto t2 = clock::now();
    const double reduce_cpu0 = thread_cpu_seconds();
    for (auto g : stage.gradients()) reduce_sum(pool, std::span<T>(g));
    [[maybe_unused]] auto reduce_world = [&](auto&& spans) {
      for (auto g : spans) reduce_sum(world, std::span<T>(g));
    };
    (reduce_world(encoders.stage->gradients()), ...);
    reduce_host_values(world, std::span<double>(sums));
    reduce_host_values(world, std::span<std::int64_t>(counts));
    st.reduce_seconds = std::chrono::duration<double>(clock::now() - t2).count();
    st.cpu_comm_seconds += thread_cpu_seconds() - reduce_cpu0;
    st.loss = sums[0];
    st.targets = static_cast<std::int64_t>(sums[1] + 0.5);
    st.tokens = counts[0];
    st.micro_batches = counts[1];
    st.encoder_items = counts[2];
    const double optimizer_cpu0 = thread_cpu_seconds();
    optimizer(stage.parameters(), stage.gradients());
    (optimizer(encoders.stage->parameters(), encoders.stage->gradients()), ...);
    const double run_cpu1 = thread_cpu_seconds();
    st.cpu_optimizer_seconds = run_cpu1 - optimizer_cpu0;
    st.cpu_step_seconds = run_cpu1 - run_cpu0;
    return st;
  }

 public:
  /// Ranks of a separate encoder pool per pipeline (pipeline::encoder_pool: its `ranks`; 0 for the other
  /// placements). They follow the pipeline's pp LLM ranks: world rank r is pipeline rank r / pool_size(),
  /// and pipeline ranks pp .. pp + encoder_ranks() - 1 run only encoder work.
  [[nodiscard]] int encoder_ranks() const noexcept {
    if constexpr (std::same_as<Placement, pipeline::encoder_pool>)
      return pipeline_.encoders.ranks >= 1 ? pipeline_.encoders.ranks : -1;
    else
      return 0;
  }
  /// True when this rank belongs to the separate encoder pool (it runs no LLM stage).
  [[nodiscard]] bool is_encoder_rank() const noexcept { return pipeline_rank() >= pipeline_.pp; }

  /// The global pipeline stages this rank runs under `plan`, ascending (its pipeline rank's stages).
  [[nodiscard]] std::vector<int> local_stages(const step_plan& plan) const {
    std::vector<int> out;
    const int me = world_->rank() / pool_size_;
    for (int st = 0; st < plan.pipeline.num_stages; ++st)
      if (plan.pipeline.rank_of_stage(st) == me) out.push_back(st);
    return out;
  }
  /// The partition family's parameters.
  [[nodiscard]] const Partition& partition() const noexcept { return partition_; }
  /// The balancer's parameters.
  [[nodiscard]] const Balancer& balancer() const noexcept { return balancer_; }
  /// The pipeline configuration.
  [[nodiscard]] const pipeline_type& pipeline() const noexcept { return pipeline_; }
  /// The world's communicator.
  [[nodiscard]] Comm& world() const noexcept { return *world_; }
  /// Ranks per pipeline rank (the data-parallel pool: dp x cp, or the HDP pool).
  [[nodiscard]] int pool_size() const noexcept { return pool_size_; }
  /// This rank's position in its pool (its pipeline: every pipeline rank of it has the same).
  [[nodiscard]] int pool_rank() const noexcept { return world_->rank() % pool_size_; }
  /// This rank's pipeline rank.
  [[nodiscard]] int pipeline_rank() const noexcept { return world_->rank() / pool_size_; }
  /// The run-time options.
  [[nodiscard]] const system_options& options() const noexcept { return options_; }
  /// The memory policy the system's buffers and buffer work go through. A policy constructible from the
  /// world's stream starts on it (cuda::device_memory(world.stream()), fixed at construction: call
  /// world.set_stream(s) first, so that the pipeline's and pool's communicators, split from the world,
  /// enqueue on `s` too); assign another before the first run to change it.
  [[nodiscard]] Memory& memory() noexcept { return mem_; }
  /// Where the system's ranks sit in its world, for train::plan_delivery: system_ranks(pool_size(), pp +
  /// encoder_ranks()) (world rank = pipeline rank x pool + pool rank).
  [[nodiscard]] rank_map ranks() const { return system_ranks(pool_size_, pipeline_.pp + encoder_ranks()); }
  /// The delivery plan of `plan` over this system's world: train::plan_delivery(plan, batch, ranks(),
  /// options().encoder_sp), `batch` the step the plan was made from (only its metadata is read). Pure; not
  /// collective. Errors: plan_delivery's.
  [[nodiscard]] data::route_plan delivery(const step_plan& plan, const model::step_batch& batch) const {
    return plan_delivery(plan, batch, ranks(), options_.encoder_sp);
  }

 private:
  template <class U>
  using buffer = typename Memory::template buffer<U>;

  template <class U>
  void reduce_sum(Comm& c, std::span<U> x) const {
    sum_over_ranks(c, mem_, x, options_.reproducible);
  }
  template <class U>
  void reduce_host_values(Comm& c, std::span<U> x) const {
    sum_host_values_over_ranks(c, mem_, x, options_.reproducible);
  }
  template <class U>
  auto host_copy(std::span<const U> x) const {
    return readable_on_host(mem_, x);
  }

  step_plan plan_impl(std::span<const seq::seq_desc> docs, const model::step_batch* batch) const {
    return plan_system_step(partition_, balancer_, pipeline_, options_.cost, pool_size_, docs, batch);
  }

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
          "position {} in order; expected the plan's micro-batches",
          v.index, n, meta.pos.size(), position);
  }

  Partition partition_;
  Balancer balancer_{};
  pipeline_type pipeline_{};
  Comm* world_;
  Kernel kernel_;
  system_options options_;
  Memory mem_{};
  int pool_size_ = 1;
  std::optional<Comm> pool_;   // pp > 1: the ranks of this pipeline rank (ring attention, stage gradients)
  std::optional<Comm> pipe_;   // this pipeline's ranks in pipeline order (the schedule's transfers)
  std::optional<Comm> group_;  // Ulysses: this rank's group of the pool, in stream order
  std::optional<comm::group_cache<Comm>> item_groups_;  // encoder items' Ulysses groups in the pool row
};

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::step_stats> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_stats& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "step{{loss={:.6g}, targets={}, tokens={}, micro_batches={}, encoder_items={}, "
                              "plan={:#018x}, forward={:.3g}s, backward={:.3g}s, busy={:.3g}s, step={:.3g}s, "
                              "reduce={:.3g}s}}",
                              s.loss, s.targets, s.tokens, s.micro_batches, s.encoder_items, s.plan_hash,
                              s.forward_seconds, s.backward_seconds, s.busy_seconds, s.step_seconds,
                              s.reduce_seconds);
  }
};
template <class Schedule, class Placement>
struct fmt::formatter<hetmesh::train::pipeline_config<Schedule, Placement>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::pipeline_config<Schedule, Placement>& c, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "pipeline{{pp={}, schedule={}, encoders={}}}", c.pp, c.schedule,
                              c.encoders);
  }
};
