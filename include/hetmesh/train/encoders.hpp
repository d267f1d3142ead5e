// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the encoders' part of a step, inside one pipeline. Per micro-batch and encoder, the
// distinct items landing in it go through the encoder's long-short plan over the schedule's encoder shards
// (MegaScale-Omni's long-short SP: short items whole on one shard, balanced; long ones split over a group);
// a shard's output is its batches' rows, encoder after encoder, and the executor concatenates the shards'
// outputs in shard order; the reshard maps that concatenation to the landings' rows in landing order,
// which is stage 0's input (and maps stage 0's input gradient back). train::system::run uses these.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/micro_batch.hpp"
#include "../seq/long_short.hpp"
#include "../seq/types.hpp"

namespace hetmesh::train::detail {

/// An encoder shard's work for one micro-batch: per encoder, the batch of items or pieces the long-short
/// plan gives the shard (its output buffer is that batch's rows, encoder after encoder).
struct shard_work {
  std::vector<model::encoder_batch> calls;  ///< per encoder (no tokens: nothing to encode)
  std::vector<std::int64_t> width;          ///< per encoder: output elements per token
};

/// A run of elements copied between the shards' concatenated outputs (stage 0's input as the executor
/// delivers it) and the landing order the backbone stage reads (the reshard).
struct copy_run {
  std::int64_t src = 0;  ///< first element in the shards' concatenation
  std::int64_t dst = 0;  ///< first element in landing order
  std::int64_t n = 0;    ///< elements
};

/// The encoder work of one pipeline's step: per (shard, slot) the work and its output size, per slot the
/// reshard and the landing rows' size.
struct encoder_work {
  std::vector<std::vector<shard_work>> work;     ///< [shard][slot]
  std::vector<std::vector<std::int64_t>> sizes;  ///< [shard][slot]: output elements
  std::vector<std::vector<copy_run>> reshard;    ///< [slot]
  std::vector<std::int64_t> landing_size;        ///< [slot]: elements of stage 0's encoder input
};

/// The item's output tokens (its placeholder count in its document).
inline std::int64_t item_tokens(const model::step_batch& batch, const model::encoder_landing& land) {
  for (const auto& d : batch.documents)
    for (const auto& it : d.items)
      if (it.encoder == land.encoder && it.id == land.item) return it.tokens;
  throw_error<invalid_argument>("train::system::run: encoder {} item {} is not in the batch", land.encoder,
                                land.item);
}

/// Elements per output token of encoder `k` (output_size over tokens of a batch), for any pack.
template <class... Es>
std::int64_t row_width(int k, const model::encoder_batch& b, const Es&... es) {
  std::int64_t w = 0;
  int i = 0;
  const auto v = b.view();
  [[maybe_unused]] auto one = [&](const auto& binding) {
    if (i++ != k) return;
    const auto n = static_cast<std::int64_t>(binding.stage->output_size(v));
    if (v.tokens <= 0 || n % v.tokens != 0)
      throw_error<invalid_argument>(
          "train::system::run: encoder {} ({}) has {} output elements for {} tokens; expected a whole "
          "number "
          "of elements per output token",
          k, std::remove_pointer_t<decltype(binding.stage)>::modality, n, v.tokens);
    w = n / v.tokens;
  };
  (one(es), ...);
  return w;
}

/// The calls of shard work `w`, one per encoder with tokens, in encoder order: `f(binding, view, ctx, at,
/// n)` with the encoder's binding, its batch view, its context (its own activation store, stage = shard
/// e, micro_batch = slot `mb`) and its slice [at, at + n) of the shard's output (n = output_size(view); the
/// encoders' outputs follow one another). encode and encode_backward walk the work with it.
template <class Ctx, class Stores, class F, class... Es>
void for_each_encoder_call(const detail::shard_work& w, int e, int mb, Stores& stores, F&& f, Es&... es) {
  std::size_t at = 0;
  int k = 0;
  [[maybe_unused]] auto one = [&](auto& binding) {
    const int index = k++;
    const auto& b = w.calls[static_cast<std::size_t>(index)];
    if (b.tokens == 0) return;
    const auto v = b.view();
    const auto n = static_cast<std::size_t>(binding.stage->output_size(v));
    Ctx ctx;
    ctx.activations = &stores[static_cast<std::size_t>(index)];
    ctx.stage = e;
    ctx.micro_batch = mb;
    f(binding, v, ctx, at, n);
    at += n;
  };
  (one(es), ...);
}

/// Runs every encoder's forward for shard work `w`, writing their outputs into `out` one after the
/// other (encoder 0's batch rows, then encoder 1's, ...), and adds the pieces encoded to `items`. Each
/// encoder's context: its own activation store, stage = shard e, micro_batch = slot.
template <class Ctx, class T, class Stores, class... Es>
void encode(const detail::shard_work& w, std::span<T> out, int e, int mb, Stores& stores, std::int64_t& items,
            Es&... es) {
  for_each_encoder_call<Ctx>(
      w, e, mb, stores,
      [&](auto& binding, const model::encoder_batch_view& v, Ctx& ctx, std::size_t at, std::size_t n) {
        std::vector<T> in(static_cast<std::size_t>(binding.stage->input_size(v)));
        binding.input(v, std::span<T>(in));
        if (at + n > out.size())
          throw_error<invalid_argument>(
              "train::system::run: encoder shard {} micro-batch {} writes past its {} output elements; "
              "expected output_size proportional to the tokens of a batch",
              e, mb, out.size());
        binding.stage->forward(ctx, v, std::span<const T>(in), out.subspan(at, n));
        items += static_cast<std::int64_t>(v.pieces.size());
      },
      es...);
}

/// The gradient pass of encode: `g` in encode's layout; each encoder's backward gets its slice.
template <class Ctx, class T, class Stores, class... Es>
void encode_backward(const detail::shard_work& w, std::span<const T> g, int e, int mb, Stores& stores,
                     Es&... es) {
  for_each_encoder_call<Ctx>(
      w, e, mb, stores,
      [&](auto& binding, const model::encoder_batch_view& v, Ctx& ctx, std::size_t at, std::size_t n) {
        binding.stage->backward(ctx, v, g.subspan(at, n), std::span<T>{});
      },
      es...);
}

template <class Stores>
std::size_t slots_left(const Stores& stores) {
  std::size_t n = 0;
  for (const auto& st : stores) n += st.slots();
  return n;
}

/// The encoder work of the micro-batches `by_slot` (null: an empty slot) over E shards, with `policy`
/// (long-short SP) and the bound encoders `encoders` (their output sizes). Errors: an item of an encoder
/// index not passed, or not in the batch, a non-integral output width (invalid_argument); the long-short
/// planner's (capacity_error). Pure.
template <class... Es>
encoder_work plan_encoder_work(std::span<const model::micro_batch* const> by_slot,
                               const model::step_batch& batch, int E, const seq::long_short_policy& policy,
                               const Es&... encoders) {
  encoder_work out;
  constexpr int num_encoders = static_cast<int>(sizeof...(Es));
  out.work.assign(static_cast<std::size_t>(E), std::vector<shard_work>(by_slot.size()));
  out.sizes.assign(static_cast<std::size_t>(E), std::vector<std::int64_t>(by_slot.size(), 0));
  out.reshard.resize(by_slot.size());
  out.landing_size.assign(by_slot.size(), 0);
  auto& work = out.work;
  auto& enc_sizes = out.sizes;
  auto& reshard = out.reshard;
  auto& landing_size = out.landing_size;
  for (std::size_t m = 0; m < by_slot.size() && E > 0; ++m) {
    if (by_slot[m] == nullptr) continue;
    const auto& outs = by_slot[m]->encoder_outputs;
    std::vector<std::vector<seq::seq_desc>> items(static_cast<std::size_t>(num_encoders));
    for (const auto& land : outs) {
      if (land.encoder < 0 || land.encoder >= num_encoders)
        throw_error<invalid_argument>(
            "train::system::run: encoder item {} names encoder {}, but {} encoders were passed to run; "
            "expected an encoder (bind_encoder) for every encoder index of the batch",
            land.item, land.encoder, num_encoders);
      auto& list = items[static_cast<std::size_t>(land.encoder)];
      if (std::none_of(list.begin(), list.end(), [&](const seq::seq_desc& d) { return d.id == land.item; }))
        list.push_back({land.item, item_tokens(batch, land)});
    }
    std::vector<std::int64_t> base(static_cast<std::size_t>(E) + 1, 0);  // each shard's first element
    for (int e = 0; e < E; ++e) {
      auto& w = work[static_cast<std::size_t>(e)][m];
      for (int k = 0; k < num_encoders; ++k) {
        const auto& list = items[static_cast<std::size_t>(k)];
        w.calls.push_back(list.empty()
                              ? model::encoder_batch{k, e, static_cast<int>(m), {}, 0}
                              : model::make_encoder_batch(policy.plan(list, E), k, e, static_cast<int>(m)));
        w.width.push_back(w.calls.back().tokens == 0 ? 0 : row_width(k, w.calls.back(), encoders...));
        enc_sizes[static_cast<std::size_t>(e)][m] += w.calls.back().tokens * w.width.back();
      }
      base[static_cast<std::size_t>(e) + 1] =
          base[static_cast<std::size_t>(e)] + enc_sizes[static_cast<std::size_t>(e)][m];
    }
    std::int64_t dst = 0;  // the reshard: each landing's rows, from whichever shards hold them
    for (const auto& land : outs) {
      const auto a = land.item_tokens.begin, b = land.item_tokens.end;
      for (std::int64_t row = a; row < b;) {
        bool found = false;
        for (int e = 0; e < E && !found; ++e) {
          const auto& w = work[static_cast<std::size_t>(e)][m];
          std::int64_t at = base[static_cast<std::size_t>(e)];
          for (int k = 0; k < num_encoders && !found; ++k) {
            const auto& cb = w.calls[static_cast<std::size_t>(k)];
            const auto wd = w.width[static_cast<std::size_t>(k)];
            if (k == land.encoder)
              for (const auto& p : cb.pieces)
                if (p.item == land.item && row >= p.tokens.begin && row < p.tokens.end) {
                  const auto n = std::min(b, p.tokens.end) - row;
                  reshard[m].push_back({at + (p.offset + row - p.tokens.begin) * wd, dst, n * wd});
                  dst += n * wd;
                  row += n;
                  found = true;
                  break;
                }
            at += cb.tokens * wd;
          }
        }
        if (!found)
          throw_error<invalid_argument>(
              "train::system::run: rows {}.. of encoder {} item {} are on no encoder shard; expected the "
              "long-short plan to cover every item",
              row, land.encoder, land.item);
      }
    }
    landing_size[m] = dst;
  }
  return out;
}

}  // namespace hetmesh::train::detail
