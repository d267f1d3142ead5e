// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the `schedule_family` concept, and the rule a family makes of the user's backbone
// stage: a family whose backward is split into input (I) and weight (W) halves needs a stage that
// provides both. model/ owns the stage concepts; this header states the rule over a bool so that it
// does not depend on model/ (pipeline/ includes only core), and train::system feeds it the answer of
// model's split-backward concept.
#pragma once

#include <concepts>
#include <string_view>

#include <fmt/format.h>

#include "../core/hash.hpp"
#include "action.hpp"
#include "generators.hpp"

namespace hetmesh::pipeline {

/// A pipeline schedule family: a policy type whose type is the choice of generator and whose members
/// are its run-time parameters. Requirements on `S` (a value `s`, ints `pp` and `m`):
///   1. `S` is a regular aggregate: default-constructible, copyable, `s == s` (`std::regular`);
///   2. `S::name` is a constant convertible to `std::string_view`: the name the family prints as and
///      the tools map from;
///   3. `S::requires_split_backward` is a constant `bool`: true when the family's backward actions are
///      I and W (the stage must split backward), false when they are B;
///   4. `s.generate(pp, m)` returns the compute-only `schedule` of `pp` ranks and `m` micro-batches;
///   5. `s.hash_append(h)` feeds every parameter to a `hasher` (plans name the policy they came from);
///   6. `S` prints through fmt.
template <class S>
concept schedule_family = std::regular<S> && std::convertible_to<decltype(S::name), std::string_view> &&
                          std::same_as < std::remove_cv_t<decltype(S::requires_split_backward)>,
bool > &&std::bool_constant<S::requires_split_backward>::value ==
    S::requires_split_backward&& requires(const S& s, int pp, int m, hasher& h) {
  { s.generate(pp, m) } -> std::same_as<schedule>;
  s.hash_append(h);
}
&&fmt::is_formattable<S>::value;

static_assert(schedule_family<gpipe>);
static_assert(schedule_family<one_f_one_b>);
static_assert(schedule_family<interleaved_1f1b>);
static_assert(schedule_family<zero_bubble>);
static_assert(schedule_family<interleaved_zero_bubble>);
static_assert(schedule_family<zbv>);
static_assert(schedule_family<looped_bfs>);

/// True when a stage with (`StageHasSplitBackward`) or without split backward can run schedule family
/// `S`: a family that requires split backward accepts only stages that provide backward_input and
/// backward_weight. Use it in a `requires` clause; `check_schedule_accepts` says the same with a
/// message.
template <class S, bool StageHasSplitBackward>
concept schedule_accepts = schedule_family<S> &&(!S::requires_split_backward || StageHasSplitBackward);

/// Compile-time check that schedule family `S` can run a stage that has (`StageHasSplitBackward`) or
/// lacks split backward. Instantiating it with a zero-bubble family and `false` fails with a message
/// naming what the stage must provide; the family's type appears in the compiler's instantiation
/// context. Returns true so that it can sit in a `static_assert` or a `requires` clause.
template <class S, bool StageHasSplitBackward>
consteval bool check_schedule_accepts() {
  static_assert(
      schedule_family<S>,
      "not a pipeline schedule family: expected a policy type with `name`, `requires_split_backward`, "
      "`generate(pp, microbatches)`, `hash_append`, ==, and a formatter (see pipeline::schedule_family)");
  static_assert(
      !S::requires_split_backward || StageHasSplitBackward,
      "this schedule needs split backward (its backward runs as I and W actions): the backbone stage "
      "must provide backward_input and backward_weight (model::split_backward_stage), or pick a "
      "schedule without split backward (gpipe, one_f_one_b, interleaved_1f1b, looped_bfs)");
  return true;
}

}  // namespace hetmesh::pipeline
