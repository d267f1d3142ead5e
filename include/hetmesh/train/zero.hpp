// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: ZeRO stage 1, the distributed optimizer (Rajbhandari et al., "ZeRO", SC'20; Megatron-LM's
// distributed optimizer). A parameter group (a backbone stage's tensors, or an encoder's) is flattened into
// buckets; each bucket's gradients are reduce-scattered over the group's data-parallel ranks (the pool for
// the backbone, the whole encoder domain for the encoders), each rank runs the inner optimizer on its
// shard (so the optimizer's state, e.g. Adam's moments, is 1/P of the replicated state), and the updated
// shards are all-gathered back into every rank's parameters.
//
//   train::zero1<train::adam<float>> opt{.inner = {.lr = 1e-3F}, .bucket_bytes = 16 << 20};
//   sys.run(plan, batch, model.llm, opt, train::bind_encoder(model.vision, input));
//
// Elementwise optimizers (sgd, adam) give the same bits as the replicated step when the reduction adds in
// the same order (loopback; `system_options::reproducible` on any backend).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../model/host_memory.hpp"
#include "../model/memory_policy.hpp"
#include "optimizer.hpp"

namespace hetmesh::train {

/// An optimizer that train::system::run shards over each parameter group's data-parallel ranks: it is
/// called as `o.step(comm, mem, parameters, gradients, in_rank_order)` (collective over comm) in place of
/// the gradient all-reduce and the replicated hook call. Opt-in: `typename O::is_sharded_optimizer`.
template <class O>
concept sharded_optimizer = requires {
  typename std::remove_cvref_t<O>::is_sharded_optimizer;
};

/// The bytes of state an optimizer hook holds: `o.state_bytes()` when it declares it (train::adam: its
/// moments; train::zero1: its inner optimizer's), else 0 (train::sgd, or a hook that does not say).
template <class O>
[[nodiscard]] std::int64_t optimizer_state_bytes(const O& o) {
  if constexpr (requires {
                  { o.state_bytes() } -> std::convertible_to<std::int64_t>;
                })
    return static_cast<std::int64_t>(o.state_bytes());
  else
    return 0;
}

/// How a group of `elements` parameters is sharded over `ranks` ranks: buckets of `bucket` elements (the
/// last may be shorter), each padded to a multiple of `ranks` and cut into `ranks` equal slices; rank r
/// owns slice r of every bucket. Element i of the flattened group sits at padded position
/// (i / bucket) * padded(0) + i % bucket. Plain arithmetic, O(1) per call.
struct shard_layout {
  /// ceil(a / b) for a >= 0, b >= 1.
  [[nodiscard]] static constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
    return (a + b - 1) / b;
  }
  std::int64_t elements = 0;  ///< parameters of the group
  std::int64_t bucket = 1;    ///< elements per bucket, >= 1
  int ranks = 1;              ///< data-parallel ranks, >= 1

  /// Number of buckets.
  [[nodiscard]] std::int64_t buckets() const noexcept {
    return elements == 0 ? 0 : ceil_div(elements, bucket);
  }
  /// Elements of bucket b (unpadded).
  [[nodiscard]] std::int64_t bucket_size(std::int64_t b) const noexcept {
    return std::min(bucket, elements - b * bucket);
  }
  /// Elements of one rank's slice of bucket b.
  [[nodiscard]] std::int64_t slice(std::int64_t b) const noexcept { return ceil_div(bucket_size(b), ranks); }
  /// Bucket b's padded size (ranks x slice(b)).
  [[nodiscard]] std::int64_t padded(std::int64_t b) const noexcept { return slice(b) * ranks; }
  /// Where bucket b starts in the padded flat buffer.
  [[nodiscard]] std::int64_t padded_offset(std::int64_t b) const noexcept { return b * padded(0); }
  /// Where bucket b's slice starts in a rank's shard.
  [[nodiscard]] std::int64_t shard_offset(std::int64_t b) const noexcept { return b * slice(0); }
  /// Elements of the padded flat buffer.
  [[nodiscard]] std::int64_t padded_elements() const noexcept {
    return buckets() == 0 ? 0 : padded_offset(buckets() - 1) + padded(buckets() - 1);
  }
  /// Elements of one rank's shard (padding included).
  [[nodiscard]] std::int64_t shard_elements() const noexcept {
    return buckets() == 0 ? 0 : shard_offset(buckets() - 1) + slice(buckets() - 1);
  }
  /// f(first, at, count) for each run of the flattened group's elements [offset, offset + size) that rank
  /// `rank` owns, in order: the run's first element relative to `offset`, where the run sits in the rank's
  /// shard, and its length (padding is never in a run). O(buckets the range spans).
  template <class F>
  void owned_runs(int rank, std::int64_t offset, std::int64_t size, F&& f) const {
    if (size <= 0) return;
    for (std::int64_t b = offset / bucket; b <= (offset + size - 1) / bucket; ++b) {
      const std::int64_t base = b * bucket, mine = rank * slice(b);
      const std::int64_t lo = std::max(offset, base + std::min(bucket_size(b), mine));
      const std::int64_t hi = std::min(offset + size, base + std::min(bucket_size(b), mine + slice(b)));
      if (lo < hi) f(lo - offset, shard_offset(b) + lo - base - mine, hi - lo);
    }
  }
  friend bool operator==(const shard_layout&, const shard_layout&) = default;
};

/// ZeRO-1: `inner` (an optimizer hook over spans of `Inner::value_type`, e.g. train::adam<float>) run on
/// this rank's shard of each parameter group, with gradients reduce-scattered and parameters all-gathered
/// in buckets of `bucket_bytes`. State per group (keyed by the group's first tensor's storage, which a
/// model keeps in place across steps): the shard's parameters and gradients (each 1/P of the group) and the
/// inner optimizer's state for them. After a step the parameters are equal on every rank; the gradient
/// tensors hold this rank's unreduced gradients, or, with `keep_full_gradients`, the reduced ones (one
/// more all-gather per bucket: for parity checks). M: where the buffers live (the system's memory policy).
/// Checkpoints (train/checkpoint_state.hpp) read each group's tensors and rank at its last step, and hand
/// restored Adam moments over through `pending`, which the next step of the group slices to its shard.
template <class Inner, model::memory_policy M = model::host_memory>
struct zero1 {
  /// Marks the type as sharded (train::sharded_optimizer).
  using is_sharded_optimizer = void;
  /// The element type of the parameters.
  using value_type = typename Inner::value_type;

  Inner inner{};                                       ///< the optimizer run on each shard
  std::int64_t bucket_bytes = std::int64_t{16} << 20;  ///< bucket size of the reduce-scatter / all-gather
  bool keep_full_gradients = false;  ///< all-gather the reduced gradients back into the tensors

  /// The inner optimizer's state bytes (its moments for this rank's shards).
  [[nodiscard]] std::int64_t state_bytes() const { return optimizer_state_bytes(inner); }

  /// One step of the group (`parameters`, `gradients`: ranges of std::span<value_type>, same order and
  /// sizes, identical layout on every rank of c): reduce-scatter the gradients (sum; in rank order when
  /// `in_rank_order`, through an all-to-all), step the shard, all-gather the parameters. Collective over c.
  /// Errors: mismatched sizes, a bucket_bytes below one element (invalid_argument); the collectives'.
  template <comm::communicator C, class Params, class Grads>
  void step(C& c, const M& mem, Params&& parameters, Grads&& gradients, bool in_rank_order) {
    std::vector<std::span<value_type>> ps, gs;
    for (auto p : parameters) ps.emplace_back(p);
    for (auto g : gradients) gs.emplace_back(g);
    if (ps.size() != gs.size())
      throw_error<invalid_argument>(
          "train::zero1: {} gradient tensors for {} parameter tensors; expected equal", gs.size(), ps.size());
    std::int64_t n = 0;
    for (std::size_t k = 0; k < ps.size(); ++k) {
      if (ps[k].size() != gs[k].size())
        throw_error<invalid_argument>(
            "train::zero1: tensor {} has {} gradients for {} parameters; expected equal", k, gs[k].size(),
            ps[k].size());
      n += static_cast<std::int64_t>(ps[k].size());
    }
    const auto elem = static_cast<std::int64_t>(sizeof(value_type));
    if (bucket_bytes < elem)
      throw_error<invalid_argument>("train::zero1: bucket_bytes {}; expected at least one element ({} bytes)",
                                    bucket_bytes, elem);
    group& g = groups[ps.empty() ? nullptr : static_cast<const void*>(ps.front().data())];
    const shard_layout l{n, bucket_bytes / elem, c.size()};
    if (!(g.layout == l)) g.reset(l);
    g.tensors.assign(ps.begin(), ps.end());
    g.rank = c.rank();
    if (!pending.empty()) take_pending(g, ps);
    const auto me = static_cast<std::int64_t>(c.rank());
    // Gradients: flatten, reduce-scatter bucket by bucket into this rank's shard.
    flatten(mem, g, gs);
    for (std::int64_t b = 0; b < l.buckets(); ++b) {
      const auto send =
          std::span<const value_type>(g.flat.span()).subspan(at(l.padded_offset(b)), at(l.padded(b)));
      const auto mine = g.grads.span().subspan(at(l.shard_offset(b)), at(l.slice(b)));
      if (!in_rank_order) {
        comm::reduce_scatter(c, send, mine, comm::reduce_op::sum);
        continue;
      }
      const auto blocks = g.scratch.span().first(at(l.padded(b)));
      comm::all_to_all(c, send, blocks);  // block r: rank r's slice me
      mem.copy(mine, std::span<const value_type>(blocks.first(mine.size())));
      for (int r = 1; r < c.size(); ++r)
        mem.add(mine, std::span<const value_type>(blocks.subspan(at(r * l.slice(b)), mine.size())));
    }
    // Parameters: this rank's slices of the current parameters, stepped by the inner optimizer.
    flatten(mem, g, ps);
    for (std::int64_t b = 0; b < l.buckets(); ++b)
      mem.copy(g.params.span().subspan(at(l.shard_offset(b)), at(l.slice(b))),
               std::span<const value_type>(g.flat.span())
                   .subspan(at(l.padded_offset(b) + me * l.slice(b)), at(l.slice(b))));
    inner(std::array<std::span<value_type>, 1>{g.params.span()},
          std::array<std::span<value_type>, 1>{g.grads.span()});
    gather(c, mem, g, g.params.span(), ps);
    if (keep_full_gradients) gather(c, mem, g, g.grads.span(), gs);
  }

  /// One parameter group's buffers: its layout, the padded flat buffer (and an all-to-all scratch bucket),
  /// and this rank's shard of the parameters and of the reduced gradients.
  struct group {
    shard_layout layout{};                            ///< how the group is sharded
    typename M::template buffer<value_type> flat;     ///< the padded flat buffer
    typename M::template buffer<value_type> params;   ///< this rank's shard of the parameters
    typename M::template buffer<value_type> grads;    ///< this rank's shard of the reduced gradients
    typename M::template buffer<value_type> scratch;  ///< one bucket, for the rank-order reduction
    std::vector<std::span<value_type>> tensors;       ///< the group's tensors at its last step, in order
    int rank = 0;                                     ///< this rank in the group's communicator then
    /// Sizes the buffers for `l`.
    void reset(const shard_layout& l) {
      layout = l;
      flat.resize(at(l.padded_elements()));
      params.resize(at(l.shard_elements()));
      grads.resize(at(l.shard_elements()));
      scratch.resize(at(l.buckets() == 0 ? 0 : l.padded(0)));
    }
  };

 private:
  static std::size_t at(std::int64_t i) noexcept { return static_cast<std::size_t>(i); }

  // The pending moments of the group's tensors (all of them, or none), sliced to this rank's shard and
  // handed to the inner optimizer; then no longer pending. Checks everything before changing anything.
  void take_pending(group& g, const std::vector<std::span<value_type>>& ps) {
    std::size_t found = 0;
    for (const auto& p : ps) found += pending.count(p.data());
    if (found == 0) return;
    if constexpr (!requires(Inner & i, std::span<const value_type> s) { i.moments(s).t; }) {
      throw_error<invalid_argument>(
          "train::zero1: restored Adam moments for an inner optimizer that keeps none; expected an Adam");
    } else {
      if (found != ps.size())
        throw_error<invalid_argument>(
            "train::zero1: restored state for {} of a group's {} tensors; expected all of them (restore "
            "every tensor the optimizer steps)",
            found, ps.size());
      const shard_layout& l = g.layout;
      std::vector<value_type> m(at(l.shard_elements()), value_type(0)), v(m.size(), value_type(0));
      const std::int64_t t = pending.at(ps.front().data()).t;
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < ps.size(); ++k) {
        const auto& s = pending.at(ps[k].data());
        if (s.t != t)
          throw_error<data_error>(
              "train::zero1: restored Adam steps {} (tensor 0 of the group) and {} (tensor {}); expected one "
              "step count per parameter group",
              t, s.t, k);
        if (s.m.size() != ps[k].size() || s.v.size() != ps[k].size())
          throw_error<invalid_argument>(
              "train::zero1: restored moments of {} elements for tensor {} of {}; expected equal", s.m.size(),
              k, ps[k].size());
        l.owned_runs(g.rank, offset, static_cast<std::int64_t>(ps[k].size()),
                     [&](std::int64_t first, std::int64_t pos, std::int64_t n) {
                       std::copy_n(s.m.begin() + first, n, m.begin() + pos);
                       std::copy_n(s.v.begin() + first, n, v.begin() + pos);
                     });
        offset += static_cast<std::int64_t>(ps[k].size());
      }
      auto& st = inner.moments(g.params.span());
      st.m = std::move(m);
      st.v = std::move(v);
      st.t = t;
      for (const auto& p : ps) pending.erase(p.data());
    }
  }

  // g.flat = the tensors `ts` one after the other at their padded positions, padding zero.
  static void flatten(const M& mem, group& g, const std::vector<std::span<value_type>>& ts) {
    mem.fill(g.flat.span(), value_type(0));
    walk(g.layout, ts, [&](std::span<value_type> t, std::int64_t pos) {
      mem.copy(g.flat.span().subspan(at(pos), t.size()), std::span<const value_type>(t));
    });
  }

  // Every rank's `shard` into g.flat (all-gather per bucket), then g.flat back into the tensors `ts`.
  template <class C>
  static void gather(C& c, const M& mem, group& g, std::span<value_type> shard,
                     const std::vector<std::span<value_type>>& ts) {
    const shard_layout& l = g.layout;
    for (std::int64_t b = 0; b < l.buckets(); ++b)
      comm::all_gather(c, std::span<const value_type>(shard.subspan(at(l.shard_offset(b)), at(l.slice(b)))),
                       g.flat.span().subspan(at(l.padded_offset(b)), at(l.padded(b))));
    walk(l, ts, [&](std::span<value_type> t, std::int64_t pos) {
      mem.copy(t, std::span<const value_type>(g.flat.span().subspan(at(pos), t.size())));
    });
  }

  // f(piece of a tensor, its padded position) over every tensor, cut at bucket boundaries.
  template <class F>
  static void walk(const shard_layout& l, const std::vector<std::span<value_type>>& ts, F&& f) {
    std::int64_t i = 0;  // flat index of the next element
    for (const auto& t : ts) {
      std::size_t done = 0;
      while (done < t.size()) {
        const std::int64_t b = i / l.bucket, o = i % l.bucket;
        const auto take = std::min<std::size_t>(t.size() - done, at(l.bucket - o));
        f(t.subspan(done, take), l.padded_offset(b) + o);
        done += take;
        i += static_cast<std::int64_t>(take);
      }
    }
  }

 public:
  /// Per parameter group, by its first tensor's storage (state the steps keep; the inner optimizer's state
  /// is keyed by the shard buffers', which stay in place).
  std::map<const void*, group> groups{};
  /// Restored Adam moments of whole tensors (each a tensor's full block, keyed by its storage), waiting for
  /// the step of their group, which slices out this rank's shard (train::restore fills it). Empty in a run
  /// that was not restored: the step then pays one emptiness check.
  std::map<const value_type*, adam_moments<value_type>> pending{};
};

}  // namespace hetmesh::train
