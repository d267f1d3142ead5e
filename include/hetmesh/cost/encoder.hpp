// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: compute of encoder items and of mixture-of-experts layers. An encoder item (an image,
// a video frame, an audio clip) attends fully within itself (bidirectional, no causal halving) or, for
// audio encoders, within fixed windows of frames; items never attend to each other, so a batch of
// items costs the sum of its items. A MoE layer costs what its *active* experts compute: the router,
// plus top_k expert MLPs per token, and on an expert-parallel rank only the tokens routed to its experts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "compute.hpp"
#include "fixed.hpp"

namespace hetmesh::cost {

/// The kind of an encoder item; decides how its tokens (patches, frames) are counted.
enum class item_kind : std::uint8_t { image, video_frame, audio };

/// An encoder: `layers` layers priced by `layer` (a full-attention T(L)), trained at `train_factor`.
/// `window` = 0: an item attends fully within itself (ViT). `window` = w > 0: attention within
/// consecutive windows of w tokens (Whisper-style audio: 1500 frames per 30 s window).
struct encoder_compute {
  quadratic_time layer{};     ///< time of one encoder layer as a function of tokens
  std::int64_t layers = 1;    ///< encoder layers
  double train_factor = 3.0;  ///< training / forward time
  std::int64_t window = 0;    ///< attention window in tokens; 0: full attention

  /// A ViT from dimensions: per layer forward 24 h^2 L + 4 h L^2 FLOPs (full attention) over
  /// `flops_per_unit`. Pre: hidden, layers, flops_per_unit > 0.
  [[nodiscard]] HETMESH_COMPILED static encoder_compute vit(std::int64_t hidden, std::int64_t layers,
                                                            double flops_per_unit, double train_factor = 3.0);
  /// The same encoder attending within windows of `w` frames (audio). Pre: w >= 1.
  [[nodiscard]] HETMESH_COMPILED encoder_compute windowed(std::int64_t w) const;

  /// Training time of one item of `tokens` tokens (patches or frames). Pre: tokens >= 0. O(1).
  [[nodiscard]] double item(std::int64_t tokens) const noexcept {
    double per_layer = 0.0;
    if (window <= 0 || tokens <= window) {
      per_layer = layer(static_cast<double>(tokens));
    } else {
      const std::int64_t full = tokens / window;
      const std::int64_t rest = tokens % window;
      per_layer = static_cast<double>(full) * layer(static_cast<double>(window));
      if (rest > 0) per_layer += layer(static_cast<double>(rest));
    }
    return static_cast<double>(layers) * train_factor * per_layer;
  }
  /// item() as fixed-point: what a planner compares. O(1).
  [[nodiscard]] fixed item_fixed(std::int64_t tokens) const { return fixed::from_units(item(tokens)); }
  /// Sum over items. O(items).
  [[nodiscard]] double items(std::span<const std::int64_t> tokens) const noexcept {
    double t = 0.0;
    for (auto x : tokens) t += item(x);
    return t;
  }

  friend bool operator==(const encoder_compute&, const encoder_compute&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// A mixture-of-experts MLP: `experts` experts, `top_k` active per token; `expert_per_token` is one
/// expert MLP's forward time per token, `router_per_token` the gate's. Times in model units.
struct moe_compute {
  std::int64_t experts = 1;       ///< experts per MoE layer
  std::int64_t top_k = 1;         ///< experts each token is routed to
  double expert_per_token = 0.0;  ///< time of one expert per token
  double router_per_token = 0.0;  ///< router time per token

  /// Throws invalid_argument unless experts >= 1, 1 <= top_k <= experts and the times are >= 0.
  HETMESH_COMPILED void validate() const;
  /// Forward time of the MoE MLP for `tokens` tokens with perfectly even routing on one rank holding
  /// all experts: only the top_k active experts compute. The linear term to add to T(s).b. O(1).
  [[nodiscard]] double layer(std::int64_t tokens) const noexcept {
    return static_cast<double>(tokens) * (router_per_token + static_cast<double>(top_k) * expert_per_token);
  }
  /// Forward time of an expert-parallel layer of `ep` ranks (experts split contiguously, experts/ep per
  /// rank) given the routed token count of every expert: the slowest rank's active-expert work plus its
  /// share of routing. Pre: tokens_per_expert.size() == experts, experts % ep == 0. O(experts).
  [[nodiscard]] HETMESH_COMPILED double expert_parallel_layer(std::span<const std::int64_t> tokens_per_expert,
                                                              std::int64_t ep,
                                                              std::int64_t tokens_per_rank) const;
  /// `base` with its MLP term replaced by this MoE's active-expert cost: b = attention_linear + router +
  /// top_k * expert. `attention_linear` is the part of base.b that is not MLP.
  [[nodiscard]] HETMESH_COMPILED quadratic_time apply_to(quadratic_time base, double attention_linear) const;

  friend bool operator==(const moe_compute&, const moe_compute&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

}  // namespace hetmesh::cost

template <>
struct fmt::formatter<hetmesh::cost::item_kind> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::cost::item_kind k, FormatContext& ctx) const -> decltype(ctx.out()) {
    const char* n = k == hetmesh::cost::item_kind::image         ? "image"
                    : k == hetmesh::cost::item_kind::video_frame ? "video_frame"
                                                                 : "audio";
    return hetmesh::format_to(ctx.out(), "{}", n);
  }
};

template <>
struct fmt::formatter<hetmesh::cost::encoder_compute> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::encoder_compute& e, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "encoder_compute({}, layers={}, train_factor={}, window={})",
                              e.layer, e.layers, e.train_factor, e.window);
  }
};

template <>
struct fmt::formatter<hetmesh::cost::moe_compute> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::moe_compute& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "moe_compute(experts={}, top_k={}, expert={:.4g}/tok, router={:.4g}/tok)",
                              m.experts, m.top_k, m.expert_per_token, m.router_per_token);
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED encoder_compute encoder_compute::vit(std::int64_t hidden, std::int64_t layers,
                                                      double flops_per_unit, double train_factor) {
  if (hidden <= 0 || layers <= 0 || !(flops_per_unit > 0.0)) {
    throw_error<invalid_argument>(
        "cost::encoder_compute::vit: hidden={}, layers={}, flops_per_unit={}; expected all > 0", hidden,
        layers, flops_per_unit);
  }
  const double h = static_cast<double>(hidden);
  return encoder_compute{quadratic_time{4.0 * h / flops_per_unit, 24.0 * h * h / flops_per_unit, 0.0}, layers,
                         train_factor, 0};
}

HETMESH_COMPILED encoder_compute encoder_compute::windowed(std::int64_t w) const {
  if (w < 1) throw_error<invalid_argument>("cost::encoder_compute::windowed: window {}; expected >= 1", w);
  encoder_compute e = *this;
  e.window = w;
  return e;
}

HETMESH_COMPILED void encoder_compute::hash_append(hasher& h) const {
  append_all(h, layer, layers, train_factor, window);
}

HETMESH_COMPILED void moe_compute::validate() const {
  if (experts < 1 || top_k < 1 || top_k > experts || expert_per_token < 0.0 || router_per_token < 0.0) {
    throw_error<invalid_argument>(
        "cost::moe_compute: experts={}, top_k={}, expert_per_token={}, router_per_token={}; expected "
        "1 <= top_k <= experts and non-negative times",
        experts, top_k, expert_per_token, router_per_token);
  }
}

HETMESH_COMPILED double moe_compute::expert_parallel_layer(std::span<const std::int64_t> tokens_per_expert,
                                                           std::int64_t ep,
                                                           std::int64_t tokens_per_rank) const {
  validate();
  if (static_cast<std::int64_t>(tokens_per_expert.size()) != experts || ep < 1 || experts % ep != 0) {
    throw_error<invalid_argument>(
        "cost::moe_compute::expert_parallel_layer: {} expert counts for {} experts over ep={}; expected "
        "one count "
        "per expert and ep dividing the expert count",
        tokens_per_expert.size(), experts, ep);
  }
  const std::int64_t per_rank = experts / ep;
  std::int64_t worst = 0;
  for (std::int64_t r = 0; r < ep; ++r) {
    std::int64_t t = 0;
    for (std::int64_t e = r * per_rank; e < (r + 1) * per_rank; ++e)
      t += tokens_per_expert[static_cast<std::size_t>(e)];
    worst = std::max(worst, t);
  }
  return static_cast<double>(worst) * expert_per_token +
         static_cast<double>(tokens_per_rank) * router_per_token;
}

HETMESH_COMPILED quadratic_time moe_compute::apply_to(quadratic_time base, double attention_linear) const {
  validate();
  base.b = attention_linear + router_per_token + static_cast<double>(top_k) * expert_per_token;
  return base;
}

HETMESH_COMPILED void moe_compute::hash_append(hasher& h) const {
  append_all(h, experts, top_k, expert_per_token, router_per_token);
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
