// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the encoders' part of a step, inside one pipeline. Per slot, the encoder domain's plan
// (train/encoder_domain.hpp: long-short SP over every encoder shard's row, the tp x pool ranks of its
// pipeline rank) gives each encoder shard of this rank its items or pieces; a shard's local output is its
// batches' rows, encoder after encoder. In the slot's encoder action the ranks of a shard's row exchange
// rows (an all-to-all-v over the row): each sends the rows a pool rank's stage 0 reads to every rank of
// the row at that pool rank (its tp ranks), and what a rank receives, by source, is its shard's output
// to its own stage 0. Gradients come back from the receivers with the sender's tp rank only (stage 0's
// input gradient is the same on every tp rank). The executor concatenates the shards' outputs in shard
// order; the reshard maps that concatenation to the landings' rows in landing order, which is stage 0's
// input (and maps stage 0's input gradient back). train::system::run uses these.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/host_memory.hpp"
#include "../model/micro_batch.hpp"
#include "../seq/long_short.hpp"
#include "../seq/types.hpp"
#include "encoder_domain.hpp"
#include "step_plan.hpp"

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

/// One encoder shard's exchange in one slot at one rank (see the file comment): the rows its encoders
/// wrote (local_size elements) go out by destination row position (send runs into the send buffer,
/// grouped by destination in row order); the shard's output arrives by source row position. The way back
/// runs between the positions with this rank's tp rank only (`returns`).
struct shard_exchange {
  std::int64_t local_size = 0;            ///< elements this rank's encoders write at the shard
  std::vector<copy_run> send;             ///< src: element of the local output; dst: of the send buffer
  std::vector<copy_run> back;             ///< the runs of `send` to positions that return gradients
  std::vector<std::int64_t> send_counts;  ///< per row position: elements sent to it
  std::vector<std::int64_t> recv_counts;  ///< per row position: elements received from it (the output)
  std::vector<char> returns;              ///< per row position: it has this rank's tp rank

  /// `counts` where the position returns gradients, else 0 (the way back's counts). O(row).
  [[nodiscard]] std::vector<std::int64_t> returned(std::span<const std::int64_t> counts) const {
    std::vector<std::int64_t> out(counts.begin(), counts.end());
    for (std::size_t q = 0; q < out.size() && q < returns.size(); ++q)
      if (!returns[q]) out[q] = 0;
    return out;
  }

  /// Elements of the send buffer (the sum of send_counts). O(pool).
  [[nodiscard]] std::int64_t send_size() const noexcept {
    std::int64_t n = 0;
    for (auto c : send_counts) n += c;
    return n;
  }
  /// Writes the send buffer `out` (send_size() elements) of `local` (local_size elements): each run's rows
  /// at its place, by `mem`'s copies (spans of its memory). O(send_size()), one copy per run.
  template <class M, class T>
  void pack_into(const M& mem, std::span<const T> local, std::span<T> out) const {
    for (const auto& r : send)
      mem.copy(out.subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)),
               local.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)));
  }
  /// The send buffer of `local` in host memory.
  template <class T>
  [[nodiscard]] std::vector<T> pack(std::span<const T> local) const {
    std::vector<T> out(static_cast<std::size_t>(send_size()));
    pack_into(model::host_memory{}, local, std::span<T>(out));
    return out;
  }
  /// The way back: adds the gradients `grad` (in the send buffer's layout; only the returning positions'
  /// parts are read) into `local` at the rows they came from (a row sent to several pool ranks sums their
  /// gradients), by `mem`'s adds (spans of its memory; runs in order, so sums are the same on every
  /// memory). O(send_size()), one add per returned run.
  template <class M, class T>
  void unpack_add(const M& mem, std::span<const T> grad, std::span<T> local) const {
    for (const auto& r : back)
      mem.add(local.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)),
              grad.subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)));
  }
  /// unpack_add in host memory.
  template <class T>
  void unpack_add(std::span<const T> grad, std::span<T> local) const {
    unpack_add(model::host_memory{}, grad, local);
  }
};

/// The encoder work of one pool rank's step: per (shard, slot) the calls of the shards it runs, their
/// exchange and the output size; per slot the reshard and the landing rows' size, and whether the slot
/// has encoder items (then every shard's ranks exchange, with or without rows of their own).
struct encoder_work {
  std::vector<std::vector<shard_work>> work;          ///< [shard][slot] (shards this rank runs)
  std::vector<std::vector<shard_exchange>> exchange;  ///< [shard][slot] (shards this rank runs)
  std::vector<std::vector<std::int64_t>> sizes;       ///< [shard][slot]: output elements to this pipeline
  std::vector<std::vector<copy_run>> reshard;         ///< [slot]
  std::vector<std::int64_t> landing_size;             ///< [slot]: elements of stage 0's encoder input
  std::vector<char> active;                           ///< [slot]: the slot has encoder items
};

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
/// n)` with the encoder's binding, its batch view, its context (`make_ctx(k)` for encoder k: its own
/// activation store, stage = shard, micro_batch = slot) and its slice [at, at + n) of the shard's local
/// output (n = output_size(view); the encoders' outputs follow one another). encode and encode_backward
/// walk the work with it.
template <class MakeCtx, class F, class... Es>
void for_each_encoder_call(const detail::shard_work& w, MakeCtx&& make_ctx, F&& f, Es&... es) {
  std::size_t at = 0;
  int k = 0;
  [[maybe_unused]] auto one = [&](auto& binding) {
    const int index = k++;
    const auto& b = w.calls[static_cast<std::size_t>(index)];
    if (b.tokens == 0) return;
    const auto v = b.view();
    const auto n = static_cast<std::size_t>(binding.stage->output_size(v));
    auto ctx = make_ctx(index);
    f(binding, v, ctx, at, n);
    at += n;
  };
  (one(es), ...);
}

/// Runs every encoder's forward for shard work `w` (shard e, slot mb), writing their outputs into `out`
/// one after the other (encoder 0's batch rows, then encoder 1's, ...), and adds the pieces encoded to
/// `items`. Each encoder's context: make_ctx(k).
/// The encoders' inputs are buffers of memory policy M (what binding.input writes: host memory for
/// model::host_memory, device memory for a device policy).
template <class T, class M = model::host_memory, class MakeCtx, class... Es>
void encode(const detail::shard_work& w, std::span<T> out, int e, int mb, MakeCtx&& make_ctx,
            std::int64_t& items, Es&... es) {
  typename M::template buffer<T> in;
  for_each_encoder_call(
      w, make_ctx,
      [&](auto& binding, const model::encoder_batch_view& v, auto& ctx, std::size_t at, std::size_t n) {
        in.resize(static_cast<std::size_t>(binding.stage->input_size(v)));
        binding.input(v, in.span());
        if (at + n > out.size())
          throw_error<invalid_argument>(
              "train::system::run: encoder shard {} micro-batch {} writes past its {} output elements; "
              "expected output_size proportional to the tokens of a batch",
              e, mb, out.size());
        binding.stage->forward(ctx, v, std::span<const T>(in.span()), out.subspan(at, n));
        items += static_cast<std::int64_t>(v.pieces.size());
      },
      es...);
}

/// The gradient pass of encode: `g` in encode's layout; each encoder's backward gets its slice.
template <class T, class MakeCtx, class... Es>
void encode_backward(const detail::shard_work& w, std::span<const T> g, MakeCtx&& make_ctx, Es&... es) {
  for_each_encoder_call(
      w, make_ctx,
      [&](auto& binding, const model::encoder_batch_view& v, auto& ctx, std::size_t at, std::size_t n) {
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

/// Checks that the encoder landings of this pool rank's micro-batches (`by_slot`, null: none in the slot)
/// are the plan's (step_layout::encoder_landings of pool rank `j`): the encoder domain is planned from the
/// plan's, so a batch with items the plan does not know (a plan made without the batch) would encode
/// nothing. Errors: invalid_argument naming the slot. O(landings).
HETMESH_COMPILED void check_landings(const step_layout& plan,
                                     std::span<const model::micro_batch* const> by_slot, int j)
#if HETMESH_BODIES
{
  for (std::size_t m = 0; m < by_slot.size(); ++m) {
    std::vector<slot_landing> want, got;
    if (m < plan.encoder_landings.size())
      for (const auto& l : plan.encoder_landings[m])
        if (l.pool_rank == j) want.push_back(l);
    if (by_slot[m] != nullptr)
      for (const auto& l : by_slot[m]->encoder_outputs)
        got.push_back({j, l.encoder, l.item, 0, l.item_tokens});
    bool same = want.size() == got.size();
    for (std::size_t i = 0; same && i < want.size(); ++i)
      same = want[i].encoder == got[i].encoder && want[i].item == got[i].item && want[i].rows == got[i].rows;
    if (!same)
      throw_error<invalid_argument>(
          "train::system::run: pool rank {} slot {} has {} encoder landings in its micro-batch and {} in the "
          "plan; expected a plan made from the batch (train::system::plan(batch))",
          j, m, got.size(), want.size());
  }
}
#else
    ;
#endif

/// The encoder work of the rank at row position `q` in `plan` (see the file comment; its pool rank is
/// q / plan.tp): `domain` is plan_encoder_domain(plan, E, encoders, policy), `width` the encoders' output
/// elements per token, `runs[e]` whether this rank runs shard e (its calls and send side are made only for
/// those). Pure; O(slots x (E x R x this pool rank's landings + R x landings) x group degree).
[[nodiscard]] HETMESH_COMPILED encoder_work
plan_encoder_work(const step_layout& plan, const std::vector<std::vector<seq::long_short_plan>>& domain,
                  int E, int q, std::span<const std::int64_t> width, std::span<const char> runs)
#if HETMESH_BODIES
{
  const int R = plan.encoder_row(), tp = plan.tp, j = q / tp;
  const auto slots = static_cast<std::size_t>(std::max(plan.slots, 1));
  const auto K = width.size();
  encoder_work out;
  out.work.assign(static_cast<std::size_t>(E), std::vector<shard_work>(slots));
  out.exchange.assign(static_cast<std::size_t>(E), std::vector<shard_exchange>(slots));
  out.sizes.assign(static_cast<std::size_t>(E), std::vector<std::int64_t>(slots, 0));
  out.reshard.resize(slots);
  out.landing_size.assign(slots, 0);
  out.active.assign(slots, 0);
  for (std::size_t m = 0; m < plan.encoder_landings.size() && m < slots && E > 0; ++m) {
    const auto& lands = plan.encoder_landings[m];
    if (lands.empty()) continue;
    out.active[m] = 1;
    const auto index = assignment_index(domain[m]);
    auto assigned = [&](const slot_landing& l) -> const seq::long_short_assignment& {
      return *index[static_cast<std::size_t>(l.encoder)].at(l.item);
    };
    auto wd = [&](const slot_landing& l) { return width[static_cast<std::size_t>(l.encoder)]; };
    // Where each of this pool rank's landings starts in stage 0's input (landing order).
    std::vector<std::int64_t> dst_of(lands.size(), -1);
    std::int64_t dst = 0;
    for (std::size_t i = 0; i < lands.size(); ++i)
      if (lands[i].pool_rank == j) {
        dst_of[i] = dst;
        dst += lands[i].rows.size() * wd(lands[i]);
      }
    out.landing_size[m] = dst;
    // Receive side: every shard's output to this pool rank, by source row position, each source's rows
    // in this pool rank's landing order (the order the sources send them in).
    std::int64_t base = 0;
    for (int e = 0; e < E; ++e) {
      auto& ex = out.exchange[static_cast<std::size_t>(e)][m];
      ex.recv_counts.assign(static_cast<std::size_t>(R), 0);
      ex.send_counts.assign(static_cast<std::size_t>(R), 0);
      ex.returns.assign(static_cast<std::size_t>(R), 0);
      for (int r = 0; r < R; ++r) ex.returns[static_cast<std::size_t>(r)] = r % tp == q % tp;
      std::int64_t at = 0;
      for (int src = 0; src < R; ++src)
        for (std::size_t i = 0; i < lands.size(); ++i) {
          const auto& l = lands[i];
          if (l.pool_rank != j) continue;
          for_each_piece(assigned(l), [&](int d, seq::token_range r) {
            const auto lo = std::max(r.begin, l.rows.begin), hi = std::min(r.end, l.rows.end);
            if (d != e * R + src || lo >= hi) return;
            const auto n = (hi - lo) * wd(l);
            out.reshard[m].push_back({base + at, dst_of[i] + (lo - l.rows.begin) * wd(l), n});
            ex.recv_counts[static_cast<std::size_t>(src)] += n;
            at += n;
          });
        }
      out.sizes[static_cast<std::size_t>(e)][m] = at;
      base += at;
    }
    // Send side of the shards this rank runs: its pieces' rows, by destination row position (every tp
    // rank of the landing's pool rank).
    for (int e = 0; e < E; ++e) {
      if (!runs[static_cast<std::size_t>(e)]) continue;
      const int d = e * R + q;
      auto& w = out.work[static_cast<std::size_t>(e)][m];
      auto& ex = out.exchange[static_cast<std::size_t>(e)][m];
      std::vector<std::map<std::int64_t, std::int64_t>> first_row(K);  // item -> local element of its row 0
      for (std::size_t k = 0; k < K; ++k) {
        const auto& ls = domain[m][k];
        w.calls.push_back(ls.ranks == 0
                              ? model::encoder_batch{static_cast<int>(k), d, static_cast<int>(m), {}, 0}
                              : model::make_encoder_batch(ls, static_cast<int>(k), d, static_cast<int>(m)));
        w.width.push_back(w.calls.back().tokens == 0 ? 0 : width[k]);
        for (const auto& p : w.calls.back().pieces)
          first_row[k][p.item] = ex.local_size + (p.offset - p.tokens.begin) * width[k];
        ex.local_size += w.calls.back().tokens * width[k];
      }
      std::int64_t sent = 0;
      for (int to = 0; to < R; ++to)  // row order: the send buffer is grouped by destination
        for (const auto& l : lands) {
          if (l.pool_rank != to / tp) continue;
          for_each_piece(assigned(l), [&](int dr, seq::token_range r) {
            const auto lo = std::max(r.begin, l.rows.begin), hi = std::min(r.end, l.rows.end);
            if (dr != d || lo >= hi) return;
            const auto n = (hi - lo) * wd(l);
            const copy_run run{first_row[static_cast<std::size_t>(l.encoder)].at(l.item) + lo * wd(l), sent,
                               n};
            ex.send.push_back(run);
            if (ex.returns[static_cast<std::size_t>(to)]) ex.back.push_back(run);
            ex.send_counts[static_cast<std::size_t>(to)] += n;
            sent += n;
          });
        }
    }
  }
  return out;
}
#else
    ;
#endif

/// The encoder work under `plan` of the rank at row position `row_position` (pool rank x tp + tp rank) of
/// pipeline rank `pipeline_rank` (train::system::run): the encoders' row widths (row_width of each
/// encoder's first landing), the shards the pipeline rank runs, and plan_encoder_work over the plan's
/// encoder domain. `bound`: the run's encoder_bindings.
template <class... Encoders>
encoder_work encoder_work_for(const step_layout& plan, int row_position, int pipeline_rank,
                              std::tuple<Encoders...>& bound) {
  const int E = plan.pipeline.num_encoder_shards();
  std::vector<std::int64_t> widths(sizeof...(Encoders), 0);
  for (const auto& slot : plan.encoder_landings)  // each encoder's output elements per token
    for (const auto& l : slot)
      if (auto& w = widths[static_cast<std::size_t>(l.encoder)]; w == 0) {
        const model::encoder_batch probe{
            l.encoder, 0, 0, {{l.item, l.item_tokens, {0, l.item_tokens}, 0, 1, 0}}, l.item_tokens};
        w = std::apply([&](auto&... e) { return row_width(l.encoder, probe, e...); }, bound);
      }
  std::vector<char> runs_shard(static_cast<std::size_t>(E), 0);
  for (int e = 0; e < E; ++e)
    runs_shard[static_cast<std::size_t>(e)] =
        plan.pipeline.encoder_shard_to_rank[static_cast<std::size_t>(e)] == pipeline_rank;
  auto domain = plan.encoder_domain;
  domain.resize(std::max(domain.size(), plan.encoder_landings.size()));
  for (auto& slot : domain) slot.resize(sizeof...(Encoders));
  return plan_encoder_work(plan, domain, E, row_position, widths, runs_shard);
}

}  // namespace hetmesh::train::detail
