// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: what the pipeline executor calls back -- the user's stage callables and the plan's buffer
// sizes -- in the three forms a caller may hold them: owning (stage_functions, activation_sizes:
// std::function members, for code that assigns callables one by one), typed (stage_calls, sizes_of: the
// callables' own types, e.g. a trainer's lambdas) and by reference (pipeline_calls: function_ref members,
// what the executor itself takes, so that its body depends only on the communicator, element and memory types
// and can be compiled once; see run/pipeline_executor.hpp). pipeline_calls_of turns either of the first two
// into the third without copying or allocating.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>

#include "../core/function_ref.hpp"

namespace hetmesh::run {

/// The user's stage callables, owned (std::function members; see stage_calls for the callables' own types
/// and pipeline_calls for references). `forward` and one of `backward` / (`backward_input` and
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

/// A callable a stage_calls or sizes_of leaves out: the executor refuses a schedule whose actions need it.
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

/// Element counts from the plan, owned. `output(stage, mb)`: stage's forward output for mb (= stage+1's
/// input); `encoder_output(shard, mb)`: one shard's encoder output for mb.
struct activation_sizes {
  std::function<std::int64_t(int, int)> output{};          ///< output(stage, mb)
  std::function<std::int64_t(int, int)> encoder_output{};  ///< encoder_output(shard, mb)
};

/// What the executor calls, by reference (function_ref: no ownership, no allocation, one indirect call per
/// call): the stage callables and the plan's sizes. An empty member is a callable the caller left out (the
/// executor refuses a schedule whose actions need it; reduce_grad may always be empty). Every referenced
/// callable must outlive the executor's call. Built from stage_functions / stage_calls and activation_sizes /
/// sizes_of by pipeline_calls_of, or member by member.
template <class T>
struct pipeline_calls {
  using value_type = T;  ///< the activations' element type
  /// forward(stage, mb, input, output)
  function_ref<void(int, int, std::span<const T>, std::span<T>)> forward{};
  /// backward(stage, mb, grad_output, grad_input): full backward; accumulates weight gradients.
  function_ref<void(int, int, std::span<const T>, std::span<T>)> backward{};
  /// backward_input(stage, mb, grad_output, grad_input): input gradient only (zero-bubble I).
  function_ref<void(int, int, std::span<const T>, std::span<T>)> backward_input{};
  /// backward_weight(stage, mb): weight gradient of a micro-batch whose I has run (zero-bubble W).
  function_ref<void(int, int)> backward_weight{};
  /// reduce_grad(stage): data-parallel gradient reduction of a finished stage (optional).
  function_ref<void(int)> reduce_grad{};
  /// encoder_forward(shard, mb, output)
  function_ref<void(int, int, std::span<T>)> encoder_forward{};
  /// encoder_backward(shard, mb, grad_output): the gradient pass of encoder_forward.
  function_ref<void(int, int, std::span<const T>)> encoder_backward{};
  /// output_size(stage, mb): elements of stage's forward output for mb (= stage+1's input); >= 0.
  function_ref<std::int64_t(int, int)> output_size{};
  /// encoder_output_size(shard, mb): elements of one encoder shard's output for mb; >= 0.
  function_ref<std::int64_t(int, int)> encoder_output_size{};
};

namespace detail {

/// `ref` set to refer to `f`, unless f is no_call or an empty std::function (then `ref` stays empty).
template <class Ref, class F>
void refer(Ref& ref, F& f) {
  if constexpr (!std::is_same_v<std::remove_cv_t<F>, no_call>) {
    if constexpr (requires { static_cast<bool>(f); }) {
      if (!static_cast<bool>(f)) return;
    }
    ref = Ref(f);
  }
}

}  // namespace detail

/// References to the members of `calls` (stage_functions<T>, stage_calls<T, ...> or any type with their
/// members and value_type) and of `sizes` (activation_sizes, sizes_of<...> or any type with `output` and
/// `encoder_output` members), for the executor. A no_call member or an empty std::function gives an empty
/// reference. `calls` and `sizes` must outlive the result's use (they are referred to, not copied). Cost:
/// none beyond storing 18 pointers.
template <class Calls, class Sizes>
[[nodiscard]] pipeline_calls<typename std::remove_cv_t<Calls>::value_type> pipeline_calls_of(Calls& calls,
                                                                                             Sizes& sizes) {
  pipeline_calls<typename std::remove_cv_t<Calls>::value_type> r;
  detail::refer(r.forward, calls.forward);
  detail::refer(r.backward, calls.backward);
  detail::refer(r.backward_input, calls.backward_input);
  detail::refer(r.backward_weight, calls.backward_weight);
  detail::refer(r.reduce_grad, calls.reduce_grad);
  detail::refer(r.encoder_forward, calls.encoder_forward);
  detail::refer(r.encoder_backward, calls.encoder_backward);
  detail::refer(r.output_size, sizes.output);
  detail::refer(r.encoder_output_size, sizes.encoder_output);
  return r;
}

}  // namespace hetmesh::run
