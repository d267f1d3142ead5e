// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: how a backbone stage mixes tokens across positions, which it declares so that a sequence
// split (CP pieces, HDP rings, Ulysses) never silently cuts a mixer in two. Attention goes through the
// context (ctx.attention_forward: ring or Ulysses attention sees every key); a local mixer that reads the k
// tokens before each token (a causal convolution, a token shift, an SSM chunk's carry) goes through the
// context's halo exchange (ctx.halo: the previous k tokens of the same document from whichever rank holds
// them, zeros before the document's start); a token-local stage (an MLP, a norm) mixes nothing. A stage
// declares one of these as `static constexpr model::token_mixing token_mixing = ...;`. train::system refuses
// a stage that declares nothing when its partition family may split a sequence, since nothing else tells a
// parameter-free token shift from an MLP.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "../core/format.hpp"
#include "../seq/halo.hpp"

namespace hetmesh::model {

/// A stage's declaration of how it mixes tokens (a literal type: a static constexpr member).
struct token_mixing {
  /// The mixing kinds.
  enum class kind : std::uint8_t {
    none,       ///< token-local: every output row reads only its own token's row
    attention,  ///< across tokens only through the context's attention
    halo,       ///< through the context's attention and a causal halo of `halo` tokens (ctx.halo)
  };
  kind how = kind::attention;  ///< the kind
  int halo = 0;                ///< kind::halo: the most tokens before a token the stage reads (>= 1)

  friend constexpr bool operator==(const token_mixing&, const token_mixing&) = default;
};

/// Declares a token-local stage (an MLP, a norm, a projection).
inline constexpr token_mixing token_local{token_mixing::kind::none, 0};
/// Declares a stage that mixes tokens only through ctx.attention_forward/backward.
inline constexpr token_mixing through_attention{token_mixing::kind::attention, 0};
/// Declares a stage that also reads up to `k` tokens before each token of its document through ctx.halo
/// (k >= 1; attention through the context stays allowed).
[[nodiscard]] constexpr token_mixing causal_halo(int k) noexcept { return {token_mixing::kind::halo, k}; }

/// Whether stage type S declares `static constexpr model::token_mixing token_mixing`.
template <class S>
concept declares_token_mixing = requires {
  { std::remove_cvref_t<S>::token_mixing } -> std::convertible_to<const token_mixing&>;
};

/// What stage type S declares (nullopt: nothing). O(1).
template <class S>
[[nodiscard]] constexpr std::optional<token_mixing> token_mixing_of() noexcept {
  if constexpr (declares_token_mixing<S>)
    return token_mixing{std::remove_cvref_t<S>::token_mixing};
  else
    return std::nullopt;
}

/// The halo a stage of type S may read (0 unless it declares model::causal_halo). O(1).
template <class S>
[[nodiscard]] constexpr int declared_halo() noexcept {
  if constexpr (declares_token_mixing<S>)
    return std::remove_cvref_t<S>::token_mixing.how == token_mixing::kind::halo
               ? std::remove_cvref_t<S>::token_mixing.halo
               : 0;
  else
    return 0;
}

/// A context that gives a stage declared model::causal_halo(k) its halo, for element type T. Requirements
/// (ctx a const Ctx):
///  1. `ctx.halo(k)` returns the seq::halo_plan of the call's micro-batch for k tokens (where each token's
///     earlier positions are: plan.source(token, lag));
///  2. `ctx.halo_forward(plan, width, x, halo)` with std::span<const T> x [plan.tokens][width] fills
///     std::span<T> halo [plan.halo_rows][width] (collective over the call's ring or group);
///  3. `ctx.halo_backward(plan, width, dhalo, dx)` returns the halo's gradient to the rows' owners and adds
///     the caller's share into dx (collective as 2).
/// The model is train::step_context.
template <class Ctx, class T>
concept halo_context = requires(const Ctx& ctx, const seq::halo_plan& p, std::int64_t w, std::span<const T> c,
                                std::span<T> m) {
  { ctx.halo(1) } -> std::convertible_to<seq::halo_plan>;
  ctx.halo_forward(p, w, c, m);
  ctx.halo_backward(p, w, c, m);
};

}  // namespace hetmesh::model

/// Prints a token_mixing as `token-local`, `attention` or `causal halo of k`.
template <>
struct fmt::formatter<hetmesh::model::token_mixing> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::model::token_mixing& m, fmt::format_context& ctx) const {
    using k = hetmesh::model::token_mixing::kind;
    if (m.how == k::none) return hetmesh::format_to(ctx.out(), "token-local");
    if (m.how == k::attention) return hetmesh::format_to(ctx.out(), "attention");
    return hetmesh::format_to(ctx.out(), "causal halo of {}", m.halo);
  }
};
