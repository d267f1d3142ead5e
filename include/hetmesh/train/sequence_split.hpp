// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: whether a partition family may split one document over several ranks, and the check
// train::system makes of a backbone stage before it runs under one: a stage that may mix tokens (a token
// shift, a convolution) must say how (model/token_mixing.hpp), or a split cuts its mixer silently. Under a
// family that never splits (cp = 1, a pool of one rank) any stage runs. A user's family says what it does by
// an overload of `may_split_sequences(family, pool)` beside its type (found by argument-dependent lookup);
// without one, it is taken to split.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/token_mixing.hpp"
#include "../seq/partition.hpp"
#include "system_mesh.hpp"

namespace hetmesh::train {

namespace detail {
template <class F>
concept says_whether_it_splits = requires(const F& f, int pool) {
  { may_split_sequences(f, pool) } -> std::convertible_to<bool>;
};
}  // namespace detail

/// Whether family `f` may split a document over more than one of `pool` ranks (the family's
/// may_split_sequences overload; true for a family that has none). O(1).
template <class F>
[[nodiscard]] constexpr bool family_may_split(const F& f, int pool) {
  if constexpr (detail::says_whether_it_splits<F>)
    return may_split_sequences(f, pool);
  else
    return true;
}

/// The partition family `f` as messages name it: its value when it prints, else F::name, else "the
/// partition family".
template <class F>
[[nodiscard]] std::string family_label(const F& f) {
  if constexpr (fmt::is_formattable<F>::value)
    return hetmesh::format("{}", f);
  else if constexpr (requires { std::string_view(F::name); })
    return std::string(F::name);
  else
    return "the partition family";
}

/// Refuses backbone stage type S under family `f` over `pool` ranks when S does not declare its token
/// mixing and the family may split a document: a stage that mixes tokens outside the context's attention
/// would then be silently wrong. Errors: invalid_argument naming the family and what to declare. O(1).
template <class S, class F>
void check_token_mixing(const F& f, int pool) {
  if constexpr (!model::declares_token_mixing<S>) {
    if (family_may_split(f, pool))
      throw_error<invalid_argument>(
          "train::system: the backbone stage does not declare how it mixes tokens, and {} over {} ranks "
          "splits documents over ranks; expected `static constexpr hetmesh::model::token_mixing "
          "token_mixing = ...;` in the stage: model::through_attention (tokens meet only in "
          "ctx.attention_forward), model::causal_halo(k) (it also reads the k tokens before each token, "
          "through ctx.halo) or model::token_local (it mixes none)",
          family_label(f), pool);
  }
}

/// Refuses backbone stage `s` under mesh `m` and attention groups of `group` ranks (the plan's attention
/// mechanism's group size: a Ulysses degree, whichever family plans it; 0 for rings) when the stage's
/// declared sizes do not split over them, naming the dimension (each optional, read when the stage has it):
///  - `s.attention_heads()` (int): the query heads of its attention layers, split over tp: tp must divide
///    them, and with groups of more than one rank group x tp must divide them (heads exchanged in groups);
///  - `s.split_vocabulary()` (std::int64_t): the vocabulary of a vocabulary-parallel embedding and loss,
///    split over tp;
///  - `s.experts()` (int): the experts of each MoE layer, split over ep.
/// Errors: invalid_argument. O(1).
template <class S>
void check_stage_sizes(const S& s, int group, const system_mesh& m) {
  if constexpr (requires {
                  { s.attention_heads() } -> std::convertible_to<int>;
                }) {
    const int h = s.attention_heads();
    if (h < 1 || h % m.tp != 0)
      throw_error<invalid_argument>(
          "train::system: mesh tp = {} does not divide the stage's {} attention heads; expected tp | heads "
          "(each tp rank runs heads / tp of them)",
          m.tp, h);
    if (group > 1 && h % (group * m.tp) != 0)
      throw_error<invalid_argument>(
          "train::system: Ulysses degree {} x mesh tp = {} does not divide the stage's {} attention heads; "
          "expected degree x tp | heads (each group splits a tp rank's heads / tp over its degree)",
          group, m.tp, h);
  }
  if constexpr (requires {
                  { s.split_vocabulary() } -> std::convertible_to<std::int64_t>;
                })
    if (const std::int64_t v = s.split_vocabulary(); v < 1 || v % m.tp != 0)
      throw_error<invalid_argument>(
          "train::system: mesh tp = {} does not divide the stage's vocabulary of {}; expected tp | "
          "vocabulary (a vocabulary-parallel embedding and loss hold vocabulary / tp rows each)",
          m.tp, v);
  if constexpr (requires {
                  { s.experts() } -> std::convertible_to<int>;
                })
    if (const int e = s.experts(); e < 1 || e % m.ep != 0)
      throw_error<invalid_argument>(
          "train::system: mesh ep = {} does not divide the stage's {} experts; expected ep | experts (each "
          "ep "
          "rank holds experts / ep of them)",
          m.ep, e);
}

}  // namespace hetmesh::train
