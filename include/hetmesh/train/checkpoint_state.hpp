// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: a model's and its optimizer's state as checkpoint pieces (train/checkpoint_piece.hpp),
// and back, under any layout. capture() turns this rank's tensors (each its block of a full tensor, by
// global id) into "value" pieces and the optimizer's state into pieces and counters: train::adam's moments
// ("adam.m", "adam.v") over each tensor's block and its update count ("adam.t/<id>"); train::zero1's only
// over the runs of each tensor its shard owns, so that the data-parallel group's snapshots together cover
// every tensor once and padding is never saved. restore() reads every tensor's block back from a
// piece_source, whatever blocks and shards were saved, checks everything first (presence, sizes, counters,
// finite values, second moments >= 0) and only then writes the model and the optimizer: a refused
// checkpoint leaves both untouched. A restored train::zero1 takes whole-tensor moments into `pending`, and
// its next step slices them to the shard of whatever group and ranks it then has.
//
//   auto snap = train::capture(model.tensors(), opt);                 // each rank, after a step
//   train::restore(source, model.tensors(), opt);                     // each rank, before the next
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"
#include "checkpoint_piece.hpp"
#include "memory_source.hpp"
#include "optimizer.hpp"
#include "zero.hpp"

namespace hetmesh::train {

/// The field of a tensor's parameters.
inline constexpr std::string_view value_field = "value";
/// The field of Adam's first moments.
inline constexpr std::string_view adam_m_field = "adam.m";
/// The field of Adam's second moments.
inline constexpr std::string_view adam_v_field = "adam.v";
/// The largest Adam update count restore() accepts (2^53: every count a double holds exactly).
inline constexpr std::int64_t max_adam_step = std::int64_t{1} << 53;

/// The counter holding Adam's update count of tensor `id`: "adam.t/<id>".
[[nodiscard]] inline std::string adam_step_counter(std::int64_t id) { return "adam.t/" + std::to_string(id); }

/// One tensor as capture and restore see it: its global id, this rank's block of its parameters (host
/// memory) and which block of the full tensor that is (default: the whole tensor).
template <class T>
struct checkpoint_tensor {
  std::int64_t id = 0;      ///< the tensor's global id (model_tensor::id)
  std::span<T> value;       ///< this rank's block of the parameters
  tensor_shard shard = {};  ///< which block of the full tensor
  /// Elements of the full tensor.
  [[nodiscard]] std::int64_t full() const noexcept {
    return shard.rows == 0 ? static_cast<std::int64_t>(value.size()) : shard.full_size();
  }
  /// The key of `count` elements of `field` from element `begin` of the block.
  [[nodiscard]] piece_key key(std::string_view field, std::int64_t begin, std::int64_t count) const {
    return {id, std::string(field), shard, full(), begin, count};
  }
  /// The key of `field` over the whole block.
  [[nodiscard]] piece_key key(std::string_view field) const {
    return key(field, 0, static_cast<std::int64_t>(value.size()));
  }
};

/// A record of the tensors capture and restore take (e.g. train::model_tensor): `r.id` converts to
/// std::int64_t and `r.value` is a contiguous sized range of parameters in host memory; an optional
/// `r.shard` (train::tensor_shard) says which block of the full tensor it is.
template <class R>
concept state_record = requires(R& r) {
  { r.id } -> std::convertible_to<std::int64_t>;
  requires std::ranges::contiguous_range<decltype((r.value))>;
  requires std::ranges::sized_range<decltype((r.value))>;
};

/// An optimizer that saves its own state (a user's): `o.save_state(tensors, snapshot)` adds its pieces and
/// counters for the rank's tensors (a std::span<const checkpoint_tensor<T>>) to a rank_snapshot<T>&.
template <class O, class T>
concept saves_optimizer_state = requires(const O& o, std::span<const checkpoint_tensor<T>> ts,
                                         rank_snapshot<T>& s) {
  o.save_state(ts, s);
};

/// An optimizer that restores its own state from a piece_source S: `o.load_state(tensors, source)` reads
/// its state for the rank's tensors, checks all of it and only then replaces its state; it throws
/// hetmesh::data_error naming the tensor id and field of anything missing or invalid, changing nothing.
template <class O, class T, class S>
concept loads_optimizer_state = requires(O& o, std::span<const checkpoint_tensor<T>> ts, const S& s) {
  o.load_state(ts, s);
};

namespace detail {
template <class O>
struct checkpoint_kind {
  static constexpr int value = 0;  // unknown
};
template <class T>
struct checkpoint_kind<sgd<T>> {
  static constexpr int value = 1;  // stateless
};
template <class T>
struct checkpoint_kind<adam<T>> {
  static constexpr int value = 2;
};
template <class Inner, class M>
struct checkpoint_kind<zero1<Inner, M>> {
  static constexpr int value = 3;
  static constexpr bool host = M::space == memory_space::host;
};
template <class O>
inline constexpr bool dependent_false = false;

template <class R>
using checkpoint_element_t =
    std::remove_cv_t<std::remove_reference_t<decltype(*std::ranges::data(std::declval<R&>().value))>>;
template <class Tensors>
using checkpoint_record_t = std::remove_cvref_t<std::ranges::range_reference_t<Tensors>>;

// The records `ts` as checkpoint_tensors. Errors (invalid_argument): a block of another size than its
// shard says, or an id twice.
template <class T, class Tensors>
std::vector<checkpoint_tensor<T>> checkpoint_tensors(Tensors&& ts, const char* who) {
  std::vector<checkpoint_tensor<T>> out;
  std::set<std::int64_t> ids;
  for (auto&& r : ts) {
    checkpoint_tensor<T> t{static_cast<std::int64_t>(r.id),
                           std::span<T>(std::ranges::data(r.value), std::ranges::size(r.value))};
    if constexpr (requires { r.shard; }) t.shard = tensor_shard{r.shard};
    const auto n = static_cast<std::int64_t>(t.value.size());
    if (block_elements(t.shard, t.full()) != n)
      throw_error<invalid_argument>(
          "{}: tensor {} holds {} elements as block {} of {} along axis {} of a {}x{} tensor; expected a "
          "block of a split that divides its axis",
          who, t.id, n, t.shard.part, t.shard.parts, t.shard.axis, t.shard.rows, t.shard.cols);
    if (!ids.insert(t.id).second)
      throw_error<invalid_argument>("{}: tensor id {} given twice; expected unique ids", who, t.id);
    out.push_back(t);
  }
  return out;
}

template <class T>
void add_piece(rank_snapshot<T>& s, piece_key k, std::vector<T> data) {
  s.pieces.push_back({std::move(k), std::move(data)});
}

// Adam's moments and count of every tensor over its block (zeros and 0 for a tensor not stepped yet).
template <class T>
void save_adam(const adam<T>& o, std::span<const checkpoint_tensor<T>> ts, rank_snapshot<T>& s) {
  for (const auto& t : ts) {
    const auto it = o.state.find(t.value.data());
    const bool have =
        it != o.state.end() && it->second.m.size() == t.value.size() && it->second.v.size() == t.value.size();
    add_piece(s, t.key(adam_m_field), have ? it->second.m : std::vector<T>(t.value.size(), T(0)));
    add_piece(s, t.key(adam_v_field), have ? it->second.v : std::vector<T>(t.value.size(), T(0)));
    s.counters[adam_step_counter(t.id)] = have ? it->second.t : 0;
  }
}

// zero1<adam>'s state: the restored moments still pending (whole blocks), then the runs of each group's
// tensors this rank's shard owns, then zero moments for tensors no group has stepped.
template <class T, class M>
void save_zero1(const zero1<adam<T>, M>& o, std::span<const checkpoint_tensor<T>> ts, rank_snapshot<T>& s) {
  std::map<const T*, std::size_t> index;
  for (std::size_t k = 0; k < ts.size(); ++k) index[ts[k].value.data()] = k;
  std::vector<char> done(ts.size(), 0);
  for (std::size_t k = 0; k < ts.size(); ++k)
    if (const auto it = o.pending.find(ts[k].value.data()); it != o.pending.end()) {
      add_piece(s, ts[k].key(adam_m_field), it->second.m);
      add_piece(s, ts[k].key(adam_v_field), it->second.v);
      s.counters[adam_step_counter(ts[k].id)] = it->second.t;
      done[k] = 1;
    }
  for (const auto& [first, g] : o.groups) {
    if (g.layout.elements == 0) continue;
    const auto st = o.inner.state.find(g.params.span().data());
    if (st == o.inner.state.end() ||
        st->second.m.size() != static_cast<std::size_t>(g.layout.shard_elements()))
      throw_error<invalid_argument>(
          "train::capture: a train::zero1 group of {} elements has no Adam state for its shard; expected a "
          "completed step",
          g.layout.elements);
    const adam_moments<T>& a = st->second;
    std::int64_t offset = 0;
    for (const auto& p : g.tensors) {
      const auto n = static_cast<std::int64_t>(p.size());
      const auto it = index.find(p.data());
      if (it == index.end() || ts[it->second].value.size() != p.size())
        throw_error<invalid_argument>(
            "train::capture: train::zero1 steps a tensor of {} elements that is not among the {} tensors "
            "given; expected every tensor the optimizer steps",
            n, ts.size());
      const auto& t = ts[it->second];
      if (!done[it->second]) {
        if (n == 0) {
          add_piece(s, t.key(adam_m_field), {});
          add_piece(s, t.key(adam_v_field), {});
        }
        g.layout.owned_runs(g.rank, offset, n, [&](std::int64_t begin, std::int64_t pos, std::int64_t count) {
          const auto from = a.m.begin() + pos, vfrom = a.v.begin() + pos;
          add_piece(s, t.key(adam_m_field, begin, count), std::vector<T>(from, from + count));
          add_piece(s, t.key(adam_v_field, begin, count), std::vector<T>(vfrom, vfrom + count));
        });
        s.counters[adam_step_counter(t.id)] = a.t;
        done[it->second] = 1;
      }
      offset += n;
    }
  }
  for (std::size_t k = 0; k < ts.size(); ++k)
    if (!done[k]) {
      add_piece(s, ts[k].key(adam_m_field), std::vector<T>(ts[k].value.size(), T(0)));
      add_piece(s, ts[k].key(adam_v_field), std::vector<T>(ts[k].value.size(), T(0)));
      s.counters[adam_step_counter(ts[k].id)] = 0;
    }
}

// Field `field` of tensor t's block from `src`, checked: present, finite, and >= 0 when `nonnegative`.
template <class T, class S>
std::vector<T> read_field(const S& src, const checkpoint_tensor<T>& t, std::string_view field,
                          bool nonnegative) {
  if (!src.has(t.id, std::string(field)))
    throw_error<data_error>("train::restore: tensor {} field {}: not in the checkpoint", t.id, field);
  std::vector<T> out(t.value.size());
  src.fill(t.key(field), std::span<T>(out));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || (nonnegative && out[i] < T(0)))
      throw_error<data_error>(
          "train::restore: tensor {} field {}: element {} of the full tensor is {}; expected {}", t.id, field,
          t.shard.global(static_cast<std::int64_t>(i)), out[i],
          nonnegative ? "a finite number >= 0 (a second moment)" : "a finite number");
  }
  return out;
}

// Adam's moments and update count of every tensor of `ts` from `src`, checked.
template <class T, class S>
std::vector<adam_moments<T>> read_adam(const S& src, std::span<const checkpoint_tensor<T>> ts) {
  std::vector<adam_moments<T>> out;
  for (const auto& t : ts) {
    const auto name = adam_step_counter(t.id);
    const std::optional<std::int64_t> step = src.counter(name);
    if (!step)
      throw_error<data_error>("train::restore: tensor {} field adam.t (counter '{}'): not in the checkpoint",
                              t.id, name);
    if (*step < 0 || *step > max_adam_step)
      throw_error<data_error>(
          "train::restore: tensor {} field adam.t (counter '{}') = {}; expected in [0, {}]", t.id, name,
          *step, max_adam_step);
    out.push_back({read_field(src, t, adam_m_field, false), read_field(src, t, adam_v_field, true), *step});
  }
  return out;
}
}  // namespace detail

/// Adds optimizer `o`'s state for tensors `ts` to `s` (capture() calls it; a user's save_state may call it
/// for an optimizer it holds): the user's `o.save_state` when O has one (saves_optimizer_state), nothing
/// for train::sgd, Adam's moments and update counts for train::adam and train::zero1<train::adam> (zero1:
/// this rank's runs only), nothing for train::zero1<train::sgd>. Errors (invalid_argument): a zero1 that
/// steps a tensor not in `ts`. Any other optimizer type does not compile. O(state).
template <class T, class O>
void save_optimizer_state(const O& o, std::span<const checkpoint_tensor<T>> ts, rank_snapshot<T>& s) {
  constexpr int kind = detail::checkpoint_kind<O>::value;
  if constexpr (saves_optimizer_state<O, T>) {
    o.save_state(ts, s);
  } else if constexpr (kind == 2) {
    detail::save_adam(o, ts, s);
  } else if constexpr (kind == 3) {
    static_assert(detail::checkpoint_kind<O>::host,
                  "train::capture: checkpointing a train::zero1 needs host memory for now (its inner "
                  "optimizer's state over device memory is not read)");
    if constexpr (detail::checkpoint_kind<decltype(o.inner)>::value == 2)
      detail::save_zero1(o, ts, s);
    else
      static_assert(detail::checkpoint_kind<decltype(o.inner)>::value == 1,
                    "train::capture: train::zero1's inner optimizer must be train::adam or train::sgd to be "
                    "checkpointed");
  } else {
    static_assert(
        kind == 1 || detail::dependent_false<O>,
        "train::capture: the optimizer has no checkpoint hooks; give it `save_state(tensors, snapshot)` "
        "and `load_state(tensors, source)` (train::saves_optimizer_state, loads_optimizer_state), or use "
        "train::sgd, train::adam or train::zero1 of them");
  }
}

/// Replaces optimizer `o`'s state for tensors `ts` with the one `src` holds (restore() calls it, after
/// reading the tensors' values and before writing them): the user's `o.load_state` (loads_optimizer_state),
/// nothing for train::sgd, Adam's moments and counts for train::adam; for train::zero1<train::adam> the
/// whole blocks become `o.pending`, which each group's next step slices to its shard. Everything is read
/// and checked before `o` changes. Errors (data_error naming the tensor id and field): a field or counter
/// missing, sizes that differ, an update count outside [0, max_adam_step], a value not finite, a second
/// moment below 0. O(state).
template <class T, class O, class S>
void load_optimizer_state(O& o, std::span<const checkpoint_tensor<T>> ts, const S& src) {
  constexpr int kind = detail::checkpoint_kind<O>::value;
  if constexpr (loads_optimizer_state<O, T, S>) {
    o.load_state(ts, src);
  } else if constexpr (kind == 2) {
    auto ms = detail::read_adam(src, ts);
    for (std::size_t k = 0; k < ts.size(); ++k) o.state[ts[k].value.data()] = std::move(ms[k]);
  } else if constexpr (kind == 3) {
    static_assert(detail::checkpoint_kind<O>::host,
                  "train::restore: checkpointing a train::zero1 needs host memory for now (its inner "
                  "optimizer's state over device memory is not written)");
    if constexpr (detail::checkpoint_kind<decltype(o.inner)>::value == 2) {
      auto ms = detail::read_adam(src, ts);
      for (std::size_t k = 0; k < ts.size(); ++k) o.pending[ts[k].value.data()] = std::move(ms[k]);
    } else {
      static_assert(detail::checkpoint_kind<decltype(o.inner)>::value == 1,
                    "train::restore: train::zero1's inner optimizer must be train::adam or train::sgd to be "
                    "checkpointed");
    }
  } else {
    static_assert(
        kind == 1 || detail::dependent_false<O>,
        "train::restore: the optimizer has no checkpoint hooks; give it `save_state(tensors, snapshot)` "
        "and `load_state(tensors, source)` (train::saves_optimizer_state, loads_optimizer_state), or use "
        "train::sgd, train::adam or train::zero1 of them");
  }
}

/// This rank's share of a checkpoint: a "value" piece of each tensor of `tensors` (a range of
/// state_record, e.g. model.tensors(): its block, by global id) and the optimizer's state
/// (save_optimizer_state). Replicated tensors give equal pieces on every data-parallel rank (a store keeps
/// one). Not collective; call it between steps. Errors (invalid_argument): a record whose size is not its
/// block's, an id twice, a zero1 that steps a tensor not given. O(parameters + state), copying them.
template <class Tensors, class Optimizer>
requires state_record<detail::checkpoint_record_t<Tensors>>
[[nodiscard]] auto capture(Tensors&& tensors, const Optimizer& optimizer) {
  using T = detail::checkpoint_element_t<detail::checkpoint_record_t<Tensors>>;
  const auto ts = detail::checkpoint_tensors<T>(std::forward<Tensors>(tensors), "train::capture");
  rank_snapshot<T> s;
  for (const auto& t : ts)
    detail::add_piece(s, t.key(value_field), std::vector<T>(t.value.begin(), t.value.end()));
  save_optimizer_state(optimizer, std::span<const checkpoint_tensor<T>>(ts), s);
  return s;
}

/// Fills every tensor of `tensors` (state_record: its block, by global id) with its elements from `source`
/// (a piece_source: whatever blocks, ranks and shards saved them) and the optimizer's state for them
/// (load_optimizer_state). Everything is read and checked first; the model and the optimizer change only
/// when all of it is valid (no partial load). Not collective. Errors: data_error naming the tensor id and
/// field (a tensor or field missing, a size that differs, a value not finite, and the optimizer's); the
/// records' invalid_argument as capture's. Holds a copy of the rank's state while it checks. O(state).
template <class S, class Tensors, class Optimizer>
requires state_record<detail::checkpoint_record_t<Tensors>>
void restore(const S& source, Tensors&& tensors, Optimizer& optimizer) {
  using T = detail::checkpoint_element_t<detail::checkpoint_record_t<Tensors>>;
  static_assert(piece_source<S, T>,
                "train::restore: the source must model train::piece_source<S, T> (fill, has, counter, blob)");
  const auto ts = detail::checkpoint_tensors<T>(std::forward<Tensors>(tensors), "train::restore");
  std::vector<std::vector<T>> values;
  for (const auto& t : ts) values.push_back(detail::read_field(source, t, value_field, false));
  load_optimizer_state(optimizer, std::span<const checkpoint_tensor<T>>(ts), source);
  for (std::size_t k = 0; k < ts.size(); ++k) std::ranges::copy(values[k], ts[k].value.begin());
}

}  // namespace hetmesh::train
