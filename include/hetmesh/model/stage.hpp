// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the stages a user supplies. An encoder stage (vision, audio, video: each its own type)
// encodes the items of an encoder micro-batch; a backbone stage is one pipeline stage of the LLM; a
// split-backward stage also splits its backward into the input gradient (I) and the weight gradient (W),
// which the zero-bubble schedules need. The library sizes every buffer from the plan, asking the stage
// how many elements its output has for a micro-batch view; stages never allocate the buffers they
// exchange. Parameters and gradients are ranges of spans, so the runtime reduces and updates them
// without knowing the layers. Each concept is opt-in (a tag type) besides its structural requirements,
// and has a check_* function whose static_asserts name the requirement a type misses.
#pragma once

#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "activation.hpp"
#include "context.hpp"
#include "encoder_batch.hpp"
#include "micro_batch.hpp"
#include "token_mixing.hpp"

namespace hetmesh::model {

/// Opt-in for encoder_stage: an encoder declares `using is_encoder_stage = void;`.
template <class S>
inline constexpr bool enable_encoder_stage = requires {
  typename S::is_encoder_stage;
};

/// Opt-in for backbone_stage: a backbone stage declares `using is_backbone_stage = void;`.
template <class S>
inline constexpr bool enable_backbone_stage = requires {
  typename S::is_backbone_stage;
};

/// A range whose elements convert to std::span<T>: how stages expose parameters and gradients
/// (a std::vector<std::span<T>>, a std::array of them, a view over the layers' tensors).
template <class R, class T>
concept span_range =
    std::ranges::input_range<R> && std::convertible_to<std::ranges::range_reference_t<R>, std::span<T>>;

/// A stage's parameters and gradients, as the runtime reduces and updates them. Requirements:
///  1. `s.parameters()` -> a span_range<T>: the stage's parameter tensors;
///  2. `s.gradients()` -> a span_range<T>: their gradients, in the same order and of the same sizes;
///     backward (or backward_weight) adds into them, the runtime zeroes them between steps.
template <class S, class T>
concept stage_parameters = requires(S& s) {
  { s.parameters() } -> span_range<T>;
  { s.gradients() } -> span_range<T>;
};

namespace detail {
template <class S>
concept declares_modality = requires {
  { S::modality } -> std::convertible_to<std::string_view>;
};
template <class S, class V>
concept sizes_output = requires(const S& s, const V& v) {
  { s.output_size(v) } -> std::convertible_to<std::int64_t>;
};
template <class S, class V>
concept sizes_input = requires(const S& s, const V& v) {
  { s.input_size(v) } -> std::convertible_to<std::int64_t>;
};
template <class S, class T, class Ctx, class V>
concept runs_forward = requires(S& s, Ctx& ctx, const V& v, std::span<const T> in, std::span<T> out) {
  s.forward(ctx, v, in, out);
};
template <class S>
concept declares_heads = requires(const S& s) {
  { s.attention_heads() } -> std::convertible_to<int>;
};
template <class S, class T, class Ctx, class V>
concept runs_backward = requires(S& s, Ctx& ctx, const V& v, std::span<const T> gout, std::span<T> gin) {
  s.backward(ctx, v, gout, gin);
};
template <class S, class T, class Ctx, class V>
concept runs_backward_input = requires(S& s, Ctx& ctx, const V& v, std::span<const T> gout,
                                       std::span<T> gin) {
  s.backward_input(ctx, v, gout, gin);
};
template <class S, class Ctx, class V>
concept runs_backward_weight = requires(S& s, Ctx& ctx, const V& v) {
  s.backward_weight(ctx, v);
};
}  // namespace detail

/// An encoder stage for element type T, called with a context of type Ctx (default: any communicator and
/// a host activation store). Each encoder of a model (vision, audio, video) is its own type.
/// Requirements:
///  1. opt-in: `typename S::is_encoder_stage` (`enable_encoder_stage<S>`);
///  2. `S::modality` converts to std::string_view and names the encoder ("vision", "audio", ...);
///  3. `s.input_size(ev)` and `s.output_size(ev)` on a const stage, for a `const encoder_batch_view&`,
///     return the element counts (std::int64_t) of its input and output buffers for that micro-batch;
///  4. `s.forward(ctx, ev, in, out)` with `Ctx&`, `const encoder_batch_view&`, `std::span<const T>` of
///     input_size(ev) and `std::span<T>` of output_size(ev): writes every element of out;
///  5. `s.backward(ctx, ev, grad_out, grad_in)`: given the gradient of its output, writes the gradient of
///     its input (grad_in may be empty: raw inputs need none) and adds its weight gradients;
///  6. `stage_parameters<S, T>`: parameters() and gradients() are ranges of std::span<T>;
///  7. forward and backward are deterministic, and what forward saves for backward goes through the
///     context's activation slots (the runtime frees them), not into the stage;
///  8. `s.attention_heads()` on a const stage returns (int) the heads its attention splits over: long-short
///     SP (train::system) splits an item only over groups whose size divides them; 0 for an encoder that
///     mixes no tokens of an item across ranks (any split works). The library has no default for it.
template <class S, class T, class Ctx = default_stage_context<T>>
concept encoder_stage = enable_encoder_stage<std::remove_cvref_t<S>> && detail::declares_modality<S> &&
    detail::declares_heads<S> && detail::sizes_input<S, encoder_batch_view> &&
    detail::sizes_output<S, encoder_batch_view> && detail::runs_forward<S, T, Ctx, encoder_batch_view> &&
    detail::runs_backward<S, T, Ctx, encoder_batch_view> && stage_parameters<S, T>;

/// A backbone (LLM) pipeline stage for element type T, called with a context of type Ctx.
/// Requirements:
///  1. opt-in: `typename S::is_backbone_stage` (`enable_backbone_stage<S>`);
///  2. `s.output_size(mb)` on a const stage, for a `const micro_batch_view&`, returns the element count
///     (std::int64_t) of its output for that micro-batch (stage k+1's input; the first stage's input is
///     the encoder outputs landed in mb; the last stage's output is its loss terms);
///  3. `s.forward(ctx, mb, in, out)` with `Ctx&`, `const micro_batch_view&`, `std::span<const T>` and
///     `std::span<T>` of output_size(mb): writes every element of out;
///  4. `s.backward(ctx, mb, grad_out, grad_in)`: writes the gradient of its input and adds its weight
///     gradients (the last stage gets an empty grad_out and scales its loss by mb.loss_weights and
///     mb.step_targets itself);
///  5. `stage_parameters<S, T>`;
///  6. deterministic, with saved tensors in the context's activation slots (as encoder_stage 7).
/// Optional, used when present:
///  - `s.output_size(mb, stage)` on a const stage, with `const micro_batch_view&` and the pipeline stage
///    index (int, 0-based over the whole pipeline), returns the element count of its output at that
///    stage: for a stage type whose output differs by pipeline stage (the last stage's loss terms, a
///    projection on one stage). The runtime sizes buffers through stage_output_size, which prefers it to
///    requirement 2's one-argument form (sizes_output_per_stage).
///  - `static constexpr model::token_mixing token_mixing` (model/token_mixing.hpp): how the stage mixes
///    tokens across positions (model::through_attention, model::causal_halo(k) with ctx.halo, or
///    model::token_local). train::system requires it under a partition family that may split a document
///    over ranks (train/sequence_split.hpp): nothing else tells a token shift from an MLP.
/// The context a stage's attention calls need is model::attention_context (model/attention_context.hpp);
/// its halo calls, model::halo_context (model/token_mixing.hpp).
template <class S, class T, class Ctx = default_stage_context<T>>
concept backbone_stage = enable_backbone_stage<std::remove_cvref_t<S>> &&
    detail::sizes_output<S, micro_batch_view> && detail::runs_forward<S, T, Ctx, micro_batch_view> &&
    detail::runs_backward<S, T, Ctx, micro_batch_view> && stage_parameters<S, T>;

/// A backbone stage whose backward splits in two, for the zero-bubble schedules (ZB-H1, ZBV), which run
/// a micro-batch's input gradient (I) early and its weight gradient (W) in a bubble. Requirements:
///  1. `backbone_stage<S, T, Ctx>`;
///  2. `s.backward_input(ctx, mb, grad_out, grad_in)`: writes the gradient of its input only, keeping what
///     W needs in the context's activation slots;
///  3. `s.backward_weight(ctx, mb)`: adds the weight gradients of a micro-batch whose backward_input ran;
///  4. backward_input then backward_weight adds the same gradients as backward (up to rounding).
template <class S, class T, class Ctx = default_stage_context<T>>
concept split_backward_stage =
    backbone_stage<S, T, Ctx> && detail::runs_backward_input<S, T, Ctx, micro_batch_view> &&
    detail::runs_backward_weight<S, Ctx, micro_batch_view>;

/// Checks `encoder_stage<S, T, Ctx>` requirement by requirement: each one S misses fails a static_assert
/// that names it and says what to write. Returns true (so `static_assert(check_encoder_stage<S, T>())`).
template <class S, class T, class Ctx = default_stage_context<T>>
consteval bool check_encoder_stage() {
  static_assert(
      enable_encoder_stage<std::remove_cvref_t<S>>,
      "encoder_stage requirement 1: the encoder type must opt in with `using is_encoder_stage = void;`");
  static_assert(detail::declares_modality<S>,
                "encoder_stage requirement 2: the encoder type must name its modality: `static constexpr "
                "std::string_view modality = \"vision\";`");
  static_assert(
      detail::sizes_input<S, encoder_batch_view>,
      "encoder_stage requirement 3: missing `std::int64_t input_size(const encoder_batch_view&) const`");
  static_assert(
      detail::sizes_output<S, encoder_batch_view>,
      "encoder_stage requirement 3: missing `std::int64_t output_size(const encoder_batch_view&) const`");
  static_assert(
      detail::runs_forward<S, T, Ctx, encoder_batch_view>,
      "encoder_stage requirement 4: missing `forward(ctx, const encoder_batch_view&, std::span<const T> "
      "input, std::span<T> output)`");
  static_assert(
      detail::runs_backward<S, T, Ctx, encoder_batch_view>,
      "encoder_stage requirement 5: missing `backward(ctx, const encoder_batch_view&, std::span<const T> "
      "grad_output, std::span<T> grad_input)`");
  static_assert(stage_parameters<S, T>,
                "encoder_stage requirement 6: missing `parameters()` and `gradients()` returning ranges of "
                "std::span<T>");
  static_assert(detail::declares_heads<S>,
                "encoder_stage requirement 8: missing `int attention_heads() const`: the heads the encoder's "
                "attention splits over (0 when it mixes no tokens across ranks), which long-short SP's "
                "groups must divide");
  return true;
}

/// Checks `backbone_stage<S, T, Ctx>` requirement by requirement, as check_encoder_stage does.
template <class S, class T, class Ctx = default_stage_context<T>>
consteval bool check_backbone_stage() {
  static_assert(
      enable_backbone_stage<std::remove_cvref_t<S>>,
      "backbone_stage requirement 1: the stage type must opt in with `using is_backbone_stage = void;`");
  static_assert(
      detail::sizes_output<S, micro_batch_view>,
      "backbone_stage requirement 2: missing `std::int64_t output_size(const micro_batch_view&) const`");
  static_assert(
      detail::runs_forward<S, T, Ctx, micro_batch_view>,
      "backbone_stage requirement 3: missing `forward(ctx, const micro_batch_view&, std::span<const T> "
      "input, std::span<T> output)`");
  static_assert(
      detail::runs_backward<S, T, Ctx, micro_batch_view>,
      "backbone_stage requirement 4: missing `backward(ctx, const micro_batch_view&, std::span<const T> "
      "grad_output, std::span<T> grad_input)`");
  static_assert(stage_parameters<S, T>,
                "backbone_stage requirement 5: missing `parameters()` and `gradients()` returning ranges of "
                "std::span<T>");
  return true;
}

/// Checks `split_backward_stage<S, T, Ctx>`: backbone_stage first, then the split. A zero-bubble schedule
/// calls this, so a stage without split backward fails at compile time with these messages.
template <class S, class T, class Ctx = default_stage_context<T>>
consteval bool check_split_backward_stage() {
  static_assert(
      backbone_stage<S, T, Ctx>,
      "split_backward_stage requirement 1: the stage must be a backbone_stage (see check_backbone_stage)");
  static_assert(detail::runs_backward_input<S, T, Ctx, micro_batch_view>,
                "split_backward_stage requirement 2: zero-bubble schedules need `backward_input(ctx, const "
                "micro_batch_view&, std::span<const T> grad_output, std::span<T> grad_input)`");
  static_assert(detail::runs_backward_weight<S, Ctx, micro_batch_view>,
                "split_backward_stage requirement 3: zero-bubble schedules need `backward_weight(ctx, const "
                "micro_batch_view&)`");
  return true;
}

/// Whether stage type S sizes its output per pipeline stage (backbone_stage's optional member):
/// `s.output_size(mb, stage)` on a const S, for a `const micro_batch_view&` and an int stage index, returns
/// an element count convertible to std::int64_t.
template <class S>
concept sizes_output_per_stage = requires(const S& s, const micro_batch_view& mb, int stage) {
  { s.output_size(mb, stage) } -> std::convertible_to<std::int64_t>;
};

/// The element count of stage s's output for micro-batch mb at pipeline stage `stage`: `s.output_size(mb,
/// stage)` when S has it (sizes_output_per_stage), else `s.output_size(mb)` (backbone_stage requirement
/// 2). The one place the runtime asks a backbone stage for a buffer size. Pre: S has one of the two forms
/// (a compile-time error otherwise). Cost: the stage's output_size.
template <class S>
requires sizes_output_per_stage<S> || detail::sizes_output<S, micro_batch_view>
[[nodiscard]] std::int64_t stage_output_size(const S& s, const micro_batch_view& mb, int stage) {
  if constexpr (sizes_output_per_stage<S>)
    return static_cast<std::int64_t>(s.output_size(mb, stage));
  else
    return static_cast<std::int64_t>(s.output_size(mb));
}

/// The element counts of each stage's output for one micro-batch, in stage order: the buffers the runtime
/// allocates for a pipeline of backbone stages. Pre: every stage is a backbone_stage. O(stages).
// clang-format off
template <class T, class... Stages>
  requires(backbone_stage<Stages, T> && ...)
[[nodiscard]] std::vector<std::int64_t> output_sizes(const micro_batch_view& mb, const Stages&... stages) {
  return {static_cast<std::int64_t>(stages.output_size(mb))...};
}
// clang-format on

// ---- models -------------------------------------------------------------------------------------------
// Two small stages, used by the static_asserts below, by the tests, and as examples of the concepts: each
// scales its input per feature by a learned weight, over [tokens][width] buffers, saving its input in
// the context's activation slots.

namespace detail {
/// y[t][h] = w[h] x[t][h]; dx = w dy; dw[h] += sum_t dy[t][h] x[t][h].
template <class T>
struct feature_scale {
  std::int64_t width = 1;
  std::vector<T> weight;
  std::vector<T> grad;

  explicit feature_scale(std::int64_t w, T init)
      : width(w), weight(static_cast<std::size_t>(w), init), grad(static_cast<std::size_t>(w), T(0)) {}
  void forward(std::span<const T> x, std::span<T> y) const {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = weight[i % weight.size()] * x[i];
  }
  void input_grad(std::span<const T> dy, std::span<T> dx) const {
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = weight[i % weight.size()] * dy[i];
  }
  void weight_grad(std::span<const T> dy, std::span<const T> x) {
    for (std::size_t i = 0; i < dy.size(); ++i) grad[i % grad.size()] += dy[i] * x[i];
  }
  void check(std::span<const T> a, std::int64_t expected, const char* what) const {
    if (static_cast<std::int64_t>(a.size()) != expected)
      throw_error<invalid_argument>("feature scale stage: {} has {} elements; expected {}", what, a.size(),
                                    expected);
  }
};
}  // namespace detail

/// A model of encoder_stage: scales each feature of its [tokens][width] input by a learned weight. Its
/// modality is a template argument, so one program can hold several encoders of distinct types.
template <class T, class Modality>
struct scale_encoder {
  /// Opt-in for encoder_stage.
  using is_encoder_stage = void;
  /// The encoder's modality, from the Modality tag type's `name`.
  static constexpr std::string_view modality = Modality::name;

  /// An encoder of `width` features with every weight `init`.
  explicit scale_encoder(std::int64_t width, T init = T(1)) : impl_(width, init) {}
  /// ev.size() tokens of `width` features.
  [[nodiscard]] std::int64_t input_size(const encoder_batch_view& ev) const noexcept {
    return ev.size() * impl_.width;
  }
  /// ev.size() tokens of `width` features.
  [[nodiscard]] std::int64_t output_size(const encoder_batch_view& ev) const noexcept {
    return ev.size() * impl_.width;
  }
  /// out = w * in; saves in as slot tensor 0. Throws invalid_argument on mis-sized buffers.
  template <class Ctx>
  void forward(const Ctx& ctx, const encoder_batch_view& ev, std::span<const T> in, std::span<T> out) {
    impl_.check(in, input_size(ev), "input");
    impl_.check(out, output_size(ev), "output");
    ctx.slots().save(0, in);
    impl_.forward(in, out);
  }
  /// grad_in = w * grad_out (when not empty); grad_w += grad_out * in; releases the slot.
  template <class Ctx>
  void backward(const Ctx& ctx, const encoder_batch_view& ev, std::span<const T> gout, std::span<T> gin) {
    impl_.check(gout, output_size(ev), "grad_output");
    const auto slot = ctx.slots();
    if (!gin.empty()) impl_.input_grad(gout, gin);
    impl_.weight_grad(gout, slot.load(0));
    slot.release(0);
  }
  /// 0: it scales each token alone, so any split of an item works.
  [[nodiscard]] static constexpr int attention_heads() noexcept { return 0; }
  /// The weight, as one span.
  [[nodiscard]] std::vector<std::span<T>> parameters() { return {std::span<T>(impl_.weight)}; }
  /// Its gradient, as one span.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return {std::span<T>(impl_.grad)}; }

 private:
  detail::feature_scale<T> impl_;
};

/// Modality tag of the test and example vision encoder.
struct vision_modality {
  static constexpr std::string_view name = "vision";  ///< the modality's name
};
/// Modality tag of the test and example audio encoder.
struct audio_modality {
  static constexpr std::string_view name = "audio";  ///< the modality's name
};

static_assert(encoder_stage<scale_encoder<float, vision_modality>, float>);
static_assert(encoder_stage<scale_encoder<double, audio_modality>, double>);
static_assert(check_encoder_stage<scale_encoder<double, vision_modality>, double>());

/// A model of backbone_stage and split_backward_stage: scales each feature of the micro-batch's
/// [tokens][width] activations by a learned weight.
template <class T>
struct scale_stage {
  /// Opt-in for backbone_stage.
  using is_backbone_stage = void;

  /// A stage of `width` features with every weight `init`.
  explicit scale_stage(std::int64_t width, T init = T(1)) : impl_(width, init) {}
  /// mb.size() tokens of `width` features.
  [[nodiscard]] std::int64_t output_size(const micro_batch_view& mb) const noexcept {
    return mb.size() * impl_.width;
  }
  /// out = w * in; saves in as slot tensor 0. Throws invalid_argument on mis-sized buffers.
  template <class Ctx>
  void forward(const Ctx& ctx, const micro_batch_view& mb, std::span<const T> in, std::span<T> out) {
    impl_.check(in, output_size(mb), "input");
    impl_.check(out, output_size(mb), "output");
    ctx.slots().save(0, in);
    impl_.forward(in, out);
  }
  /// Full backward: backward_input then backward_weight.
  template <class Ctx>
  void backward(const Ctx& ctx, const micro_batch_view& mb, std::span<const T> gout, std::span<T> gin) {
    backward_input(ctx, mb, gout, gin);
    backward_weight(ctx, mb);
  }
  /// grad_in = w * grad_out; saves grad_out as slot tensor 1 for backward_weight.
  template <class Ctx>
  void backward_input(const Ctx& ctx, const micro_batch_view& mb, std::span<const T> gout, std::span<T> gin) {
    impl_.check(gout, output_size(mb), "grad_output");
    impl_.check(gin, output_size(mb), "grad_input");
    impl_.input_grad(gout, gin);
    ctx.slots().save(1, gout);
  }
  /// grad_w += saved grad_out * saved input; releases both slots.
  template <class Ctx>
  void backward_weight(const Ctx& ctx, const micro_batch_view&) {
    const auto slot = ctx.slots();
    impl_.weight_grad(slot.load(1), slot.load(0));
    slot.release(0);
    slot.release(1);
  }
  /// The weight, as one span.
  [[nodiscard]] std::vector<std::span<T>> parameters() { return {std::span<T>(impl_.weight)}; }
  /// Its gradient, as one span.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return {std::span<T>(impl_.grad)}; }

 private:
  detail::feature_scale<T> impl_;
};

static_assert(backbone_stage<scale_stage<float>, float>);
static_assert(split_backward_stage<scale_stage<double>, double>);
static_assert(check_split_backward_stage<scale_stage<double>, double>());
// The opt-in keeps families apart: a backbone stage is no encoder, and an encoder no backbone stage.
static_assert(!encoder_stage<scale_stage<float>, float>);
static_assert(!backbone_stage<scale_encoder<float, vision_modality>, float>);

}  // namespace hetmesh::model
