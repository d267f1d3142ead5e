// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the pipeline executor. It runs one rank's action list of a lowered schedule (see
// pipeline::add_send_recv) with the user's stage callables, moving activations and gradients with the
// communicator's send/recv. Buffer sizes come from the plan (`activation_sizes`), so micro-batches of
// different lengths need no shape exchange: each RECV knows its element count.
//
// Where buffers live: activations and gradients are buffers of a memory policy (model::memory_policy)
// whose space is the communicator's: host vectors (model::host_memory, the default) over a host
// communicator, device memory over a device communicator. The executor does its own buffer work (zeroing,
// joining and splitting stage 0's encoder slices) through the policy and never touches a buffer on the
// CPU, so the same body runs on device memory; on a CPU-only machine, comm::emulated_device with
// model::emulated_device_memory runs (and tests) that device path.
//
// Data flow per micro-batch mb: stage s's forward reads its input (stage 0: the concatenated encoder
// outputs of all shards in shard order, or nothing without encoders) and writes its output (nothing on
// the last stage, which computes its loss itself); the backward reads the gradient of its output
// (nothing on the last stage) and writes the gradient of its input, which stage 0 splits back into the
// encoder shards' slices. An overlapped forward-backward (OVERLAP_F_B, DualPipeV) runs its forward half,
// then its backward half, one after the other on the calling thread, as PyTorch's runtime does on CPU.
//
// Compiled once: the executor's body (execute_pipeline_erased) takes the callables by reference
// (run::pipeline_calls, function_ref members), so it is a template over (communicator, element, memory)
// only. Under HETMESH_SEPARATE_COMPILATION the common combinations (loopback x float/double x host memory;
// MPI too with HETMESH_COMPILED_MPI) are explicit instantiations defined once in the <hetmesh/src.hpp>
// translation unit; every other translation unit only declares them (the end of this file).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/communicator.hpp"
#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/cpu_time.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../model/host_memory.hpp"
#include "../pipeline/action.hpp"
#include "../pipeline/lower.hpp"
#include "../pipeline/simulate.hpp"
#include "agreement.hpp"
#include "pipeline_calls.hpp"

#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::run {

namespace detail {

/// The tag of a transfer: kind (0 activation, 1 gradient, 2 encoder output, 3 embedding gradient) in the
/// lowest 2 bits, then the micro-batch, then the stage (kinds 0, 1) or encoder shard (kinds 2, 3). For
/// stage_or_shard < max(stages, shards) and mb < num_microbatches the map is injective, so two transfers
/// never share a tag; a tag past comm::max_user_tag is refused (capacity_error naming the stage,
/// micro-batch and limit), never wrapped: a wrapped tag could match another transfer's message.
HETMESH_COMPILED int pipeline_tag(const pipeline::schedule& s, int stage_or_shard, int mb, int kind)
#if HETMESH_BODIES
{
  const std::int64_t raw = ((static_cast<std::int64_t>(stage_or_shard) * s.num_microbatches + mb) * 4 + kind);
  if (raw > comm::max_user_tag)
    throw_error<capacity_error>(
        "pipeline execute({}): the message tag of stage/shard {} micro-batch {} (kind {}) is {}, past the "
        "limit max_user_tag = {}; {} stages, {} encoder shards and {} micro-batches need tags up to {}; "
        "expected (max(stages, shards) x micro-batches x 4) <= {}: use fewer micro-batches per step",
        s.name, stage_or_shard, mb, kind, raw, comm::max_user_tag, s.num_stages, s.num_encoder_shards(),
        s.num_microbatches,
        (static_cast<std::int64_t>(std::max(s.num_stages, s.num_encoder_shards())) * s.num_microbatches * 4) -
            1,
        static_cast<std::int64_t>(comm::max_user_tag) + 1);
  return static_cast<int>(raw);
}
#else
    ;
#endif

/// Collective over `c`: the plan-agreement check of `s` (run::check_plan_agreement) on any communicator.
/// A host communicator gathers the hashes in host memory; a device communicator gathers them through
/// memory policy `mem` (run::check_plan_agreement's overload with a memory policy). Throws mismatch_error on
/// every rank when the ranks' schedules differ, naming the disagreeing ranks and the majority hash. Cost:
/// one all-gather of 8 bytes per rank plus hashing the schedule.
template <comm::communicator C, model::memory_policy M>
void check_schedule_agreement(C& c, M& mem, const pipeline::schedule& s, std::string_view what) {
  check_plan_agreement(c, std::as_const(mem), s, what);
}

/// Whether `s` needs SEND/RECV actions it lacks: some data crosses ranks and no action communicates.
HETMESH_COMPILED bool lacks_transfers(const pipeline::schedule& s)
#if HETMESH_BODIES
{
  bool any_comm = false, crosses = false;
  std::vector<std::pair<pipeline::action, pipeline::action>> pairs;
  for (const auto& row : s.ranks)
    for (const auto& a : row) {
      any_comm = any_comm || pipeline::is_comm(a.type);
      if (!crosses && pipeline::is_compute(a.type)) {
        pipeline::comm_pairs(s, a, pairs);
        crosses = !pairs.empty();
      }
    }
  return crosses && !any_comm;
}
#else
    ;
#endif

/// execute_pipeline's checks before the first action (see its preconditions): the communicator's size,
/// the schedule's agreement across ranks (collective assertion level), the sizes, the SEND/RECV actions
/// and the largest message tag, so that every rank refuses before anything is sent.
template <comm::communicator C, class T, model::memory_policy M>
void check_pipeline_call(C& c, M& mem, const pipeline::schedule& s, const pipeline_calls<T>& fn) {
  if (c.size() != s.total_ranks())
    throw_error<invalid_argument>(
        "pipeline execute({}): communicator of {} ranks; expected the schedule's {} ranks", s.name, c.size(),
        s.total_ranks());
  if constexpr (assertion_enabled(assertion_level::collective))  // every rank runs the same schedule
    check_schedule_agreement(c, mem, s, "pipeline schedule");
  if (!fn.output_size && s.num_stages > 1)
    throw_error<invalid_argument>(
        "pipeline execute({}): activation_sizes.output is empty; expected the plan's sizes", s.name);
  if (lacks_transfers(s))
    throw_error<invalid_argument>(
        "pipeline execute({}): the schedule has no SEND/RECV actions but data crosses ranks; "
        "expected a lowered schedule (add_send_recv)",
        s.name);
  const int most = std::max(s.num_stages, s.num_encoder_shards());
  if (s.num_microbatches > 0 && most > 0) (void)pipeline_tag(s, most - 1, s.num_microbatches - 1, 3);
}

/// One rank's run of one execute_pipeline call: the buffers in flight, keyed by (stage or encoder shard,
/// micro-batch), and one member per kind of action. Buffers are M::buffer<T>, filled and copied through
/// `mem` only (never touched on the CPU).
template <comm::communicator C, class T, model::memory_policy M>
class pipeline_run {
 public:
  /// A run of `s` on rank c.rank() with callables `fn` over buffers of `mem`.
  pipeline_run(C& c, const pipeline::schedule& s, const pipeline_calls<T>& fn, M& mem)
      : c_(c), s_(s), fn_(fn), mem_(mem), rank_(c.rank()), S_(s.num_stages), E_(s.num_encoder_shards()) {}

  /// Runs action `a` (a part of an OVERLAP_F_B, or any other action).
  void run(const pipeline::action& a) {
    using pipeline::action_type;
    switch (a.type) {
      case action_type::forward:
        forward(a);
        break;
      case action_type::backward:
      case action_type::backward_input:
        backward(a);
        break;
      case action_type::backward_weight:
        need(static_cast<bool>(fn_.backward_weight), a, "backward_weight");
        fn_.backward_weight(a.stage, a.microbatch);
        break;
      case action_type::reduce_grad:
        if (fn_.reduce_grad) fn_.reduce_grad(a.stage);
        break;
      case action_type::encoder_forward:
        encoder_forward(a);
        break;
      case action_type::encoder_backward: {
        need(static_cast<bool>(fn_.encoder_backward), a, "encoder_backward");
        buffer g = take(enc_grad_, {a.stage, a.microbatch}, a, "embedding gradient");
        fn_.encoder_backward(a.stage, a.microbatch, view(g));
        break;
      }
      case action_type::overlap_f_b:
        break;  // never reached: parts() split it into its F and B halves
      default:
        transfer(a);
        break;
    }
  }

 private:
  using buffer = typename M::template buffer<T>;
  using key = std::pair<int, int>;
  using buffers = std::map<key, buffer>;

  static std::span<const T> view(buffer& b) { return std::span<const T>(b.span()); }

  // A buffer of n elements in M's memory: zero-filled (`zeroed`, for what a callable writes) or as
  // allocated (for what a receive or a copy overwrites whole).
  buffer make(std::size_t n, bool zeroed) {
    buffer b;
    b.resize(n);
    if (zeroed && n > 0) mem_.fill(b.span(), T(0));
    return b;
  }
  buffer take(buffers& m, key k, const pipeline::action& a, const char* what) {
    auto it = m.find(k);
    if (it == m.end())
      throw_error<invalid_argument>(
          "pipeline execute({}): rank {} action `{}` finds no {} (stage/shard {}, micro-batch "
          "{}); expected it produced or received earlier in the list",
          s_.name, rank_, pipeline::to_text(a), what, k.first, k.second);
    buffer v = std::move(it->second);
    m.erase(it);
    return v;
  }
  void need(bool set, const pipeline::action& a, const char* name) const {
    if (!set)
      throw_error<invalid_argument>(
          "pipeline execute({}): rank {} runs `{}` but the stage callables' {} is empty", s_.name, rank_,
          pipeline::to_text(a), name);
  }
  std::size_t out_size(int stage, int mb) const {
    const std::int64_t n = fn_.output_size(stage, mb);
    if (n < 0)
      throw_error<invalid_argument>(
          "pipeline execute({}): output size {} for stage {} micro-batch {}; expected >= 0", s_.name, n,
          stage, mb);
    return static_cast<std::size_t>(n);
  }
  std::size_t enc_size(int e, int mb) const {
    if (!fn_.encoder_output_size)
      throw_error<invalid_argument>(
          "pipeline execute({}): the schedule has encoder shards but "
          "activation_sizes.encoder_output is empty",
          s_.name);
    return static_cast<std::size_t>(fn_.encoder_output_size(e, mb));
  }

  // Stage 0's input for mb: the encoder shards' outputs in shard order, joined on M (none without encoders).
  buffer stage0_input(const pipeline::action& a) {
    const int mb = a.microbatch;
    if (E_ == 0) return buffer{};
    if (E_ == 1) return take(enc_in_, {0, mb}, a, "encoder output");
    std::vector<buffer> shard_outs;
    std::size_t total = 0;
    for (int e = 0; e < E_; ++e) {
      shard_outs.push_back(take(enc_in_, {e, mb}, a, "encoder output"));
      total += shard_outs.back().size();
    }
    buffer in = make(total, false);
    std::size_t off = 0;
    for (auto& part : shard_outs) {
      mem_.copy(in.span().subspan(off, part.size()), view(part));
      off += part.size();
    }
    return in;
  }

  void forward(const pipeline::action& a) {
    need(static_cast<bool>(fn_.forward), a, "forward");
    const int mb = a.microbatch;
    buffer in = a.stage > 0 ? take(act_in_, {a.stage, mb}, a, "input activation") : stage0_input(a);
    buffer out = make(a.stage + 1 < S_ ? out_size(a.stage, mb) : 0, true);
    fn_.forward(a.stage, mb, view(in), out.span());
    if (a.stage + 1 == S_) return;  // the last stage computes its loss itself
    if (s_.rank_of_stage(a.stage + 1) == rank_)
      act_in_[{a.stage + 1, mb}] = std::move(out);
    else
      act_out_[{a.stage, mb}] = std::move(out);
  }

  // Stage 0's input gradient `gin` of mb, split into the encoder shards' slices (on M) and kept for the
  // shards on this rank or queued for sending.
  void deliver_to_shards(int mb, buffer gin) {
    auto deliver = [&](int e, buffer slice) {
      (s_.encoder_shard_to_rank[static_cast<std::size_t>(e)] == rank_ ? enc_grad_ : enc_grad_out_)[{e, mb}] =
          std::move(slice);
    };
    if (E_ == 1) {
      deliver(0, std::move(gin));
      return;
    }
    std::size_t off = 0;
    for (int e = 0; e < E_; ++e) {
      const std::size_t n = enc_size(e, mb);
      buffer slice = make(n, false);
      mem_.copy(slice.span(), view(gin).subspan(off, n));
      off += n;
      deliver(e, std::move(slice));
    }
  }

  void backward(const pipeline::action& a) {
    const bool full = a.type == pipeline::action_type::backward;
    const auto& f = full ? fn_.backward : fn_.backward_input;
    need(static_cast<bool>(f), a, full ? "backward" : "backward_input");
    const int mb = a.microbatch;
    buffer gout;
    if (a.stage + 1 < S_) gout = take(grad_in_, {a.stage, mb}, a, "output gradient");
    std::size_t gin_size = 0;
    if (a.stage > 0)
      gin_size = out_size(a.stage - 1, mb);
    else
      for (int e = 0; e < E_; ++e) gin_size += enc_size(e, mb);
    buffer gin = make(gin_size, true);
    f(a.stage, mb, view(gout), gin.span());
    if (a.stage > 0) {
      if (s_.rank_of_stage(a.stage - 1) == rank_)
        grad_in_[{a.stage - 1, mb}] = std::move(gin);
      else
        grad_out_[{a.stage, mb}] = std::move(gin);
    } else if (E_ > 0) {
      deliver_to_shards(mb, std::move(gin));
    }
  }

  void encoder_forward(const pipeline::action& a) {
    need(static_cast<bool>(fn_.encoder_forward), a, "encoder_forward");
    buffer out = make(enc_size(a.stage, a.microbatch), true);
    fn_.encoder_forward(a.stage, a.microbatch, out.span());
    (s_.rank_of_stage(0) == rank_ ? enc_in_ : enc_out_)[{a.stage, a.microbatch}] = std::move(out);
  }

  // A SEND or RECV action: the buffer it sends (taken from its queue) or receives (kept for its consumer).
  void transfer(const pipeline::action& a) {
    using pipeline::action_type;
    const int st = a.stage, mb = a.microbatch;
    const auto shard_rank = [&] { return s_.encoder_shard_to_rank[static_cast<std::size_t>(st)]; };
    auto send = [&](buffers& from, const char* what, int to, int tag) {
      buffer b = take(from, {st, mb}, a, what);
      comm::send(c_, view(b), to, tag);
    };
    auto recv = [&](buffers& into, std::size_t n, int from, int tag) {
      buffer b = make(n, false);
      comm::recv(c_, b.span(), from, tag);
      into[{st, mb}] = std::move(b);
    };
    switch (a.type) {
      case action_type::send_f:
        send(act_out_, "output activation to send", s_.rank_of_stage(st + 1), pipeline_tag(s_, st, mb, 0));
        break;
      case action_type::recv_f:
        recv(act_in_, out_size(st - 1, mb), s_.rank_of_stage(st - 1), pipeline_tag(s_, st - 1, mb, 0));
        break;
      case action_type::send_b:
        send(grad_out_, "input gradient to send", s_.rank_of_stage(st - 1), pipeline_tag(s_, st, mb, 1));
        break;
      case action_type::recv_b:
        recv(grad_in_, out_size(st, mb), s_.rank_of_stage(st + 1), pipeline_tag(s_, st + 1, mb, 1));
        break;
      case action_type::send_ef:
        send(enc_out_, "encoder output to send", s_.rank_of_stage(0), pipeline_tag(s_, st, mb, 2));
        break;
      case action_type::recv_ef:
        recv(enc_in_, enc_size(st, mb), shard_rank(), pipeline_tag(s_, st, mb, 2));
        break;
      case action_type::send_eb:
        send(enc_grad_out_, "embedding gradient to send", shard_rank(), pipeline_tag(s_, st, mb, 3));
        break;
      case action_type::recv_eb:
        recv(enc_grad_, enc_size(st, mb), s_.rank_of_stage(0), pipeline_tag(s_, st, mb, 3));
        break;
      default:
        break;  // compute actions are run() 's
    }
  }

  C& c_;
  const pipeline::schedule& s_;
  const pipeline_calls<T>& fn_;
  M& mem_;
  int rank_, S_, E_;
  // act_in_: a stage's input activation (by its stage); act_out_: an output to send (by the producing
  // stage); grad_in_: an output gradient (by the stage whose output it is); grad_out_: an input gradient
  // to send (by the producing stage); enc_in_ / enc_out_: an encoder shard's output kept for stage 0 / to
  // send; enc_grad_ / enc_grad_out_: an encoder shard's embedding gradient kept / to send (by shard).
  buffers act_in_, act_out_, grad_in_, grad_out_, enc_in_, enc_out_, enc_grad_, enc_grad_out_;
};

}  // namespace detail

/// Runs rank `c.rank()`'s list of the lowered schedule `s` with the callables and sizes `fn` (references;
/// see pipeline_calls), its activations and gradients in buffers of memory policy `mem`: execute_pipeline's
/// contract (below), which calls this. Its body depends on (C, T, M) only, so under
/// HETMESH_SEPARATE_COMPILATION the common combinations are compiled once (the end of this file).
template <comm::communicator C, class T, model::memory_policy M>
void execute_pipeline_erased(C& c, const pipeline::schedule& s, const pipeline_calls<T>& fn, M& mem,
                             std::vector<pipeline::timed_action>* timeline = nullptr,
                             double* transfer_cpu_seconds = nullptr) {
  static_assert(C::memory == M::space,
                "run::execute_pipeline: a device communicator needs a device memory policy, and a host "
                "communicator a host one (M::space == C::memory): model::emulated_device_memory or "
                "cuda::device_memory over a device communicator, model::host_memory (or no policy) over a "
                "host communicator");
  detail::check_pipeline_call(c, mem, s, fn);
  const int rank = c.rank();
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // An overlapped forward-backward (OVERLAP_F_B) runs as PyTorch's runtime runs it: its forward half,
  // then its backward half, each with its own timeline entry. `steps` pairs each part with its action.
  std::vector<std::pair<pipeline::action, pipeline::action>> steps;
  for (const pipeline::action& whole : s.ranks.at(static_cast<std::size_t>(rank)))
    for (const pipeline::action& part : pipeline::parts(whole)) steps.emplace_back(part, whole);
  detail::pipeline_run<C, T, M> state(c, s, fn, mem);
  for (const auto& [a, whole] : steps) {
    const double start = timeline != nullptr ? seconds() : 0.0;
    const bool timed_transfer = transfer_cpu_seconds != nullptr && pipeline::is_comm(a.type);
    const double cpu_start = timed_transfer ? thread_cpu_seconds() : 0.0;
    try {
      state.run(a);
    } catch (error& e) {
      e.add_context(hetmesh::format("pipeline execute({}) rank {} action `{}`{}", s.name, rank,
                                    pipeline::to_text(a),
                                    whole == a ? std::string() : " of `" + pipeline::to_text(whole) + "`"));
      throw;
    }
    if (timed_transfer) *transfer_cpu_seconds += thread_cpu_seconds() - cpu_start;
    if (timeline != nullptr) timeline->push_back(pipeline::timed_action{rank, a, start, seconds()});
  }
}

/// Runs rank `c.rank()`'s list of the lowered schedule `s`, its activations and gradients in buffers of
/// memory policy `mem`. Collective over the communicator's group, which must be the pipeline's ranks in
/// schedule order (c.size() == s.total_ranks()).
///
/// Memory: M models model::memory_policy with M::space == C::memory (a host communicator with
/// model::host_memory; a device communicator with a device policy: model::emulated_device_memory over
/// comm::emulated_device, cuda::device_memory over NCCL), else a static_assert. Every activation and
/// gradient buffer is an M::buffer<T>; the executor never reads or writes one on the CPU: it zero-fills
/// with mem.fill, joins the encoder shards' outputs into stage 0's input and splits stage 0's input
/// gradient back into the shards' slices with mem.copy, and hands the buffers' spans (M::space pointers)
/// to the stage callables and to the communicator's send/recv. `output` and `grad_input` spans arrive
/// zero-filled. On a device path, M's operations, the communicator and the callables must be ordered on
/// one stream (as model::memory_policy requires); the executor returns once everything is enqueued
/// (timeline and transfer times are then enqueue times), and a buffer is released once its last use is
/// enqueued (its policy's release must be safe with work in flight).
///
/// Preconditions: `s` lowered (SEND/RECV present wherever data crosses ranks) and verified; the callables
/// its actions need are set; sizes >= 0. Throws invalid_argument naming the missing piece; rethrows
/// callable and communicator errors with the action as context. At the collective assertion level,
/// checks first that every rank runs the same schedule (mismatch_error otherwise). With `timeline`,
/// appends each action with its wall time (seconds since the call) for trace export. Calls:
/// stage_functions<T> (std::function members) or stage_calls<T, ...> (the callables' own types); Sizes:
/// activation_sizes, sizes_of<...> or any type with `output(stage, mb)` and `encoder_output(shard, mb)`
/// members. Both are referred to (pipeline_calls_of), never copied, and the work is done by
/// execute_pipeline_erased<C, T, M>, whatever their types. With `transfer_cpu_seconds`, adds to it the
/// calling thread's CPU time in the SEND/RECV actions (the bytes on the wire, apart from the executor's own
/// bookkeeping). Cost: the callables (one indirect call each) plus one send or receive per cross-rank
/// transfer, one fill per produced buffer and, on stage 0 with several encoder shards, one copy of its input
/// and of its input gradient.
template <comm::communicator C, class Calls, class Sizes = activation_sizes, model::memory_policy M>
void execute_pipeline(C& c, const pipeline::schedule& s, Calls&& fn, const Sizes& sizes, M& mem,
                      std::vector<pipeline::timed_action>* timeline = nullptr,
                      double* transfer_cpu_seconds = nullptr) {
  static_assert(std::remove_cvref_t<C>::memory == M::space,
                "run::execute_pipeline: a device communicator needs a device memory policy, and a host "
                "communicator a host one (M::space == C::memory): model::emulated_device_memory or "
                "cuda::device_memory over a device communicator, model::host_memory (or no policy) over a "
                "host communicator");
  if constexpr (std::remove_cvref_t<C>::memory == M::space)
    execute_pipeline_erased(c, s, pipeline_calls_of(fn, sizes), mem, timeline, transfer_cpu_seconds);
}

/// execute_pipeline on host memory: the same contract with model::host_memory, for a host communicator
/// (loopback, mpi). A device communicator needs a device memory policy (the overload above): a
/// static_assert otherwise.
template <comm::communicator C, class Calls, class Sizes = activation_sizes>
void execute_pipeline(C& c, const pipeline::schedule& s, Calls&& fn, const Sizes& sizes,
                      std::vector<pipeline::timed_action>* timeline = nullptr,
                      double* transfer_cpu_seconds = nullptr) {
  static_assert(comm::host_communicator<C>,
                "run::execute_pipeline without a memory policy: a device communicator needs a device memory "
                "policy; pass one after the sizes, execute_pipeline(c, s, fn, sizes, mem), whose space is "
                "memory_space::device (model::emulated_device_memory, cuda::device_memory)");
  if constexpr (comm::host_communicator<C>) {
    model::host_memory mem;
    execute_pipeline(c, s, std::forward<Calls>(fn), sizes, mem, timeline, transfer_cpu_seconds);
  }
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the executor over the loopback communicator (and MPI's,
// with HETMESH_COMPILED_MPI) for float and double activations in host memory. HETMESH_INSTANTIATE is
// `extern template` (a declaration: no body is generated here) in every translation unit but the one of
// <hetmesh/src.hpp>, where it is `template` (the definition). Other combinations are instantiated where
// they are used, as in a header-only build.
#if HETMESH_SEPARATE_COMPILATION
#define HETMESH_RUN_PIPELINE_INSTANCE(C, T)                                         \
  HETMESH_INSTANTIATE void execute_pipeline_erased<C, T, model::host_memory>(       \
      C&, const pipeline::schedule&, const pipeline_calls<T>&, model::host_memory&, \
      std::vector<pipeline::timed_action>*, double*);
HETMESH_RUN_PIPELINE_INSTANCE(comm::loopback::communicator, float)
HETMESH_RUN_PIPELINE_INSTANCE(comm::loopback::communicator, double)
#if HETMESH_COMPILED_MPI
HETMESH_RUN_PIPELINE_INSTANCE(comm::mpi::communicator, float)
HETMESH_RUN_PIPELINE_INSTANCE(comm::mpi::communicator, double)
#endif
#undef HETMESH_RUN_PIPELINE_INSTANCE
#endif

}  // namespace hetmesh::run
