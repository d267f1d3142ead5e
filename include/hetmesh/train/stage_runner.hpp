// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the stage runner, what the pipeline executor calls for one rank's step: the user's
// backbone stage forward and backward (I and W under split-backward schedules), the encoders' forward and
// backward with the exchange of rows over the encoder row, and the sizes of every action's output. It owns
// the step's activation stores (selective offload at the plan's ratios) and accumulates the loss, target,
// token, micro-batch and encoder item counts and the CPU time spent in the user's calls. It reaches the
// user's stage and encoders through a stage_entry (function_ref members, one indirect call per action), so
// it is a template over the communicator, kernel, element, memory and plan part only: under
// HETMESH_SEPARATE_COMPILATION the common combinations are compiled once (the end of this file).
#pragma once

#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../config.hpp"
#include "../core/cpu_time.hpp"
#include "../core/function_ref.hpp"
#include "../model/stage.hpp"
#include "../pipeline/action.hpp"
#include "../run/pipeline_executor.hpp"
#include "context.hpp"
#include "encoder_context.hpp"
#include "encoders.hpp"
#include "families.hpp"
#include "reduction.hpp"
#include "step_run.hpp"
#include "step_stats.hpp"

#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/reference_attention.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::train::detail {

/// The user's backbone stage and encoders as a stage_runner calls them, by reference (function_ref: the
/// callables live in train::system::run for the step). Context: the stage's context type; Maker: the
/// encoders' context maker (stage_runner::encoder_maker). backward_input and backward_weight are empty
/// unless the stage splits its backward (model::split_backward_stage).
template <class Context, class T, class Maker>
struct stage_entry {
  /// The stage's forward(ctx, view, in, out).
  function_ref<void(Context&, const model::micro_batch_view&, std::span<const T>, std::span<T>)> forward{};
  /// The stage's backward(ctx, view, grad_out, grad_in).
  function_ref<void(Context&, const model::micro_batch_view&, std::span<const T>, std::span<T>)> backward{};
  /// The stage's backward_input(ctx, view, grad_out, grad_in) (split backward only).
  function_ref<void(Context&, const model::micro_batch_view&, std::span<const T>, std::span<T>)>
      backward_input{};
  /// The stage's backward_weight(ctx, view) (split backward only).
  function_ref<void(Context&, const model::micro_batch_view&)> backward_weight{};
  /// model::stage_output_size(stage, view, stage index).
  function_ref<std::int64_t(const model::micro_batch_view&, int)> output_size{};
  /// train::detail::encode over the encoders: (work, out, shard, slot, maker, items).
  function_ref<void(const shard_work&, std::span<T>, int, int, const Maker&, std::int64_t&)> encode{};
  /// train::detail::encode_backward over the encoders: (work, grad, maker).
  function_ref<void(const shard_work&, std::span<const T>, const Maker&)> encode_backward{};
  /// How the stage mixes tokens (its context's `mixing`).
  model::token_mixing mixing = model::through_attention;
};

/// One rank's calls of one step (see the file comment). `Part` is the plan's partition part (its attention
/// mechanism types the stage's context). Lives for one step; holds references to the plan, the rank's
/// step, its encoder work, the system's resources and the stage entry.
template <class Comm, class Kernel, class T, class Memory, class Part>
class stage_runner {
 public:
  /// The context the backbone stage receives.
  using context_type = step_context<Comm, Kernel, T, Memory, typename Part::attention>;
  /// The encoders' activation stores, one per encoder (and one spare).
  using stores_type = std::vector<model::memory_activation_store<T, Memory>>;
  /// What makes an encoder's context for one (shard, slot) call.
  using encoder_maker = encoder_context_maker<Comm, Kernel, T, stores_type, Memory>;
  /// The stage entry it calls.
  using entry_type = stage_entry<context_type, T, encoder_maker>;

  double sums[2] = {0.0, 0.0};         ///< loss, loss weights
  std::int64_t counts[3] = {0, 0, 0};  ///< tokens, micro-batches, encoder items
  double cpu = 0.0;                    ///< thread CPU seconds in the user's stages and encoders
  step_store<T, Memory> store;         ///< the backbone stages' activations
  stores_type enc_stores;              ///< the encoders' activations

  /// The runner of pool rank `pool_rank` for `plan` with `encoders` encoders; `cpu0` is the step's CPU
  /// origin.
  stage_runner(const step_plan<Part>& plan, const step_rank& rank, const encoder_work& enc,
               const step_resources<Comm, Kernel, Memory>& res, const entry_type& calls, int encoders,
               step_stats& st, int pool_rank, double cpu0);

  /// Whether the stage splits its backward: then the executor calls backward_input and backward_weight.
  [[nodiscard]] bool split() const noexcept { return static_cast<bool>(calls_.backward_input); }

  /// Output elements of stage `stg` for slot `mb`: the stage's output_size(view, stage) when it has it,
  /// else output_size(view); 0 for an empty slot.
  [[nodiscard]] std::int64_t output_size(int stg, int mb) const { return output_size(stg, rank_->view(mb)); }
  /// Output elements of encoder shard `e` for slot `mb` to this pipeline.
  [[nodiscard]] std::int64_t encoder_size(int e, int mb) const {
    return enc_->sizes[static_cast<std::size_t>(e)][static_cast<std::size_t>(mb)];
  }

  /// Stage `stg`'s forward of slot `mb`: stage 0 with encoders reads the landings' rows in landing order;
  /// the last stage writes its per-token loss terms, which are summed (with the weights and tokens).
  void forward(int stg, int mb, std::span<const T> in, std::span<T> out);
  /// Stage `stg`'s backward of slot `mb` (stage 0 with encoders: its landing-order gradient back to the
  /// shards' layout).
  void backward(int stg, int mb, std::span<const T> gout, std::span<T> gin) {
    backward_as(pipeline::action_type::backward, calls_.backward, stg, mb, gout, gin);
  }
  /// Stage `stg`'s input-gradient half of slot `mb` (split-backward schedules).
  void backward_input(int stg, int mb, std::span<const T> gout, std::span<T> gin) {
    backward_as(pipeline::action_type::backward_input, calls_.backward_input, stg, mb, gout, gin);
  }
  /// Stage `stg`'s weight-gradient half of slot `mb` (split-backward schedules).
  void backward_weight(int stg, int mb);

  /// Encoder shard `e`'s forward of slot `mb`: its encoders' calls into its local rows, then the exchange
  /// over the shard's row; `out` receives the shard's output to this pipeline.
  void encoder_forward(int e, int mb, std::span<T> out);
  /// Encoder shard `e`'s backward of slot `mb`: the output gradient `g` back over the shard's row, summed
  /// into the local rows, then the encoders' backward.
  void encoder_backward(int e, int mb, std::span<const T> g);

  /// Activation slots the stages and encoders left after the step (0 when every backward released them).
  [[nodiscard]] std::size_t slots_left() const { return store.slots() + detail::slots_left(enc_stores); }

 private:
  using stage_call =
      function_ref<void(context_type&, const model::micro_batch_view&, std::span<const T>, std::span<T>)>;
  [[nodiscard]] int encoder_shards() const { return plan_->pipeline.num_encoder_shards(); }
  // Whether a slot's stage call is skipped: an empty slot, unless ep > 1 (every member of an expert group
  // calls its stage for every slot, with an empty view where it has no micro-batch, so that the experts'
  // all-to-alls meet).
  [[nodiscard]] bool skips(const model::micro_batch_view& v) const noexcept {
    return v.size() == 0 && res_.ep == nullptr;
  }
  [[nodiscard]] std::int64_t output_size(int stg, const model::micro_batch_view& v) const {
    return v.size() == 0 ? 0 : calls_.output_size(v, stg);
  }
  void backward_as(pipeline::action_type type, stage_call call, int stg, int mb, std::span<const T> gout,
                   std::span<T> gin);
  [[nodiscard]] context_type context(int stg, int mb);
  [[nodiscard]] encoder_maker encoder_ctx(int e, int mb) {
    return encoder_maker{&enc_stores, res_.item_groups, res_.kernel, e, mb, e * res_.row_size, res_.mem};
  }
  void exchange(std::span<const T> send, std::span<const std::int64_t> send_counts, std::span<T> recv,
                std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> send_layout,
                std::span<const std::int64_t> recv_layout);

  const step_plan<Part>* plan_;
  const step_rank* rank_;
  const encoder_work* enc_;
  step_resources<Comm, Kernel, Memory> res_;
  const entry_type& calls_;
  step_stats* st_;
  double cpu0_;
  encoder_landing<T, Memory> landing_;
};

#define HETMESH_TRAIN_RUNNER template <class Comm, class Kernel, class T, class Memory, class Part>
#define HETMESH_TRAIN_RUNNER_T stage_runner<Comm, Kernel, T, Memory, Part>

HETMESH_TRAIN_RUNNER
HETMESH_TRAIN_RUNNER_T::stage_runner(const step_plan<Part>& plan, const step_rank& rank,
                                     const encoder_work& enc, const step_resources<Comm, Kernel, Memory>& res,
                                     const entry_type& calls, int encoders, step_stats& st, int pool_rank,
                                     double cpu0)
    : store{model::memory_activation_store<T, Memory>(*res.mem)},
      plan_(&plan),
      rank_(&rank),
      enc_(&enc),
      res_(res),
      calls_(calls),
      st_(&st),
      cpu0_(cpu0),
      landing_{&enc, res.mem} {
  enc_stores.reserve(static_cast<std::size_t>(encoders) + 1);  // stores may hold move-only device buffers
  for (int k = 0; k <= encoders; ++k) enc_stores.emplace_back(*res.mem);
  const int S = plan.pipeline.num_stages;
  for (const auto& pm : plan.per_rank[static_cast<std::size_t>(pool_rank)])
    if (pm.offload_ratio > 0)
      for (int stg = 0; stg < S; ++stg) store.set_ratio(stg, pm.slot, pm.offload_ratio);
}

HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::forward(int stg, int mb, std::span<const T> in, std::span<T> out) {
  const auto v = rank_->view(mb);
  if (skips(v)) return;
  cpu_scope timed{cpu, st_->cpu_actions, {stg, pipeline::action_type::forward, mb}, cpu0_};
  auto ctx = context(stg, mb);
  typename Memory::template buffer<T> landed;  // stage 0 with encoders: the landing order
  if (stg == 0 && encoder_shards() > 0) {
    landed = landing_.gather(mb, in);
    in = std::as_const(landed).span();
  }
  if (stg + 1 < plan_->pipeline.num_stages) {
    calls_.forward(ctx, v, in, out);
    return;
  }
  const auto n = output_size(stg, v);
  if (n != v.size())
    throw_error<invalid_argument>(
        "train::system::run: the last stage ({}) has {} output elements for micro-batch {} of {} tokens; "
        "expected one loss term per token (output_size(view, stage) == view.size() at the last stage)",
        stg, n, mb, v.size());
  typename Memory::template buffer<T> loss;
  loss.resize(static_cast<std::size_t>(n));
  calls_.forward(ctx, v, in, loss.span());
  for (auto x : readable_on_host(*res_.mem, std::span<const T>(loss.span())))
    sums[0] += static_cast<double>(x);
  for (auto w : v.loss_weights) sums[1] += w;
  for (auto si : v.stream_index) counts[0] += si >= 0 ? 1 : 0;
  counts[1] += v.size() > 0 ? 1 : 0;
}

HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::backward_weight(int stg, int mb) {
  const auto v = rank_->view(mb);
  if (skips(v)) return;
  cpu_scope timed{cpu, st_->cpu_actions, {stg, pipeline::action_type::backward_weight, mb}, cpu0_};
  auto ctx = context(stg, mb);
  calls_.backward_weight(ctx, v);
}

HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::encoder_forward(int e, int mb, std::span<T> out) {
  const auto m = static_cast<std::size_t>(mb);
  if (!enc_->active[m]) return;
  const auto& ex = enc_->exchange[static_cast<std::size_t>(e)][m];
  typename Memory::template buffer<T> local, send;
  local.resize(static_cast<std::size_t>(ex.local_size));
  if (local.size() != 0) {
    res_.mem->fill(local.span(), T(0));
    cpu_scope timed{cpu, st_->cpu_actions, {e, pipeline::action_type::encoder_forward, mb}, cpu0_};
    calls_.encode(enc_->work[static_cast<std::size_t>(e)][m], local.span(), e, mb, encoder_ctx(e, mb),
                  counts[2]);
  }
  send.resize(static_cast<std::size_t>(ex.send_size()));
  ex.pack_into(*res_.mem, std::span<const T>(local.span()), send.span());
  exchange(std::span<const T>(send.span()), ex.send_counts, out, ex.recv_counts, ex.send_counts,
           ex.recv_counts);
}

HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::encoder_backward(int e, int mb, std::span<const T> g) {
  const auto m = static_cast<std::size_t>(mb);
  if (!enc_->active[m]) return;
  const auto& ex = enc_->exchange[static_cast<std::size_t>(e)][m];
  typename Memory::template buffer<T> back, local;  // back: in the send buffer's layout
  back.resize(static_cast<std::size_t>(ex.send_size()));
  // Only the row positions with this rank's tp rank send gradients back (the file comment of encoders.hpp):
  // the same layouts as the forward's, with the other positions' counts 0.
  exchange(g, ex.returned(ex.recv_counts), back.span(), ex.returned(ex.send_counts), ex.recv_counts,
           ex.send_counts);
  if (ex.local_size == 0) return;
  local.resize(static_cast<std::size_t>(ex.local_size));
  res_.mem->fill(local.span(), T(0));
  ex.unpack_add(*res_.mem, std::span<const T>(back.span()), local.span());
  cpu_scope timed{cpu, st_->cpu_actions, {e, pipeline::action_type::encoder_backward, mb}, cpu0_};
  calls_.encode_backward(enc_->work[static_cast<std::size_t>(e)][m], std::span<const T>(local.span()),
                         encoder_ctx(e, mb));
}

HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::backward_as(pipeline::action_type type, stage_call call, int stg, int mb,
                                         std::span<const T> gout, std::span<T> gin) {
  const auto v = rank_->view(mb);
  if (skips(v)) return;
  cpu_scope timed{cpu, st_->cpu_actions, {stg, type, mb}, cpu0_};
  auto ctx = context(stg, mb);
  if (stg == 0 && encoder_shards() > 0) {  // the landing rows' gradients, back to the shards' layout
    typename Memory::template buffer<T> g;
    g.resize(static_cast<std::size_t>(landing_.size(mb)));
    call(ctx, v, gout, g.span());
    landing_.scatter(mb, std::as_const(g).span(), gin);
    return;
  }
  call(ctx, v, gout, gin);
}

HETMESH_TRAIN_RUNNER
auto HETMESH_TRAIN_RUNNER_T::context(int stg, int mb) -> context_type {
  context_type ctx;
  ctx.activations = &store;
  ctx.stage = stg;
  ctx.micro_batch = mb;
  ctx.kernel = res_.kernel;
  ctx.memory = res_.mem;
  ctx.mixing = calls_.mixing;
  ctx.tp = res_.tp;
  ctx.ep = res_.ep;
  if (const auto* pm = rank_->planned[static_cast<std::size_t>(mb)]) {
    const auto& ring = plan_->rings[static_cast<std::size_t>(pm->ring)];
    ctx.ring = {res_.pool, std::span<const int>(ring.ring), pm->position};
    const bool groups = !rank_->stream_doc.empty();
    ctx.bind(plan_->partition, *pm, ring,
             groups ? std::span<const std::int64_t>(rank_->stream_doc[static_cast<std::size_t>(mb)])
                    : std::span<const std::int64_t>(),
             groups ? std::span<const std::int64_t>(rank_->stream_pos[static_cast<std::size_t>(mb)])
                    : std::span<const std::int64_t>(),
             res_.group, res_.attention);
  }
  return ctx;
}

// The slot's exchange over the shard's row: `send` by destination, `recv` by source, each laid out by its
// layout counts (a position's part starts after the layout counts of the positions before it).
HETMESH_TRAIN_RUNNER
void HETMESH_TRAIN_RUNNER_T::exchange(std::span<const T> send, std::span<const std::int64_t> send_counts,
                                      std::span<T> recv, std::span<const std::int64_t> recv_counts,
                                      std::span<const std::int64_t> send_layout,
                                      std::span<const std::int64_t> recv_layout) {
  const double c0 = thread_cpu_seconds();
  auto displs = [](std::span<const std::int64_t> counts) {
    std::vector<std::int64_t> d(counts.size(), 0);
    for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
    return d;
  };
  const auto sd = displs(send_layout), rd = displs(recv_layout);
  comm::all_to_all_v(*res_.row, send, send_counts, std::span<const std::int64_t>(sd), recv, recv_counts,
                     std::span<const std::int64_t>(rd));
  st_->cpu_comm_seconds += thread_cpu_seconds() - c0;
}

#undef HETMESH_TRAIN_RUNNER
#undef HETMESH_TRAIN_RUNNER_T

/// Calls `f(entry)` with the stage entry of the user's backbone `stage` and encoder bindings `encoders`
/// for a Runner (a stage_runner type): the callables live for the call. The stage's backward_input and
/// backward_weight are bound when it splits its backward (model::split_backward_stage).
template <class Runner, class Stage, class... Encoders, class F>
decltype(auto) with_stage_entry(Stage& stage, std::tuple<Encoders...>& encoders, F&& f) {
  using T = typename Runner::context_type::value_type;
  using Ctx = typename Runner::context_type;
  using Maker = typename Runner::encoder_maker;
  using View = model::micro_batch_view;
  using Memory = typename Ctx::memory_type;
  auto fwd = [&](Ctx& c, const View& v, std::span<const T> in, std::span<T> out) {
    stage.forward(c, v, in, out);
  };
  auto bwd = [&](Ctx& c, const View& v, std::span<const T> g, std::span<T> gi) {
    stage.backward(c, v, g, gi);
  };
  auto bwd_i = [&](Ctx& c, const View& v, std::span<const T> g, std::span<T> gi) {
    if constexpr (model::split_backward_stage<Stage, T, Ctx>) stage.backward_input(c, v, g, gi);
  };
  auto bwd_w = [&](Ctx& c, const View& v) {
    if constexpr (model::split_backward_stage<Stage, T, Ctx>) stage.backward_weight(c, v);
  };
  auto out_sz = [&](const View& v, int stg) { return model::stage_output_size(stage, v, stg); };
  auto enc = [&](const shard_work& w, std::span<T> out, int e, int mb, const Maker& make,
                 std::int64_t& items) {
    std::apply([&](auto&... b) { encode<T, Memory>(w, out, e, mb, make, items, b...); }, encoders);
  };
  auto enc_b = [&](const shard_work& w, std::span<const T> g, const Maker& make) {
    std::apply([&](auto&... b) { encode_backward<T>(w, g, make, b...); }, encoders);
  };
  typename Runner::entry_type entry;
  entry.forward = fwd;
  entry.backward = bwd;
  if constexpr (model::split_backward_stage<Stage, T, Ctx>) {
    entry.backward_input = bwd_i;
    entry.backward_weight = bwd_w;
  }
  entry.output_size = out_sz;
  entry.encode = enc;
  entry.encode_backward = enc_b;
  entry.mixing = model::token_mixing_of<Stage>().value_or(model::through_attention);
  return std::forward<F>(f)(std::as_const(entry));
}

/// Runs `pipeline`'s schedule on this rank's pipeline communicator `pipe` with the runner's calls, after a
/// barrier over `world` (the ranks' timelines share an origin), and records the step's wall and CPU times,
/// its timeline and the activation store's peaks in `st`. Collective over the world.
template <class Comm, class Runner, class Memory>
void execute_step(Comm& world, Comm& pipe, const pipeline::schedule& pipeline, Runner& runner, Memory& mem,
                  step_stats& st) {
  using T = typename Runner::context_type::value_type;
  auto fwd = [&](int s, int m, std::span<const T> in, std::span<T> out) { runner.forward(s, m, in, out); };
  auto bwd = [&](int s, int m, std::span<const T> g, std::span<T> gi) { runner.backward(s, m, g, gi); };
  auto bwd_i = [&](int s, int m, std::span<const T> g, std::span<T> gi) {
    runner.backward_input(s, m, g, gi);
  };
  auto bwd_w = [&](int s, int m) { runner.backward_weight(s, m); };
  auto enc_f = [&](int e, int m, std::span<T> out) { runner.encoder_forward(e, m, out); };
  auto enc_b = [&](int e, int m, std::span<const T> g) { runner.encoder_backward(e, m, g); };
  auto out_sz = [&](int s, int m) { return runner.output_size(s, m); };
  auto enc_sz = [&](int e, int m) { return runner.encoder_size(e, m); };
  run::pipeline_calls<T> calls;
  calls.forward = fwd;
  calls.backward = bwd;
  if (runner.split()) {
    calls.backward_input = bwd_i;
    calls.backward_weight = bwd_w;
  }
  calls.encoder_forward = enc_f;
  calls.encoder_backward = enc_b;
  calls.output_size = out_sz;
  calls.encoder_output_size = enc_sz;
  const double barrier_cpu0 = thread_cpu_seconds();
  comm::barrier(world);  // the ranks' timelines share an origin, up to the barrier's skew
  st.cpu_comm_seconds += thread_cpu_seconds() - barrier_cpu0;
  const auto t0 = std::chrono::steady_clock::now();
  run::execute_pipeline_erased(pipe, pipeline, calls, mem, &st.timeline, &st.cpu_comm_seconds);
  st.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  st.cpu_busy_seconds = runner.cpu;
  st.activation_peak_bytes = runner.store.peak_bytes();
  st.offloaded_bytes = runner.store.offloaded_bytes();
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the runner and its step over the loopback communicator with
// the reference kernel in host memory, float and double, for the library's plan parts (and MPI's with
// HETMESH_COMPILED_MPI). HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of
// <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
#define HETMESH_TRAIN_RUNNER_INSTANCE(C, T, P)                                                       \
  HETMESH_INSTANTIATE class stage_runner<C, model::reference_attention, T, model::host_memory, P>;   \
  HETMESH_INSTANTIATE void execute_step<                                                             \
      C, stage_runner<C, model::reference_attention, T, model::host_memory, P>, model::host_memory>( \
      C&, C&, const pipeline::schedule&,                                                             \
      stage_runner<C, model::reference_attention, T, model::host_memory, P>&, model::host_memory&,   \
      step_stats&);
#define HETMESH_TRAIN_RUNNER_INSTANCES(C)                      \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, float, static_cp_part)      \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, double, static_cp_part)     \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, float, ulysses_group_part)  \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, double, ulysses_group_part) \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, float, hdp_part)            \
  HETMESH_TRAIN_RUNNER_INSTANCE(C, double, hdp_part)
HETMESH_TRAIN_RUNNER_INSTANCES(comm::loopback::communicator)
#if HETMESH_COMPILED_MPI
HETMESH_TRAIN_RUNNER_INSTANCES(comm::mpi::communicator)
#endif
#undef HETMESH_TRAIN_RUNNER_INSTANCES
#undef HETMESH_TRAIN_RUNNER_INSTANCE
#endif

}  // namespace hetmesh::train::detail
