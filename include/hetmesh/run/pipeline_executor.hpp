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
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../comm/communicator.hpp"
#include "../core/assert.hpp"
#include "../core/cpu_time.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../model/host_memory.hpp"
#include "../pipeline/action.hpp"
#include "../pipeline/lower.hpp"
#include "../pipeline/simulate.hpp"
#include "agreement.hpp"

namespace hetmesh::run {

/// The user's stage callables. `forward` and one of `backward` / (`backward_input` and
/// `backward_weight`) are required for the actions a schedule contains; the others are optional.
template <class T>
struct stage_functions {
  using value_type = T;  ///< the activations' element type
  /// forward(stage, mb, input, output)
  std::function<void(int, int, std::span<const T>, std::span<T>)> forward{};
  /// backward(stage, mb, grad_output, grad_input): full backward; accumulates weight gradients.
  std::function<void(int, int, std::span<const T>, std::span<T>)> backward{};
  /// backward_input(stage, mb, grad_output, grad_input): input gradient only (zero-bubble I).
  std::function<void(int, int, std::span<const T>, std::span<T>)> backward_input{};
  /// backward_weight(stage, mb): weight gradient of a micro-batch whose I has run (zero-bubble W).
  std::function<void(int, int)> backward_weight{};
  /// reduce_grad(stage): data-parallel gradient reduction of a finished stage.
  std::function<void(int)> reduce_grad{};
  /// encoder_forward(shard, mb, output) and encoder_backward(shard, mb, grad_output).
  std::function<void(int, int, std::span<T>)> encoder_forward{};
  /// The gradient pass of encoder_forward.
  std::function<void(int, int, std::span<const T>)> encoder_backward{};
};

/// A callable a stage_calls leaves out: the executor refuses a schedule whose actions need it.
struct no_call {};

/// The stage callables as types (no std::function): each member is any callable with stage_functions'
/// signature for its role, or no_call. E.g. `stage_calls<float, F, B>{f, b}` for a schedule of F and B
/// actions.
template <class T, class Forward, class Backward = no_call, class BackwardInput = no_call,
          class BackwardWeight = no_call, class EncoderForward = no_call, class EncoderBackward = no_call,
          class ReduceGrad = no_call>
struct stage_calls {
  using value_type = T;                ///< the activations' element type
  Forward forward;                     ///< forward(stage, mb, input, output)
  Backward backward{};                 ///< backward(stage, mb, grad_output, grad_input)
  BackwardInput backward_input{};      ///< backward_input(stage, mb, grad_output, grad_input)
  BackwardWeight backward_weight{};    ///< backward_weight(stage, mb)
  EncoderForward encoder_forward{};    ///< encoder_forward(shard, mb, output)
  EncoderBackward encoder_backward{};  ///< encoder_backward(shard, mb, grad_output)
  ReduceGrad reduce_grad{};            ///< reduce_grad(stage)
};

/// Element counts from the plan, as the callables' own types: output(stage, mb) and, with encoders,
/// encoder_output(shard, mb) (see activation_sizes).
template <class Output, class EncoderOutput = no_call>
struct sizes_of {
  Output output;                   ///< output(stage, mb)
  EncoderOutput encoder_output{};  ///< encoder_output(shard, mb)
};

/// Element counts from the plan. `output(stage, mb)`: stage's forward output for mb (= stage+1's input);
/// `encoder_output(shard, mb)`: one shard's encoder output for mb.
struct activation_sizes {
  std::function<std::int64_t(int, int)> output{};          ///< output(stage, mb)
  std::function<std::int64_t(int, int)> encoder_output{};  ///< encoder_output(shard, mb)
};

namespace detail {

/// Whether a callable is there: false for no_call and for an empty std::function, true otherwise.
template <class F>
[[nodiscard]] bool is_set(const F& f) {
  if constexpr (std::is_same_v<F, no_call>)
    return false;
  else if constexpr (requires { static_cast<bool>(f); })
    return static_cast<bool>(f);
  else
    return true;
}

/// The tag of a transfer: kind (0 activation, 1 gradient, 2 encoder output, 3 embedding gradient) in the
/// lowest 2 bits, then the micro-batch, then the stage (kinds 0, 1) or encoder shard (kinds 2, 3). For
/// stage_or_shard < max(stages, shards) and mb < num_microbatches the map is injective, so two transfers
/// never share a tag; a tag past comm::max_user_tag is refused (capacity_error naming the stage,
/// micro-batch and limit), never wrapped: a wrapped tag could match another transfer's message.
inline int pipeline_tag(const pipeline::schedule& s, int stage_or_shard, int mb, int kind) {
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

/// Collective over `c`: the plan-agreement check of `s` (run::check_plan_agreement) on any communicator.
/// A host communicator gathers the hashes in host memory; a device communicator gathers them through
/// memory policy `mem` (run::check_plan_agreement's overload with a memory policy). Throws mismatch_error on
/// every rank when the ranks' schedules differ, naming the disagreeing ranks and the majority hash. Cost:
/// one all-gather of 8 bytes per rank plus hashing the schedule.
template <comm::communicator C, model::memory_policy M>
void check_schedule_agreement(C& c, M& mem, const pipeline::schedule& s, std::string_view what) {
  check_plan_agreement(c, std::as_const(mem), s, what);
}

}  // namespace detail

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
/// stage_functions<T> (std::function members) or stage_calls<T, ...> (the callables' own types, no type
/// erasure); Sizes: activation_sizes, sizes_of<...> or any type with `output(stage, mb)` and
/// `encoder_output(shard, mb)` members. With `transfer_cpu_seconds`, adds to it the calling thread's CPU
/// time in the SEND/RECV actions (the bytes on the wire, apart from the executor's own bookkeeping).
/// Cost: the callables plus one send or receive per cross-rank transfer, one fill per produced buffer and,
/// on stage 0 with several encoder shards, one copy of its input and of its input gradient.
template <comm::communicator C, class Calls, class Sizes = activation_sizes, model::memory_policy M>
void execute_pipeline(C& c, const pipeline::schedule& s, Calls&& fn, const Sizes& sizes, M& mem,
                      std::vector<pipeline::timed_action>* timeline = nullptr,
                      double* transfer_cpu_seconds = nullptr) {
  using T = typename std::remove_cvref_t<Calls>::value_type;
  static_assert(std::remove_cvref_t<C>::memory == M::space,
                "run::execute_pipeline: a device communicator needs a device memory policy, and a host "
                "communicator a host one (M::space == C::memory): model::emulated_device_memory or "
                "cuda::device_memory over a device communicator, model::host_memory (or no policy) over a "
                "host communicator");
  using buffer = typename M::template buffer<T>;
  const int rank = c.rank();
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  if (c.size() != s.total_ranks())
    throw_error<invalid_argument>(
        "pipeline execute({}): communicator of {} ranks; expected the schedule's {} ranks", s.name, c.size(),
        s.total_ranks());
  if constexpr (assertion_enabled(assertion_level::collective))  // every rank runs the same schedule
    detail::check_schedule_agreement(c, mem, s, "pipeline schedule");
  if (!detail::is_set(sizes.output) && s.num_stages > 1)
    throw_error<invalid_argument>(
        "pipeline execute({}): activation_sizes.output is empty; expected the plan's sizes", s.name);
  {  // a schedule whose data crosses ranks must carry its SEND/RECV actions
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
    if (crosses && !any_comm)
      throw_error<invalid_argument>(
          "pipeline execute({}): the schedule has no SEND/RECV actions but data crosses ranks; "
          "expected a lowered schedule (add_send_recv)",
          s.name);
  }
  const int S = s.num_stages, E = s.num_encoder_shards();
  if (s.num_microbatches > 0 && std::max(S, E) > 0)  // the largest tag: every rank refuses before sending
    (void)detail::pipeline_tag(s, std::max(S, E) - 1, s.num_microbatches - 1, 3);
  using key = std::pair<int, int>;
  std::map<key, buffer> act_in, act_out, grad_in, grad_out, enc_in, enc_out, enc_grad, enc_grad_out;
  auto out_size = [&](int stage, int mb) -> std::size_t {
    const std::int64_t n = sizes.output(stage, mb);
    if (n < 0)
      throw_error<invalid_argument>(
          "pipeline execute({}): output size {} for stage {} micro-batch {}; expected >= 0", s.name, n, stage,
          mb);
    return static_cast<std::size_t>(n);
  };
  auto enc_size = [&](int e, int mb) -> std::size_t {
    if (!detail::is_set(sizes.encoder_output))
      throw_error<invalid_argument>(
          "pipeline execute({}): the schedule has encoder shards but "
          "activation_sizes.encoder_output is empty",
          s.name);
    if constexpr (requires { sizes.encoder_output(e, mb); })
      return static_cast<std::size_t>(sizes.encoder_output(e, mb));
    else
      return std::size_t{0};  // unreachable: is_set(no_call) is false
  };
  // A buffer of n elements in M's memory: zero-filled (`zeroed`, for what a callable writes) or as
  // allocated (for what a receive or a copy overwrites whole).
  auto make = [&](std::size_t n, bool zeroed) {
    buffer b;
    b.resize(n);
    if (zeroed && n > 0) mem.fill(b.span(), T(0));
    return b;
  };
  auto view = [](buffer& b) { return std::span<const T>(b.span()); };
  auto take = [&](std::map<key, buffer>& m, key k, const pipeline::action& a, const char* what) {
    auto it = m.find(k);
    if (it == m.end())
      throw_error<invalid_argument>(
          "pipeline execute({}): rank {} action `{}` finds no {} (stage/shard {}, micro-batch "
          "{}); expected it produced or received earlier in the list",
          s.name, rank, pipeline::to_text(a), what, k.first, k.second);
    buffer v = std::move(it->second);
    m.erase(it);
    return v;
  };
  auto need = [&](const auto& f, const pipeline::action& a, const char* name) {
    if (!detail::is_set(f))
      throw_error<invalid_argument>(
          "pipeline execute({}): rank {} runs `{}` but the stage callables' {} is empty", s.name, rank,
          pipeline::to_text(a), name);
  };
  // Calls a callable `need` has accepted (a no_call member is never reached at run time).
  auto call = [](auto& f, auto&&... args) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(f)>, no_call>)
      f(std::forward<decltype(args)>(args)...);
  };
  // An overlapped forward-backward (OVERLAP_F_B) runs as PyTorch's runtime runs it: its forward half,
  // then its backward half, each with its own timeline entry. `steps` pairs each part with its action.
  std::vector<std::pair<pipeline::action, pipeline::action>> steps;
  for (const pipeline::action& whole : s.ranks.at(static_cast<std::size_t>(rank)))
    for (const pipeline::action& part : pipeline::parts(whole)) steps.emplace_back(part, whole);
  for (const auto& step : steps) {
    const pipeline::action& a = step.first;
    const int mb = a.microbatch;
    const double start = timeline != nullptr ? seconds() : 0.0;
    const bool timed_transfer = transfer_cpu_seconds != nullptr && pipeline::is_comm(a.type);
    const double cpu_start = timed_transfer ? thread_cpu_seconds() : 0.0;
    try {
      switch (a.type) {
        case pipeline::action_type::forward: {
          need(fn.forward, a, "forward");
          buffer in;
          if (a.stage > 0) {
            in = take(act_in, {a.stage, mb}, a, "input activation");
          } else if (E == 1) {
            in = take(enc_in, {0, mb}, a, "encoder output");
          } else if (E > 1) {  // the shards' outputs in shard order, joined on M
            std::vector<buffer> shard_outs;
            std::size_t total = 0;
            for (int e = 0; e < E; ++e) {
              shard_outs.push_back(take(enc_in, {e, mb}, a, "encoder output"));
              total += shard_outs.back().size();
            }
            in = make(total, false);
            std::size_t off = 0;
            for (auto& part : shard_outs) {
              mem.copy(in.span().subspan(off, part.size()), view(part));
              off += part.size();
            }
          }
          buffer out = make(a.stage + 1 < S ? out_size(a.stage, mb) : 0, true);
          call(fn.forward, a.stage, mb, view(in), out.span());
          if (a.stage + 1 < S) {
            if (s.rank_of_stage(a.stage + 1) == rank)
              act_in[{a.stage + 1, mb}] = std::move(out);
            else
              act_out[{a.stage, mb}] = std::move(out);
          }
          break;
        }
        case pipeline::action_type::backward:
        case pipeline::action_type::backward_input: {
          const bool full = a.type == pipeline::action_type::backward;
          if (full)
            need(fn.backward, a, "backward");
          else
            need(fn.backward_input, a, "backward_input");
          buffer gout;
          if (a.stage + 1 < S) gout = take(grad_in, {a.stage, mb}, a, "output gradient");
          std::size_t gin_size = 0;
          if (a.stage > 0)
            gin_size = out_size(a.stage - 1, mb);
          else
            for (int e = 0; e < E; ++e) gin_size += enc_size(e, mb);
          buffer gin = make(gin_size, true);
          if (full)
            call(fn.backward, a.stage, mb, view(gout), gin.span());
          else
            call(fn.backward_input, a.stage, mb, view(gout), gin.span());
          auto deliver_shard = [&](int e, buffer slice) {
            if (s.encoder_shard_to_rank[static_cast<std::size_t>(e)] == rank)
              enc_grad[{e, mb}] = std::move(slice);
            else
              enc_grad_out[{e, mb}] = std::move(slice);
          };
          if (a.stage > 0) {
            if (s.rank_of_stage(a.stage - 1) == rank)
              grad_in[{a.stage - 1, mb}] = std::move(gin);
            else
              grad_out[{a.stage, mb}] = std::move(gin);
          } else if (E == 1) {
            deliver_shard(0, std::move(gin));
          } else {  // split into the encoder shards' slices, on M
            std::size_t off = 0;
            for (int e = 0; e < E; ++e) {
              const std::size_t n = enc_size(e, mb);
              buffer slice = make(n, false);
              mem.copy(slice.span(), view(gin).subspan(off, n));
              off += n;
              deliver_shard(e, std::move(slice));
            }
          }
          break;
        }
        case pipeline::action_type::backward_weight:
          need(fn.backward_weight, a, "backward_weight");
          call(fn.backward_weight, a.stage, mb);
          break;
        case pipeline::action_type::reduce_grad:
          if (detail::is_set(fn.reduce_grad)) call(fn.reduce_grad, a.stage);
          break;
        case pipeline::action_type::encoder_forward: {
          need(fn.encoder_forward, a, "encoder_forward");
          buffer out = make(enc_size(a.stage, mb), true);
          call(fn.encoder_forward, a.stage, mb, out.span());
          if (s.rank_of_stage(0) == rank)
            enc_in[{a.stage, mb}] = std::move(out);
          else
            enc_out[{a.stage, mb}] = std::move(out);
          break;
        }
        case pipeline::action_type::encoder_backward: {
          need(fn.encoder_backward, a, "encoder_backward");
          auto g = take(enc_grad, {a.stage, mb}, a, "embedding gradient");
          call(fn.encoder_backward, a.stage, mb, view(g));
          break;
        }
        case pipeline::action_type::send_f: {
          auto buf = take(act_out, {a.stage, mb}, a, "output activation to send");
          comm::send(c, view(buf), s.rank_of_stage(a.stage + 1), detail::pipeline_tag(s, a.stage, mb, 0));
          break;
        }
        case pipeline::action_type::recv_f: {
          buffer buf = make(out_size(a.stage - 1, mb), false);
          comm::recv(c, buf.span(), s.rank_of_stage(a.stage - 1),
                     detail::pipeline_tag(s, a.stage - 1, mb, 0));
          act_in[{a.stage, mb}] = std::move(buf);
          break;
        }
        case pipeline::action_type::send_b: {
          auto buf = take(grad_out, {a.stage, mb}, a, "input gradient to send");
          comm::send(c, view(buf), s.rank_of_stage(a.stage - 1), detail::pipeline_tag(s, a.stage, mb, 1));
          break;
        }
        case pipeline::action_type::recv_b: {
          buffer buf = make(out_size(a.stage, mb), false);
          comm::recv(c, buf.span(), s.rank_of_stage(a.stage + 1),
                     detail::pipeline_tag(s, a.stage + 1, mb, 1));
          grad_in[{a.stage, mb}] = std::move(buf);
          break;
        }
        case pipeline::action_type::send_ef: {
          auto buf = take(enc_out, {a.stage, mb}, a, "encoder output to send");
          comm::send(c, view(buf), s.rank_of_stage(0), detail::pipeline_tag(s, a.stage, mb, 2));
          break;
        }
        case pipeline::action_type::recv_ef: {
          buffer buf = make(enc_size(a.stage, mb), false);
          comm::recv(c, buf.span(), s.encoder_shard_to_rank[static_cast<std::size_t>(a.stage)],
                     detail::pipeline_tag(s, a.stage, mb, 2));
          enc_in[{a.stage, mb}] = std::move(buf);
          break;
        }
        case pipeline::action_type::send_eb: {
          auto buf = take(enc_grad_out, {a.stage, mb}, a, "embedding gradient to send");
          comm::send(c, view(buf), s.encoder_shard_to_rank[static_cast<std::size_t>(a.stage)],
                     detail::pipeline_tag(s, a.stage, mb, 3));
          break;
        }
        case pipeline::action_type::recv_eb: {
          buffer buf = make(enc_size(a.stage, mb), false);
          comm::recv(c, buf.span(), s.rank_of_stage(0), detail::pipeline_tag(s, a.stage, mb, 3));
          enc_grad[{a.stage, mb}] = std::move(buf);
          break;
        }
        case pipeline::action_type::overlap_f_b:
          break;  // never reached: parts() split it into its F and B halves
      }
    } catch (error& e) {
      e.add_context(
          hetmesh::format("pipeline execute({}) rank {} action `{}`{}", s.name, rank, pipeline::to_text(a),
                          step.second == a ? std::string() : " of `" + pipeline::to_text(step.second) + "`"));
      throw;
    }
    if (timed_transfer) *transfer_cpu_seconds += thread_cpu_seconds() - cpu_start;
    if (timeline != nullptr) timeline->push_back(pipeline::timed_action{rank, a, start, seconds()});
  }
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

}  // namespace hetmesh::run
