// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: train::system, the training system over policy types: a partition family (a
// train::partition_family: seq::cp_zigzag, seq::cp_thd, seq::ulysses, seq::hdp<Offload>, or a user's), the
// user's attention kernel, a communicator over the world, a balancer (whatever the family consults:
// train::family_placement, balance::bytescale, balance::gap_filling_hdp, or a user's), a pipeline schedule
// family, an encoder placement (a pipeline::encoder_placement) and a memory policy. `plan` is pure (the
// family's plan_partition, then train::attach_pipeline): everything `run` reads is in the typed plan, and
// its hash covers all of it. `run` has three parts, each in its own header: this rank's view of the plan
// (train/step_run.hpp: micro-batches built once from the plan's token layouts, checked against its rings
// and landings), the stage runner the pipeline executor calls (train/stage_runner.hpp: the user's stages
// and encoders, the encoder landing), and the reduction and optimizer step (train/reduction.hpp): gradients
// summed over the pool (the encoders' over the world: each item is encoded once in the world, over the
// encoder mesh's rows, train/encoder_domain.hpp), each rank's loss already normalised by the step's
// global target count, so a single-rank run of the same batch gives the same gradient. `run` takes the
// whole step's batch, or this rank's share of it under delivery by plan (train/delivery.hpp, build.hpp).
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
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
#include "../seq/long_short.hpp"
#include "build.hpp"
#include "context.hpp"
#include "delivery.hpp"
#include "encoder_context.hpp"
#include "encoder_domain.hpp"
#include "encoders.hpp"
#include "families.hpp"
#include "optimizer.hpp"
#include "partition_family.hpp"
#include "pipeline_plan.hpp"
#include "reduction.hpp"
#include "sequence_split.hpp"
#include "stage_runner.hpp"
#include "step_plan.hpp"
#include "step_run.hpp"
#include "step_stats.hpp"
#include "system_comms.hpp"
#include "system_config.hpp"
#include "system_mesh.hpp"
#include "zero.hpp"

namespace hetmesh::train {

/// The training system. Partition: a train::partition_family placed by Balancer (the library's:
/// seq::cp_zigzag, seq::cp_thd, seq::ulysses with train::family_placement; seq::hdp<Offload> with
/// family_placement, balance::bytescale or balance::gap_filling_hdp; or a user's family and balancer, see
/// train/partition_family.hpp); Kernel: the user's model::attention_kernel; Comm: a comm::communicator over
/// the world ((pp + encoder-pool ranks) x pool ranks; pipeline rank slowest), which must split (comm::split);
/// Schedule: a pipeline::schedule_family (a family with split backward requires
/// model::split_backward_stage, checked at compile time); Placement: a pipeline::encoder_placement
/// (encoder_on_first_stage, colocated_encoder: the joint pipeline, encoder_pool, or a user's); Memory: the
/// model::memory_policy of activations, gradients and the runtime's buffers. E.g.
/// `system<seq::cp_zigzag, K, C>`, `system<seq::hdp<seq::selective_offload>, K, C, balance::bytescale,
/// pipeline::zero_bubble, pipeline::colocated_encoder>`. One object per rank; constructing it is collective
/// over the world (it splits the pipeline's communicators); the communicator and kernel outlive it.
template <class Partition, class Kernel, comm::communicator Comm, class Balancer = family_placement,
          pipeline::schedule_family Schedule = pipeline::one_f_one_b,
          class Placement = pipeline::encoder_on_first_stage, class Memory = default_memory_t<Comm>>
class system {
  static_assert(check_trainable<Partition, Balancer>());
  static_assert(pipeline::encoder_placement<Placement>,
                "train::system: Placement must be a pipeline::encoder_placement (pipeline/joint.hpp)");
  static_assert(model::memory_policy<Memory>,
                "train::system over a device communicator: name its memory policy as the last template "
                "argument (a model::memory_policy of memory_space::device: cuda::device_memory on the "
                "communicator's stream for NCCL)");
  static_assert(
      !model::memory_policy<Memory> || Memory::space == Comm::memory,
      "train::system: the memory policy's space must be the communicator's (model::host_memory for a "
      "host communicator, a device memory policy for a device communicator)");

 public:
  /// The plan `plan` returns: step_plan<Part> of the family's typed part.
  using plan_type = step_plan_t<Partition, Balancer>;
  /// The family's typed plan part.
  using part_type = typename plan_type::part_type;
  /// The memory policy of activations, gradients and the runtime's buffers.
  using memory_type = Memory;
  /// The context the backbone stage receives for element type T.
  template <class T>
  using context_type = step_context<Comm, Kernel, T, Memory, typename part_type::attention>;
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
  /// pipeline's communicators). Errors: pp < 1 or pp + encoder-pool ranks not dividing the world size, an
  /// encoder pool of no rank (invalid_argument).
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
          "train::system: an encoder placement of {} encoder-only ranks per pipeline ({}); expected ranks >= "
          "1",
          enc, pipeline_.encoders);
    if (pp < 1 || world.size() % (pp + enc) != 0)
      throw_error<invalid_argument>(
          "train::system: pipeline depth pp = {}{} over a world of {} ranks; expected pp >= 1 and pp + "
          "encoder-pool ranks dividing the world (pool = world / (pp + encoder ranks) ranks per pipeline "
          "rank)",
          pp, enc > 0 ? hetmesh::format(" with {} encoder-pool ranks per pipeline", enc) : std::string(),
          world.size());
    // Every group comes from the mesh by name (train/system_mesh.hpp): Megatron's groups for its order.
    layout_.emplace(options_.mesh, world.size(), pp + enc, enc);
    groups_ = layout_->groups_of(world.rank());
    pool_size_ = layout_->pool();
    // A device policy on the communicator's stream by default (e.g. cuda::device_memory(world.stream())):
    // the runtime's copies then run in order with the collectives and the stages' kernels.
    if constexpr (requires { Memory(world.stream()); }) mem_ = Memory(world.stream());
    static_assert(
        requires { comm::split(world, 0, 0); },
        "train::system: Comm must split (comm::split: a backend split or subgroup) for the pipeline's "
        "communicators");
    // The pipeline's communicator (its pp LLM ranks, then its encoder-pool ranks), the pool at this pipeline
    // rank when the world has more than one, and the tp and ep families (train/system_comms.hpp).
    comms_.emplace(world, *layout_, groups_, pp + enc);
  }

  /// The step plan for documents `docs` (id, length in stream order) over the pool, with the pipeline
  /// (no encoders). Pure: equal on every rank for equal inputs; not collective. Errors: the family's and
  /// attach_pipeline's (invalid_argument).
  [[nodiscard]] plan_type plan(std::span<const seq::seq_desc> docs) const { return plan_impl(docs, nullptr); }
  /// The step plan of `batch`: plan(document_descs(batch)), with the batch's encoder items placed in the
  /// pipeline by the Placement policy and the encoder domain planned under options().encoder_sp.
  [[nodiscard]] plan_type plan(const model::step_batch& batch) const {
    return plan_impl(model::document_descs(batch), &batch);
  }
  /// plan(batch) with the model's encoders (their stages or bindings, in encoder-index order): each one's
  /// attention_heads() sizes the groups its long items may split over (model::encoder_stage requirement 8).
  template <class... Encoders>
  requires(sizeof...(Encoders) > 0) [[nodiscard]] plan_type
      plan(const model::step_batch& batch, const Encoders&... encoders) const {
    const std::vector<int> heads{encoder_heads_of(encoders)...};
    return plan_impl(model::document_descs(batch), &batch, heads);
  }

  /// Runs one step of `plan` over `batch` with the user's backbone stage (this rank's stages: the stages
  /// local_stages() names, told apart by ctx.stage), optimizer hook and encoders (bind_encoder; the e-th
  /// serves items of encoder index e); collective over the world. In order: checks (collective assertion
  /// level) that every rank holds the same plan; zeroes gradients; builds this pool rank's micro-batches
  /// from the plan's token layouts (one per slot; a slot this pool rank has none in runs empty, without
  /// calling the stage); runs the plan's schedule: encoder forward (shard e in slot m encodes its part of the
  /// plan's encoder domain, exchanges rows over its pool row and sends its pipeline's landing rows to stage
  /// 0), stage forward (stage 0's input: the landings' rows in view.encoder_outputs order; the last stage's
  /// output: its per-token loss terms, one per token of the view, which it scales by the loss weights over
  /// step_targets), backward (or I then W under split-backward schedules), encoder backward; all-reduces
  /// (sum) the stage's gradients over its pool and the encoders' over the world, and the stats; calls
  /// `optimizer(stage.parameters(), stage.gradients())`, then the same for each encoder. Output sizes come
  /// from `stage.output_size(view, stage_index)` when the stage has it, else `stage.output_size(view)`.
  /// Post: the gradients equal those of a single-rank run of the same batch (up to rounding). Errors: plan
  /// disagreement (mismatch_error), a plan for another world or batch, a micro-batch whose tokens are not in
  /// its ring's order, an item of an encoder not passed, a last stage whose output is not one term per
  /// token, a stage that leaves activation slots behind, encoder items the plan does not know
  /// (invalid_argument); ring attention's, the executor's and the stages' errors, with the action as
  /// context. Deterministic for deterministic stages and kernel.
  template <class Stage, class Optimizer, class... Encoders>
  step_stats run(const plan_type& plan, const model::step_batch& batch, Stage& stage, Optimizer&& optimizer,
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
  step_stats run(const plan_type& plan, const rank_share& share, Stage& stage, Optimizer&& optimizer,
                 Encoders... encoders) {
    const double cpu0 = thread_cpu_seconds();
    std::pair<model::step_batch, model::step_summary> local;
    std::exception_ptr failure;
    try {
      if (plan.world != pool_size_)  // before indexing the plan by this rank
        throw_error<invalid_argument>("train::system::run: a plan for a pool of {} ranks; expected {}",
                                      plan.world, pool_size_);
      local = detail::sparse_step(plan, share, pool_rank());
    } catch (...) {
      failure = std::current_exception();
    }
    run::agree_on_failure(*world_, mem_, failure, "train::system::run (its share)");
    return run_step(cpu0, plan, local.first, local.second, stage, std::forward<Optimizer>(optimizer),
                    std::move(encoders)...);
  }

  /// Ranks of a separate encoder pool per pipeline (the placement's encoder_ranks(): pipeline::encoder_pool's
  /// `ranks`, 0 for placements on the LLM ranks). They follow the pipeline's pp LLM ranks: world rank r is
  /// pipeline rank r / pool_size(), and pipeline ranks pp .. pp + encoder_ranks() - 1 run only encoder work.
  [[nodiscard]] int encoder_ranks() const noexcept { return pipeline_.encoders.encoder_ranks(); }
  /// True when this rank belongs to the separate encoder pool (it runs no LLM stage).
  [[nodiscard]] bool is_encoder_rank() const noexcept { return pipeline_rank() >= pipeline_.pp; }

  /// The global pipeline stages this rank runs, before any plan (stages_by_rank: the schedule family's
  /// layout at pp, every plan's), so the model can be built first; empty on an encoder-pool rank.
  [[nodiscard]] std::vector<int> local_stages() const {
    auto by_rank = stages_by_rank(pipeline_.schedule, pipeline_.pp);
    const auto me = static_cast<std::size_t>(pipeline_rank());
    return me < by_rank.size() ? std::move(by_rank[me]) : std::vector<int>{};
  }
  /// The pipeline's stage count, before any plan (stages_by_rank's; every plan's schedule has it).
  [[nodiscard]] int num_stages() const {
    int n = 0;
    for (const auto& r : stages_by_rank(pipeline_.schedule, pipeline_.pp)) n += static_cast<int>(r.size());
    return n;
  }
  /// The global pipeline stages this rank runs under `plan`, ascending (its pipeline rank's stages).
  [[nodiscard]] std::vector<int> local_stages(const step_layout& plan) const {
    std::vector<int> out;
    const int me = pipeline_rank();
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
  [[nodiscard]] int pool_rank() const noexcept { return groups_.pool.position; }
  /// This rank's pipeline rank.
  [[nodiscard]] int pipeline_rank() const noexcept { return groups_.pipe.position; }
  /// This rank's tensor-parallel rank (its place in ctx.tp's group).
  [[nodiscard]] int tp_rank() const noexcept { return groups_.tp.position; }
  /// Tensor-parallel ranks (system_options::mesh.tp).
  [[nodiscard]] int tp_size() const noexcept { return layout_->tp(); }
  /// This rank's expert-parallel rank (its place in ctx.ep's group).
  [[nodiscard]] int ep_rank() const noexcept { return groups_.ep.position; }
  /// Expert-parallel ranks (system_options::mesh.ep).
  [[nodiscard]] int ep_size() const noexcept { return layout_->ep(); }
  /// The mesh and every group family the system derived from it (Megatron's groups for its order).
  [[nodiscard]] const system_layout& layout() const noexcept { return *layout_; }
  /// This rank's groups (world ranks of its tp, pool, pipeline, slice and ep groups).
  [[nodiscard]] const system_groups& groups() const noexcept { return groups_; }
  /// What this rank's model holds: the pipeline's stages, this rank's stages, and its tp and ep places,
  /// before any plan (the model can be built first; train::check_parity hands it to a factory that takes it).
  [[nodiscard]] model_split split() const {
    return {num_stages(), local_stages(), tp_rank(), tp_size(), ep_rank(), ep_size()};
  }
  /// The run-time options.
  [[nodiscard]] const system_options& options() const noexcept { return options_; }
  /// The memory policy the system's buffers and buffer work go through. A policy constructible from the
  /// world's stream starts on it (cuda::device_memory(world.stream()), fixed at construction: call
  /// world.set_stream(s) first, so that the pipeline's and pool's communicators, split from the world,
  /// enqueue on `s` too); assign another before the first run to change it.
  [[nodiscard]] Memory& memory() noexcept { return mem_; }
  /// Where the system's ranks sit in its world, for train::plan_delivery: system_ranks(pool_size(), pp +
  /// encoder_ranks()) (world rank = pipeline rank x pool + pool rank).
  [[nodiscard]] rank_map ranks() const { return layout_->ranks(); }
  /// The delivery plan of `plan` over this system's world: train::plan_delivery(plan, batch, ranks()),
  /// `batch` the step the plan was made from (only its metadata is read). Pure; not collective. Errors:
  /// plan_delivery's.
  [[nodiscard]] data::route_plan delivery(const step_layout& plan, const model::step_batch& batch) const {
    return plan_delivery(plan, batch, ranks());
  }

 private:
  template <class Stage, class Optimizer, class... Encoders, class T = stage_value_t<Stage>>
  step_stats run_step(double run_cpu0, const plan_type& plan, const model::step_batch& batch,
                      const model::step_summary& s, Stage& stage, Optimizer&& optimizer,
                      Encoders... encoders) {
    detail::check_run_types<Kernel, Schedule, context_type<T>, encoder_context_type<T>, Stage, Optimizer, T,
                            Encoders...>();
    check_token_mixing<Stage>(partition_, pool_size_);
    check_stage_sizes(
        stage, detail::attention_binding<typename part_type::attention, Comm>::group_size(plan.partition),
        options_.mesh);
    auto& world = *world_;
    run::assert_plan_agreement(world, mem_, plan, "train step plan");
    if (plan.world != pool_size_ || plan.pp != pipeline_.pp)
      throw_error<invalid_argument>(
          "train::system::run: a plan for pp = {} x {} ranks on a world of pp = {} x {}; expected the "
          "system's plan",
          plan.pp, plan.world, pipeline_.pp, pool_size_);
    if (plan.encoders() > static_cast<int>(sizeof...(Encoders)))
      throw_error<invalid_argument>(
          "train::system::run: the plan's encoder items name encoder {}, but {} encoders were passed to run; "
          "expected an encoder (bind_encoder) for every encoder index of the batch",
          plan.encoders() - 1, sizeof...(Encoders));
    int encoder_index = 0;
    (check_encoder_heads(plan, encoder_index++, encoder_heads_of(encoders)), ...);
    const int pool_rank = this->pool_rank();
    const auto rank = detail::make_step_rank(plan, batch, s, pool_rank, group_size(plan));
    std::tuple<Encoders...> bound{std::move(encoders)...};
    const auto enc = detail::encoder_work_for(plan, groups_.row.position, pipeline_rank(), bound);
    auto zero = [&](auto&& spans) {
      for (auto g : spans) mem_.fill(std::span<T>(g), T(0));
    };
    zero(stage.gradients());
    if constexpr (has_expert_parameters<Stage>) zero(stage.expert_gradients());
    std::apply([&](auto&... e) { (zero(e.stage->gradients()), ...); }, bound);

    step_stats st;
    st.plan_hash = plan.hash();
    record_reasons(st, plan);
    using runner_type = detail::stage_runner<Comm, Kernel, T, Memory, part_type>;
    detail::with_stage_entry<runner_type>(stage, bound, [&](const typename runner_type::entry_type& calls) {
      runner_type runner(plan, rank, enc, resources(plan), calls, static_cast<int>(sizeof...(Encoders)), st,
                         pool_rank, thread_cpu_seconds());
      execute(plan, runner, st);
      if (const auto left = runner.slots_left(); left != 0)
        throw_error<invalid_argument>(
            "train::system::run: the stages left {} activation slots after the step; expected every "
            "backward to release what its forward saved",
            left);
      reduce_and_step(st, runner, stage, bound, std::forward<Optimizer>(optimizer));
    });
    st.cpu_step_seconds = thread_cpu_seconds() - run_cpu0;
    return st;
  }

  // The plan's attention groups (its mechanism's group_size: 0 for rings): their communicator is split
  // from the pool on first use, collectively, and again when the size changes.
  int group_size(const plan_type& plan) {
    const int d = detail::attention_binding<typename part_type::attention, Comm>::group_size(plan.partition);
    if (d == 0) return 0;
    if (d < 1 || pool_size_ % d != 0)
      throw_error<invalid_argument>(
          "train::system: attention groups of {} ranks over a pool of {} ranks; expected a group size >= 1 "
          "dividing the pool",
          d, pool_size_);
    if (!group_ || group_degree_ != d) {
      Comm& pool = comms_->pool ? *comms_->pool : *world_;
      group_.emplace(comm::split(pool, pool.rank() / d, pool.rank() % d));
      group_degree_ = d;
    }
    return d;
  }

  detail::step_resources<Comm, Kernel, Memory> resources(const plan_type&) {
    Comm& pool = comms_->pool ? *comms_->pool : *world_;
    Comm& row = comms_->row ? *comms_->row : pool;  // tp = 1: the row is the pool
    if (!item_groups_) item_groups_.emplace(row);
    return {&pool,
            group_ ? &*group_ : nullptr,
            &*item_groups_,
            &kernel_,
            &mem_,
            options_.attention,
            pool_size_,
            comms_->tp ? &*comms_->tp : nullptr,
            comms_->ep ? &*comms_->ep : nullptr,
            &row,
            groups_.row.size()};
  }

  // Runs the plan's schedule on this pipeline with the runner's calls; the step's wall and CPU times.
  template <class Runner>
  void execute(const plan_type& plan, Runner& runner, step_stats& st) {
    detail::execute_step(*world_, *comms_->pipe, plan.pipeline, runner, mem_, st);
  }

  // Sums the stage's gradients over the pool and the encoders' over the world, and the step's counts; then
  // the optimizer hook on the stage and each encoder. A sharded optimizer (train::zero1) takes the place of
  // the gradient sums and the hook: it reduce-scatters each group's gradients over the same ranks, steps
  // its shard and all-gathers the parameters.
  template <class Runner, class Stage, class Bound, class Optimizer>
  void reduce_and_step(step_stats& st, Runner& runner, Stage& stage, Bound& bound, Optimizer&& optimizer) {
    using T = typename Runner::context_type::value_type;
    constexpr bool sharded = sharded_optimizer<Optimizer>;
    Comm& pool = comms_->pool ? *comms_->pool : *world_;
    Comm& slice = comms_->slice ? *comms_->slice : *world_;  // the stats: this tp coordinate's ranks
    const auto t2 = std::chrono::steady_clock::now();
    const double reduce_cpu0 = thread_cpu_seconds();
    // The stage's dense parameters over the pool, its experts' over the ranks holding the same experts,
    // each encoder's over the world (the encoder domain: each item was encoded once in the world).
    auto groups = [&](auto&& f) {
      f(pool, stage.parameters(), stage.gradients());
      if constexpr (has_expert_parameters<Stage>)  // a stage without experts this time has no such group
        if (auto ps = stage.expert_parameters(); !std::ranges::empty(ps))
          f(comms_->edp ? *comms_->edp : pool, ps, stage.expert_gradients());
      std::apply([&](auto&... e) { (f(*world_, e.stage->parameters(), e.stage->gradients()), ...); }, bound);
    };
    if constexpr (!sharded)
      groups([&](Comm& c, auto&&, auto&& grads) {
        for (auto g : grads) sum_over_ranks(c, mem_, std::span<T>(g), options_.reproducible);
      });
    // The loss and token counts over this tp coordinate's ranks (every tp rank runs the same micro-batches),
    // the encoder items over the world (each encoded once in the world).
    sum_host_values_over_ranks(slice, mem_, std::span<double>(runner.sums), options_.reproducible);
    const std::span<std::int64_t> counts(runner.counts);
    sum_host_values_over_ranks(slice, mem_, comms_->slice ? counts.first(2) : counts, options_.reproducible);
    if (comms_->slice) sum_host_values_over_ranks(*world_, mem_, counts.subspan(2), options_.reproducible);
    st.reduce_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
    st.cpu_comm_seconds += thread_cpu_seconds() - reduce_cpu0;
    st.loss = runner.sums[0];
    st.targets = static_cast<std::int64_t>(runner.sums[1] + 0.5);
    st.tokens = runner.counts[0];
    st.micro_batches = runner.counts[1];
    st.encoder_items = runner.counts[2];
    const double optimizer_cpu0 = thread_cpu_seconds();
    if constexpr (sharded)
      groups([&](Comm& c, auto&& ps, auto&& gs) { optimizer.step(c, mem_, ps, gs, options_.reproducible); });
    else
      groups([&](Comm&, auto&& ps, auto&& gs) { optimizer(ps, gs); });
    st.cpu_optimizer_seconds = thread_cpu_seconds() - optimizer_cpu0;
    record_memory<T>(st, stage, bound, optimizer);
  }

  plan_type plan_impl(std::span<const seq::seq_desc> docs, const model::step_batch* batch,
                      std::span<const int> heads = {}) const {
    return plan_system_step(partition_, balancer_, pipeline_, options_.cost, pool_size_, docs, batch,
                            options_.encoder_sp, heads, layout_->tp());
  }

  Partition partition_;
  Balancer balancer_{};
  pipeline_type pipeline_{};
  Comm* world_;
  Kernel kernel_;
  system_options options_;
  Memory mem_{};
  int pool_size_ = 1;
  int group_degree_ = 0;
  std::optional<Comm> group_;  // attention over groups: this rank's group of the pool, in stream order
  std::optional<detail::system_comms<Comm>> comms_;     // the groups' communicators
  std::optional<system_layout> layout_;                 // the mesh and its group families
  system_groups groups_;                                // this rank's groups
  std::optional<comm::group_cache<Comm>> item_groups_;  // encoder items' Ulysses groups in the row
};

}  // namespace hetmesh::train
