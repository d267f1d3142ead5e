// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: decentralized grouped reordering -- the runtime half (the plan is
// balance::plan_grouped_reorder in balance/reorder.hpp). Collective over one locality
// group's communicator: all-gather the members' sample metadata (a few int64 per sample), compute the
// same balance::reorder_plan on every member, check at the collective assertion level that the plans agree,
// then move every parcel (a sample's LLM part, or one encoder item) to its planned rank with two
// all_to_all_v calls: one of (id, item, size) headers, whose counts every member knows from the plan,
// then one of the payloads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../balance/reorder.hpp"
#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../seq/sample.hpp"
#include "agreement.hpp"

namespace hetmesh::run {

/// A piece of a sample that moves as one: item = -1 is the sample's LLM part (its text), item k >= 0
/// its k-th encoder item's input.
template <class T>
struct parcel {
  std::int64_t sample_id = 0;  ///< sample it belongs to
  int item = -1;               ///< item index; -1: the sample's LLM part
  std::vector<T> data;         ///< its payload
  friend bool operator==(const parcel&, const parcel&) = default;
  void hash_append(hasher& h) const { append_all(h, sample_id, item, data); }
};

/// What a member holds after the exchange: the group's plan (with the gathered lengths:
/// plan.tokens, plan.item_tokens), the group's gathered sample records, and the parcels now on this
/// rank, ordered by (sample id, item).
template <class T>
struct reorder_result {
  balance::reorder_plan plan;             ///< the plan executed
  std::vector<seq::sample_meta> samples;  ///< the group's records as gathered, in canonical (id) order
  std::vector<parcel<T>> received;        ///< parcels this rank received, in plan order
};

/// Wire form of metadata: per sample [id, tokens, item count, item tokens...]. The owner is
/// implied by the sender; `bytes` does not travel. O(total items).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> encode_meta(
    std::span<const seq::sample_meta> samples)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> out;
  for (const auto& s : samples) {
    out.push_back(s.id);
    out.push_back(s.tokens);
    out.push_back(static_cast<std::int64_t>(s.item_tokens.size()));
    out.insert(out.end(), s.item_tokens.begin(), s.item_tokens.end());
  }
  return out;
}
#else
    ;
#endif

/// Inverse of encode_meta, stamping `owner`. Throws data_error on a truncated record.
[[nodiscard]] HETMESH_COMPILED std::vector<seq::sample_meta> decode_meta(std::span<const std::int64_t> wire,
                                                                         int owner)
#if HETMESH_BODIES
{
  std::vector<seq::sample_meta> out;
  std::size_t k = 0;
  while (k < wire.size()) {
    if (k + 3 > wire.size() || wire[k + 2] < 0 || k + 3 + static_cast<std::size_t>(wire[k + 2]) > wire.size())
      throw_error<data_error>(
          "run::decode_meta: truncated record at word {} of {} from rank {}; expected [id, "
          "tokens, n, n item sizes]",
          k, wire.size(), owner);
    seq::sample_meta s;
    s.id = wire[k];
    s.owner = owner;
    s.tokens = wire[k + 1];
    const auto n = static_cast<std::size_t>(wire[k + 2]);
    s.item_tokens.assign(wire.begin() + static_cast<std::ptrdiff_t>(k + 3),
                         wire.begin() + static_cast<std::ptrdiff_t>(k + 3 + n));
    k += 3 + n;
    out.push_back(std::move(s));
  }
  return out;
}
#else
    ;
#endif

namespace detail {
HETMESH_COMPILED std::vector<std::int64_t> displs_of(std::span<const std::int64_t> counts)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
#else
    ;
#endif
}  // namespace detail

/// Collective over `c` (one locality group): every member passes the metadata of the samples it
/// loaded and exactly one parcel per LLM part and per encoder item of those samples.
/// Pre: sample ids unique across the group; parcels match the local metadata (invalid_argument naming
/// the first stray or missing parcel). Post: every parcel of the group is on exactly the rank the plan
/// names (returned in (id, item) order, payload intact); the plan is equal on every member (checked
/// at the collective assertion level). Deterministic. Cost: one all_gather_vectors of the metadata,
/// planning O(n log n), two all_to_all_v (headers, payloads).
template <comm::communicator C, class T>
[[nodiscard]] reorder_result<T> grouped_reorder(C& c, std::span<const seq::sample_meta> local,
                                                std::span<const parcel<T>> parcels,
                                                const balance::reorder_policy& policy = {}) {
  static_assert(comm::host_communicator<C>,
                "run::grouped_reorder moves parcels through host vectors: it needs a comm::host_communicator "
                "(loopback, mpi), not a device communicator");
  const int me = c.rank();
  const auto n = static_cast<std::size_t>(c.size());
  const auto wire = encode_meta(local);
  const auto gathered = comm::all_gather_vectors(c, std::span<const std::int64_t>(wire));
  std::vector<seq::sample_meta> all;
  for (std::size_t j = 0; j < n; ++j) {
    auto part = decode_meta(gathered[j], static_cast<int>(j));
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  reorder_result<T> out;
  out.plan = balance::plan_grouped_reorder(all, static_cast<int>(n), policy);
  assert_plan_agreement(c, out.plan, "grouped reorder plan");
  std::sort(all.begin(), all.end(),
            [](const seq::sample_meta& a, const seq::sample_meta& b) { return a.id < b.id; });
  out.samples = std::move(all);
  const auto& plan = out.plan;

  // Bucket local parcels by destination, each bucket in (id, item) order; check exactly-once locally.
  std::vector<const parcel<T>*> mine;
  for (const auto& p : parcels) mine.push_back(&p);
  std::sort(mine.begin(), mine.end(), [](const parcel<T>* a, const parcel<T>* b) {
    return a->sample_id != b->sample_id ? a->sample_id < b->sample_id : a->item < b->item;
  });
  std::vector<std::vector<const parcel<T>*>> to(n);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const auto& p = *mine[k];
    const auto i = plan.index_of(p.sample_id);
    if (i < 0 || plan.owner[static_cast<std::size_t>(i)] != me)
      throw_error<invalid_argument>(
          "run::grouped_reorder: rank {} holds a parcel of sample {}, which it did not "
          "load; expected parcels only of local samples",
          me, p.sample_id);
    if (k > 0 && mine[k - 1]->sample_id == p.sample_id && mine[k - 1]->item == p.item)
      throw_error<invalid_argument>("run::grouped_reorder: rank {} holds parcel (sample {}, item {}) twice",
                                    me, p.sample_id, p.item);
    to[static_cast<std::size_t>(plan.destination(p.sample_id, p.item))].push_back(&p);
  }
  for (std::size_t j = 0; j < n; ++j)
    if (static_cast<std::int64_t>(to[j].size()) != plan.parcels[static_cast<std::size_t>(me) * n + j])
      throw_error<invalid_argument>(
          "run::grouped_reorder: rank {} has {} parcels for rank {}; the plan expects {} "
          "(one per LLM part and encoder item of the local samples)",
          me, to[j].size(), j, plan.parcels[static_cast<std::size_t>(me) * n + j]);

  // Headers (id, item, size): counts known from the plan on both sides.
  std::vector<std::int64_t> hsend, hsc(n), hrc(n);
  std::vector<T> dsend;
  std::vector<std::int64_t> dsc(n, 0);
  for (std::size_t j = 0; j < n; ++j) {
    hsc[j] = 3 * static_cast<std::int64_t>(to[j].size());
    hrc[j] = 3 * plan.parcels[j * n + static_cast<std::size_t>(me)];
    for (const auto* p : to[j]) {
      hsend.insert(hsend.end(), {p->sample_id, p->item, static_cast<std::int64_t>(p->data.size())});
      dsend.insert(dsend.end(), p->data.begin(), p->data.end());
      dsc[j] += static_cast<std::int64_t>(p->data.size());
    }
  }
  std::vector<std::int64_t> hrecv(
      static_cast<std::size_t>(std::accumulate(hrc.begin(), hrc.end(), std::int64_t{0})));
  const auto hsd = detail::displs_of(hsc), hrd = detail::displs_of(hrc);
  comm::all_to_all_v(c, std::span<const std::int64_t>(hsend), std::span<const std::int64_t>(hsc),
                     std::span<const std::int64_t>(hsd), std::span<std::int64_t>(hrecv),
                     std::span<const std::int64_t>(hrc), std::span<const std::int64_t>(hrd));
  std::vector<std::int64_t> drc(n, 0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::int64_t k = hrd[j]; k < hrd[j] + hrc[j]; k += 3)
      drc[j] += hrecv[static_cast<std::size_t>(k + 2)];
  std::vector<T> drecv(static_cast<std::size_t>(std::accumulate(drc.begin(), drc.end(), std::int64_t{0})));
  const auto dsd = detail::displs_of(dsc), drd = detail::displs_of(drc);
  comm::all_to_all_v(c, std::span<const T>(dsend), std::span<const std::int64_t>(dsc),
                     std::span<const std::int64_t>(dsd), std::span<T>(drecv),
                     std::span<const std::int64_t>(drc), std::span<const std::int64_t>(drd));
  std::size_t at = 0;
  for (std::size_t k = 0; k < hrecv.size(); k += 3) {
    parcel<T> p;
    p.sample_id = hrecv[k];
    p.item = static_cast<int>(hrecv[k + 1]);
    const auto len = static_cast<std::size_t>(hrecv[k + 2]);
    p.data.assign(drecv.begin() + static_cast<std::ptrdiff_t>(at),
                  drecv.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
    out.received.push_back(std::move(p));
  }
  std::sort(out.received.begin(), out.received.end(), [](const parcel<T>& a, const parcel<T>& b) {
    return a.sample_id != b.sample_id ? a.sample_id < b.sample_id : a.item < b.item;
  });
  return out;
}

}  // namespace hetmesh::run
