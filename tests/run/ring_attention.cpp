// SPDX-License-Identifier: Apache-2.0
// Ring attention on 8 loopback ranks: forward and backward over a zigzag CP ring, THD-packed documents
// and HDP rings (several rings of different sizes at once on one parent communicator) equal single-rank
// full causal attention of the same tokens (double: relative error <= 1e-10; float: <= 1e-5); the
// kernel is called only on blocks with mask != none. The reference kernel's backward matches finite
// differences. The same bodies run under mpirun -np 8 (ring_attention_mpi.cpp). The device path (the
// calls with a memory policy, over comm::emulated_device and model::emulated_device_memory) equals the
// host path bit for bit, its kernel receiving emulated device tensors and host metadata.
#include <doctest/doctest.h>

#include <set>

#include <fmt/ranges.h>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/seq/hdp.hpp>

#include "run/ring_attention_body.hpp"
#include "support/rank0.hpp"

using namespace hetmesh;
using namespace ringtest;

namespace {

std::int64_t total(std::span<const std::int64_t> lens) {
  std::int64_t n = 0;
  for (auto l : lens) n += l;
  return n;
}

/// Loss sum(out * dout) of one block, for finite differences.
double block_loss(const model::attention_block<double>& b, std::span<const double> dout) {
  std::vector<double> out(b.q.size()), lse(b.q_doc.size() * static_cast<std::size_t>(b.shape.q_heads));
  model::reference_attention{}.forward(b, {out, lse});
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
  return l;
}

}  // namespace

TEST_CASE("reference attention: backward matches finite differences (GQA, two documents, both masks)") {
  // 9 query tokens (documents 0 and 1) against 11 keys (documents 0, 1 and 2); positions interleave so
  // that causal blocks are partial; one query row (document 3) sees no key.
  std::vector<std::int64_t> q_doc{0, 0, 0, 0, 1, 1, 1, 1, 3}, q_pos{2, 3, 4, 5, 0, 1, 2, 3, 0};
  std::vector<std::int64_t> k_doc{0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2}, k_pos{0, 1, 2, 4, 6, 0, 2, 3, 0, 1, 2};
  const auto nq = q_doc.size(), nk = k_doc.size();
  auto fill = [](std::uint64_t f, std::size_t n) {
    std::vector<double> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = value(7, static_cast<field>(f), 0, static_cast<std::int64_t>(i), 0, 0);
    return x;
  };
  auto q = fill(fq, nq * kHeads * kDim), k = fill(fk, nk * kKvHeads * kDim),
       v = fill(fv, nk * kKvHeads * kDim), dout = fill(fdout, nq * kHeads * kDim);
  for (auto mask : {seq::block_mask::causal, seq::block_mask::full}) {
    CAPTURE(mask);
    auto block = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                     const std::vector<double>& vv) {
      return model::attention_block<double>{kShape, qq, kk, vv, q_doc, q_pos, k_doc, k_pos, mask, 0.35};
    };
    std::vector<double> out(q.size()), lse(nq * kHeads);
    model::reference_attention kern;
    kern.forward(block(q, k, v), {out, lse});
    // The row of document 3 sees nothing: lse = -inf, out = 0.
    for (int h = 0; h < kHeads; ++h) {
      CHECK(lse[8 * kHeads + static_cast<std::size_t>(h)] == -std::numeric_limits<double>::infinity());
      for (int e = 0; e < kDim; ++e)
        CHECK(out[(8 * kHeads + static_cast<std::size_t>(h)) * kDim + static_cast<std::size_t>(e)] == 0.0);
    }
    std::vector<double> delta(lse.size()), dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    seq::attention_delta(std::span<const double>(out), std::span<const double>(dout),
                         std::span<double>(delta), std::size_t{kDim});
    kern.backward(block(q, k, v), {dout, lse, delta, dq, dk, dv});
    const double h = 1e-6;
    double worst = 0;
    auto fd = [&](std::vector<double>& x, std::size_t i, double analytic) {
      const double keep = x[i];
      x[i] = keep + h;
      const double up = block_loss(block(q, k, v), dout);
      x[i] = keep - h;
      const double down = block_loss(block(q, k, v), dout);
      x[i] = keep;
      const double num = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(num - analytic) / std::max(1.0, std::abs(analytic)));
    };
    for (std::size_t i = 0; i < q.size(); i += 7) fd(q, i, dq[i]);
    for (std::size_t i = 0; i < k.size(); i += 5) fd(k, i, dk[i]);
    for (std::size_t i = 0; i < v.size(); i += 5) fd(v, i, dv[i]);
    MESSAGE("finite differences vs backward, mask ", static_cast<int>(mask), ": worst ", worst);
    CHECK(worst < 1e-7);
    // Something is really checked: gradients are not all zero, and keys of document 2 (no query) get none.
    CHECK(std::abs(dq[0]) > 0);
    for (std::size_t i = 8 * kKvHeads * kDim; i < dk.size(); ++i) CHECK(dk[i] == 0.0);
  }
}

TEST_CASE("reference attention: float and double agree; bad sizes and mask none are refused") {
  std::vector<std::int64_t> doc(6, 0), pos{0, 1, 2, 3, 4, 5};
  std::vector<double> qd(6 * kHeads * kDim), kd(6 * kKvHeads * kDim), vd(kd.size());
  for (std::size_t i = 0; i < qd.size(); ++i) qd[i] = value(3, fq, 0, static_cast<std::int64_t>(i), 0, 0);
  for (std::size_t i = 0; i < kd.size(); ++i) {
    kd[i] = value(3, fk, 0, static_cast<std::int64_t>(i), 0, 0);
    vd[i] = value(3, fv, 0, static_cast<std::int64_t>(i), 0, 0);
  }
  std::vector<float> qf(qd.begin(), qd.end()), kf(kd.begin(), kd.end()), vf(vd.begin(), vd.end());
  std::vector<double> od(qd.size()), ld(6 * kHeads);
  std::vector<float> of(qd.size()), lf(6 * kHeads);
  model::reference_attention kern;
  kern.forward(
      model::attention_block<double>{kShape, qd, kd, vd, doc, pos, doc, pos, seq::block_mask::causal, 0.3},
      {od, ld});
  kern.forward(
      model::attention_block<float>{kShape, qf, kf, vf, doc, pos, doc, pos, seq::block_mask::causal, 0.3f},
      {of, lf});
  for (std::size_t i = 0; i < od.size(); ++i) CHECK(std::abs(od[i] - double(of[i])) < 1e-5);
  CHECK_THROWS_AS(kern.forward(model::attention_block<double>{kShape, qd, kd, vd, doc, pos, doc, pos,
                                                              seq::block_mask::none, 0.3},
                               {od, ld}),
                  invalid_argument);
  CHECK_THROWS_WITH_AS(
      kern.forward(model::attention_block<double>{kShape, std::span<const double>(qd).first(8), kd, vd, doc,
                                                  pos, doc, pos, seq::block_mask::causal, 0.3},
                   {od, ld}),
      doctest::Contains("expected q = tokens*q_heads*head_dim"), invalid_argument);
}

TEST_CASE("ring attention over a zigzag CP ring of 8 equals full causal attention, forward and backward") {
  const std::int64_t len[1] = {96};
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return zigzag_body<double>(c); }), 1e-10, total(len),
                "zigzag cp=8 double");
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return zigzag_body<float>(c); }), 1e-5, total(len),
                "zigzag cp=8 float");
}

TEST_CASE("ring attention over THD-packed documents (padded per document) equals full causal attention") {
  const std::int64_t lens[6] = {7, 11, 5, 20, 1, 30};
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return thd_body<double>(c); }), 1e-10, total(lens),
                "thd cp=4 double");
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return thd_body<float>(c); }), 1e-5, total(lens),
                "thd cp=4 float");
}

TEST_CASE(
    "ring attention over HDP rings of different sizes on one parent communicator equals full attention") {
  // The placements really put rings on different ranks (else the second run would add nothing).
  CHECK(make_hdp_case(5, planner::waves).plan.placement !=
        make_hdp_case(5, planner::least_loaded).plan.placement);
  CHECK(make_hdp_case(5, planner::waves).plan.placement !=
        make_hdp_case(5, planner::bytescale).plan.placement);
  for (auto placement : {planner::waves, planner::least_loaded, planner::bytescale})
    for (std::uint64_t seed : {5u, 6u}) {
      CAPTURE(seed);
      CAPTURE(static_cast<int>(placement));
      const auto h = make_hdp_case(seed, placement);
      // The plan really has several ring sizes and a rank in more than one item.
      std::set<int> degrees;
      bool multi = false;
      for (const auto& it : h.plan.sharding.items) degrees.insert(it.degree);
      std::size_t most_rings = 0;  // rings of more than one rank that one rank belongs to
      for (const auto& mbs : h.plan.per_rank) {
        multi = multi || mbs.size() > 1;
        std::size_t r = 0;
        for (const auto& mb : mbs) r += mb.degree > 1 ? 1 : 0;
        most_rings = std::max(most_rings, r);
      }
      MESSAGE("ring sizes ", fmt::format("{}", degrees), "; a rank is in up to ", most_rings, " rings");
      REQUIRE(degrees.size() >= 3);
      REQUIRE(multi);
      CHECK(most_rings >= 2);
      std::int64_t tokens = 0;
      for (const auto& s : h.seqs) tokens += s.length;
      const auto d = testsupport::rank0_of(8, [&](auto& c) { return hdp_body<double>(c, seed, placement); });
      check_verdict(d, 1e-10, tokens, "hdp double");
      CHECK(d.rings > 0);
      check_verdict(testsupport::rank0_of(8, [&](auto& c) { return hdp_body<float>(c, seed, placement); }),
                    1e-5, tokens, "hdp float");
    }
}

TEST_CASE("ring attention with communication overlapped with compute gives bitwise the same results") {
  const auto a = testsupport::rank0_of(8, [](auto& c) { return zigzag_body<double>(c, false); });
  const auto b = testsupport::rank0_of(8, [](auto& c) { return zigzag_body<double>(c, true); });
  check_verdict(b, 1e-10, 96, "zigzag cp=8 double, overlapped");
  CHECK(a.same_as(b));
  const auto tf = testsupport::rank0_of(8, [](auto& c) { return thd_body<float>(c, false); });
  const auto tt = testsupport::rank0_of(8, [](auto& c) { return thd_body<float>(c, true); });
  CHECK(tf.same_as(tt));
  const auto hf =
      testsupport::rank0_of(8, [](auto& c) { return hdp_body<double>(c, 5, planner::bytescale, false); });
  const auto ht =
      testsupport::rank0_of(8, [](auto& c) { return hdp_body<double>(c, 5, planner::bytescale, true); });
  check_verdict(ht, 1e-10, hf.rows, "hdp double, overlapped");
  CHECK(hf.same_as(ht));
}

TEST_CASE("ring attention over a ring of one rank (no communication) equals full causal attention") {
  const std::int64_t lens[4] = {9, 3, 17, 6};
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return single_body<double>(c); }), 1e-10, total(lens),
                "one rank double");
  check_verdict(testsupport::rank0_of(8, [](auto& c) { return single_body<float>(c); }), 1e-5, total(lens),
                "one rank float");
}

TEST_CASE("ring attention on emulated device memory equals the host path bit for bit, forward and backward") {
  // Static CP rings (zigzag over 8, THD over 4), a ring of one rank, and HDP rings of several sizes with
  // several rings per rank (the *_all entries); causal and full blocks (zigzag and HDP have both);
  // communication overlapped with compute or not. Each body runs the host path, then the device path.
  const std::int64_t zig[1] = {96}, thd[6] = {7, 11, 5, 20, 1, 30}, one[4] = {9, 3, 17, 6};
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    auto check = [&](const verdict& v, double tol, std::int64_t rows, const char* what) {
      check_verdict(v, tol, rows, what);
      check_device(v, 8, what);
    };
    check(testsupport::rank0_of(8, [&](auto& c) { return zigzag_body<double>(c, overlap, true); }), 1e-10,
          total(zig), "device zigzag cp=8 double");
    check(testsupport::rank0_of(8, [&](auto& c) { return zigzag_body<float>(c, overlap, true); }), 1e-5,
          total(zig), "device zigzag cp=8 float");
    check(testsupport::rank0_of(8, [&](auto& c) { return thd_body<double>(c, overlap, true); }), 1e-10,
          total(thd), "device thd cp=4 double");
    check(testsupport::rank0_of(8, [&](auto& c) { return single_body<float>(c, overlap, true); }), 1e-5,
          total(one), "device one rank float");
    for (auto placement : {planner::waves, planner::least_loaded, planner::bytescale}) {
      CAPTURE(static_cast<int>(placement));
      std::int64_t tokens = 0;
      for (const auto& sq : make_hdp_case(5, placement).seqs) tokens += sq.length;
      const auto d =
          testsupport::rank0_of(8, [&](auto& c) { return hdp_body<double>(c, 5, placement, overlap, true); });
      check(d, 1e-10, tokens, "device hdp double");
      CHECK(d.rings > 0);
    }
    std::int64_t tokens = 0;
    for (const auto& sq : make_hdp_case(6, planner::bytescale).seqs) tokens += sq.length;
    check(testsupport::rank0_of(
              8, [&](auto& c) { return hdp_body<float>(c, 6, planner::bytescale, overlap, true); }),
          1e-5, tokens, "device hdp float");
  }
}

TEST_CASE("the device path refuses host tensors; the test kernel tells device from host pointers") {
  // The device test kernel counts a call with host tensors (and to_host refuses them): its count of
  // misplaced calls is a real check, not a constant zero.
  {
    std::vector<std::int64_t> doc(2, 0), pos{0, 1};
    std::vector<double> q(2 * kHeads * kDim), kv(2 * kKvHeads * kDim), out(q.size()), lse(2 * kHeads);
    const model::attention_block<double> host_block{
        kShape, q, kv, kv, doc, pos, doc, pos, seq::block_mask::causal, 0.5};
    emulated_device_kernel k;
    CHECK_THROWS_WITH_AS(k.forward(host_block, {out, lse}), doctest::Contains("is a host pointer"),
                         invalid_argument);
    CHECK(k.misplaced == 1);
    auto dev_block = host_block;
    dev_block.q = emulated::to_device(dev_block.q);
    dev_block.k = emulated::to_device(dev_block.k);
    dev_block.v = emulated::to_device(dev_block.v);
    k.forward(dev_block,
              {emulated::to_device(std::span<double>(out)), emulated::to_device(std::span<double>(lse))});
    CHECK(k.misplaced == 1);
    CHECK(k.inner.forward_calls == 1);
  }
  // Host tensors passed to the device path are refused by the policy, naming the operation.
  const auto part = seq::partition_zigzag(8, 2);
  const auto s = seq::ring_for(part, {0, 1});
  std::map<std::int64_t, std::int64_t> lens{{0, 8}};
  std::vector<std::string> errors(2);
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    comm::emulated_device<comm::loopback::communicator> dev(comm::split(c, 0, c.rank()));
    model::emulated_device_memory mem;
    auto io = make_io<double>(s, c.rank(), lens, 1);
    model::emulated_device_memory::buffer<double> q, k, v;
    for (auto [d, h] : {std::pair{&q, &io.q}, std::pair{&k, &io.k}, std::pair{&v, &io.v}}) {
      d->resize(h->size());
      mem.upload(d->span(), std::span<const double>(*h));
    }
    const run::ring_attention_input<double> in{kShape, 0.25, q.span(), k.span(), v.span()};
    emulated_device_kernel kern;
    try {
      run::ring_attention_forward(dev, s, kern, in, std::span<double>(io.out), std::span<double>(io.lse),
                                  mem);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    MESSAGE(e);
    CHECK(e.find("emulated_device_memory::fill") != std::string::npos);
    CHECK(e.find("is a host pointer") != std::string::npos);
    CHECK(e.find("before the first step") != std::string::npos);
  }
}

TEST_CASE("ring attention errors name the ring, position and step; ranks outside the ring are refused") {
  const auto part = seq::partition_zigzag(32, 4);
  const auto s = seq::ring_for(part, {0, 1, 2, 3});
  std::map<std::int64_t, std::int64_t> lens{{0, 32}};
  std::vector<std::string> errors(8);
  comm::loopback::run(
      8,
      [&](comm::loopback::communicator& c) {
        const int p = run::ring_position(s, c.rank());
        auto io = make_io<double>(s, p < 0 ? 0 : p, lens, 1);
        checking_kernel k;
        try {
          // Ranks 4..7 are not in the ring: refused before any communication.
          // Rank 3 passes a ring of another order, so its neighbours see a different schedule or the
          // sizes do not match; the ring's ranks time out or mismatch, naming the ring and step.
          auto bad = c.rank() == 3 ? seq::ring_for(part, {0, 1, 3, 2}) : s;
          run::ring_attention_forward(c, bad, k, input_of(io), std::span<double>(io.out),
                                      std::span<double>(io.lse));
        } catch (const error& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      std::chrono::milliseconds(2000));
  for (int r = 4; r < 8; ++r)
    CHECK(errors[static_cast<std::size_t>(r)].find("is not in ring [0,1,2,3]") != std::string::npos);
  bool named = false;
  for (int r = 0; r < 4; ++r) {
    MESSAGE("rank ", r, ": ", errors[static_cast<std::size_t>(r)]);
    named = named || errors[static_cast<std::size_t>(r)].find("position") != std::string::npos;
  }
  CHECK(named);
}
