// SPDX-License-Identifier: Apache-2.0
// run::long_short_attention_forward/backward on 4 loopback ranks: encoder items placed by
// seq::plan_long_short (short ones whole, long ones split over Ulysses groups of 2 or 4 ranks), every
// rank's out, lse, dq, dk, dv rows equal to full attention over the whole item on one rank (GQA and MQA);
// the same calls over comm::emulated_device with model::emulated_device_memory (the device path) equal
// the host run bit for bit, the kernel receiving emulated device tensors and host metadata; a piece that
// is not the planner's split is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/group_cache.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/long_short_attention.hpp>
#include <hetmesh/seq/long_short.hpp>

#include "emulated_kernel.hpp"

using namespace hetmesh;

namespace {

/// A verifiable value of (tensor, item, token, column) in [-0.5, 0.5).
double val(std::uint64_t tensor, std::int64_t item, std::int64_t token, std::int64_t col) {
  return static_cast<double>(key_hash({tensor, static_cast<std::uint64_t>(item),
                                       static_cast<std::uint64_t>(token), static_cast<std::uint64_t>(col)}) >>
                             11) *
             0x1.0p-53 -
         0.5;
}

/// Rows [begin, end) of item `item` of tensor `tensor`, `width` columns each.
std::vector<double> rows(std::uint64_t tensor, std::int64_t item, seq::token_range r, int width) {
  std::vector<double> out;
  for (std::int64_t t = r.begin; t < r.end; ++t)
    for (int c = 0; c < width; ++c) out.push_back(val(tensor, item, t, c));
  return out;
}

struct whole_item {
  std::vector<double> out, lse, dq, dk, dv;
};

/// Full attention over the whole item on one rank: the reference.
whole_item reference(const model::attention_shape& shape, std::int64_t item, std::int64_t length) {
  const int qw = shape.q_heads * shape.head_dim, kw = shape.kv_heads * shape.head_dim;
  const seq::token_range all{0, length};
  const auto q = rows(0, item, all, qw), k = rows(1, item, all, kw), v = rows(2, item, all, kw),
             dout = rows(3, item, all, qw);
  const std::vector<std::int64_t> doc(static_cast<std::size_t>(length), item);
  std::vector<std::int64_t> pos(doc.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int64_t>(i);
  model::attention_block<double> b{shape, q, k, v, doc, pos, doc, pos, seq::block_mask::full, 0.5};
  whole_item w;
  w.out.resize(q.size()), w.lse.resize(doc.size() * shape.q_heads);
  const model::reference_attention kernel;
  kernel.forward(b, model::attention_forward_out<double>{w.out, w.lse});
  std::vector<double> delta(w.lse.size());
  seq::attention_delta(std::span<const double>(w.out), std::span<const double>(dout),
                       std::span<double>(delta), static_cast<std::size_t>(shape.head_dim));
  w.dq.assign(q.size(), 0.0), w.dk.assign(k.size(), 0.0), w.dv.assign(v.size(), 0.0);
  kernel.backward(b, model::attention_backward_io<double>{dout, w.lse, delta, w.dq, w.dk, w.dv});
  return w;
}

/// Outputs of the forward and backward on one rank.
struct result {
  std::vector<double> out, lse, dq, dk, dv;
};

/// A rank's run over the device path: the inputs uploaded to emulated device memory, the groups
/// comm::emulated_device over the loopback ones, the kernel emulated_reference_kernel; outputs downloaded.
result run_on_device(comm::loopback::communicator& c, const model::encoder_batch_view& v,
                     const model::attention_shape& shape, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& vv,
                     const std::vector<double>& dout) {
  using device_comm = comm::emulated_device<comm::loopback::communicator>;
  device_comm dc(c);
  comm::group_cache<device_comm> groups(dc);
  auto group_of = [&](const model::encoder_piece& p) -> device_comm& {
    std::vector<int> members;
    for (int t = 0; t < p.degree; ++t) members.push_back(c.rank() - p.group_rank + t);
    return groups.get(std::span<const int>(members));
  };
  model::emulated_device_memory mem;
  runtest::emulated_reference_kernel kernel;
  const auto qd = runtest::upload(mem, q), kd = runtest::upload(mem, k), vd = runtest::upload(mem, vv),
             doutd = runtest::upload(mem, dout);
  model::emulated_device_memory::buffer<double> out, lse, dq, dk, dv;
  out.resize(q.size()), lse.resize(q.size() / static_cast<std::size_t>(shape.head_dim));
  dq.resize(q.size()), dk.resize(k.size()), dv.resize(vv.size());
  const run::long_short_attention_input<double> in{shape, 0.5, qd.span(), kd.span(), vd.span()};
  run::long_short_attention_forward(group_of, v, kernel, in, out.span(), lse.span(), mem);
  run::long_short_attention_backward(group_of, v, kernel, in, std::span<const double>(out.span()),
                                     std::span<const double>(lse.span()), doutd.span(), dq.span(), dk.span(),
                                     dv.span(), mem);
  CHECK(kernel.calls == 2 * static_cast<std::int64_t>(v.pieces.size()));
  CHECK(kernel.device_tensors > 0);
  CHECK_MESSAGE(kernel.host_tensors == 0, "rank ", c.rank(), ": the kernel got host tensors");
  CHECK_MESSAGE(kernel.device_metadata == 0, "rank ", c.rank(), ": the kernel got device metadata");
  auto get = [&](const model::emulated_device_memory::buffer<double>& b) {
    return runtest::download(mem, b.span());
  };
  return {get(out), get(lse), get(dq), get(dk), get(dv)};
}

/// Items `items` placed on 4 ranks by seq::plan_long_short for heads of `shape`: on every rank, the host
/// run equals whole-item attention (1e-12), the device run equals the host run bit for bit, and a piece
/// that is not the planner's split is refused.
void long_short_case(const std::vector<seq::seq_desc>& items, const model::attention_shape& shape) {
  const seq::long_short_policy pol{.max_tokens_per_rank = 24,
                                   .heads = shape.q_heads,
                                   .min_split_tokens = 0,  // these items are short: split them for balance
                                   .cluster = {.devices_per_node = 4},
                                   .balance_factor = 0.5};
  const auto plan = seq::plan_long_short(items, 4, pol);
  int split = 0, whole = 0;
  for (const auto& a : plan.items) (a.degree > 1 ? split : whole) += 1;
  REQUIRE(split >= 2);  // at least two items run over groups
  REQUIRE(whole >= 1);  // and some whole
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    const auto batch = model::make_encoder_batch(plan, 0, c.rank());
    const auto v = batch.view();
    const int qw = shape.q_heads * shape.head_dim, kw = shape.kv_heads * shape.head_dim;
    std::vector<double> q, k, vv, dout;
    for (const auto& p : v.pieces) {
      for (auto [t, dst, w] : {std::tuple{0u, &q, qw}, {1u, &k, kw}, {2u, &vv, kw}, {3u, &dout, qw}}) {
        const auto r = rows(t, p.item, p.tokens, w);
        dst->insert(dst->end(), r.begin(), r.end());
      }
    }
    comm::group_cache<comm::loopback::communicator> groups(c);
    auto group_of = [&](const model::encoder_piece& p) -> comm::loopback::communicator& {
      std::vector<int> members;
      for (int t = 0; t < p.degree; ++t) members.push_back(c.rank() - p.group_rank + t);
      return groups.get(std::span<const int>(members));
    };
    const model::reference_attention kernel;
    const run::long_short_attention_input<double> in{shape, 0.5, q, k, vv};
    std::vector<double> out(q.size()), lse(q.size() / static_cast<std::size_t>(shape.head_dim));
    run::long_short_attention_forward(group_of, v, kernel, in, std::span<double>(out),
                                      std::span<double>(lse));
    std::vector<double> dq(q.size()), dk(k.size()), dv(vv.size());
    run::long_short_attention_backward(group_of, v, kernel, in, std::span<const double>(out),
                                       std::span<const double>(lse), std::span<const double>(dout),
                                       std::span<double>(dq), std::span<double>(dk), std::span<double>(dv));
    double worst = 0.0;
    auto compare = [&](const std::vector<double>& got, const std::vector<double>& want, std::int64_t at,
                       seq::token_range r, int width) {
      for (std::int64_t t = r.begin; t < r.end; ++t)
        for (int col = 0; col < width; ++col)
          worst = std::max(worst, std::abs(got[static_cast<std::size_t>((at + t - r.begin) * width + col)] -
                                           want[static_cast<std::size_t>(t * width + col)]));
    };
    for (const auto& p : v.pieces) {
      const auto ref = reference(shape, p.item, p.item_tokens);
      compare(out, ref.out, p.offset, p.tokens, qw);
      compare(lse, ref.lse, p.offset, p.tokens, shape.q_heads);
      compare(dq, ref.dq, p.offset, p.tokens, qw);
      compare(dk, ref.dk, p.offset, p.tokens, kw);
      compare(dv, ref.dv, p.offset, p.tokens, kw);
    }
    CHECK_MESSAGE(worst <= 1e-12, "rank ", c.rank(), ": largest difference ", worst);
    // The device path: bit for bit the host run.
    const auto dev = run_on_device(c, v, shape, q, k, vv, dout);
    CHECK_MESSAGE(runtest::bitwise_equal(dev.out, out), "out on rank ", c.rank());
    CHECK_MESSAGE(runtest::bitwise_equal(dev.lse, lse), "lse on rank ", c.rank());
    CHECK_MESSAGE(runtest::bitwise_equal(dev.dq, dq), "dq on rank ", c.rank());
    CHECK_MESSAGE(runtest::bitwise_equal(dev.dk, dk), "dk on rank ", c.rank());
    CHECK_MESSAGE(runtest::bitwise_equal(dev.dv, dv), "dv on rank ", c.rank());
    // A piece that is not the planner's split (shifted by a token) is refused, naming the item.
    if (!v.pieces.empty() && v.pieces[0].degree > 1) {
      auto bad = batch;
      bad.pieces[0].tokens.begin += 1;
      CHECK_THROWS_WITH_AS(run::long_short_attention_forward(group_of, bad.view(), kernel, in,
                                                             std::span<double>(out), std::span<double>(lse)),
                           doctest::Contains("contiguous split"), invalid_argument);
    }
  });
}

}  // namespace

TEST_CASE(
    "long-short attention: split items by Ulysses over their groups equal whole-item attention, on "
    "host and emulated device memory") {
  const std::vector<seq::seq_desc> items{{1, 23}, {2, 5}, {3, 11}, {4, 2}, {5, 17}, {6, 1}, {7, 8}};
  // GQA (two query heads per KV head; KV heads split over groups of 2, replicated over groups of 4) and
  // MQA (one KV head on every rank of a group).
  for (const model::attention_shape shape :
       {model::attention_shape{4, 2, 3}, model::attention_shape{4, 1, 2}}) {
    CAPTURE(shape.kv_heads);
    long_short_case(items, shape);
  }
}
