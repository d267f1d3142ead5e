// SPDX-License-Identifier: Apache-2.0
// run::ulysses_to_heads / ulysses_to_sequence on loopback ranks: exact data movement and its inverse
// for query- and key/value-shaped tensors (heads split, KV heads split, KV heads replicated under GQA),
// and Ulysses around a single-rank attention equal to full causal attention, forward and backward.
// The same bodies run under mpirun in exchange_mpi.cpp. The device path: the exchange and
// run::ulysses_attention_forward/backward over comm::emulated_device with model::emulated_device_memory
// equal the host run bit for bit (float and double, GQA and MQA, causal and full masks), the kernel
// receiving emulated device tensors and host metadata.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ulysses_attention.hpp>

#include "emulated_kernel.hpp"
#include "exchange_bodies.hpp"

using namespace hetmesh;

namespace {
struct ulysses_case {
  seq::ulysses_policy policy;
  std::int64_t total;
};
const ulysses_case cases[] = {
    {{.degree = 1, .heads = 2, .kv_heads = 1, .head_dim = 3}, 7},
    {{.degree = 2, .heads = 4, .kv_heads = 4, .head_dim = 3}, 11},   // KV heads split
    {{.degree = 4, .heads = 8, .kv_heads = 2, .head_dim = 2}, 13},   // GQA, each KV head on 2 ranks
    {{.degree = 4, .heads = 4, .kv_heads = 1, .head_dim = 5}, 9},    // MQA: one KV head on every rank
    {{.degree = 8, .heads = 16, .kv_heads = 8, .head_dim = 2}, 21},  // GQA with KV heads split
    {{.degree = 8, .heads = 8, .kv_heads = 2, .head_dim = 2}, 5},    // fewer tokens than ranks
};
}  // namespace

TEST_CASE("ulysses exchange on loopback: every head of every token lands where the plan says, and back") {
  std::uint64_t seed = 1;
  for (const auto& uc : cases) {
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, uc.total, seed);
    CAPTURE(uc.policy);
    comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
      runtest::ulysses_movement(c, uc.policy, tokens, seed);
    });
    ++seed;
  }
}

TEST_CASE("ulysses exchange on loopback: around single-rank attention it equals full causal attention") {
  const std::vector<std::int64_t> docs{9, 14, 3};  // 26 tokens in 3 documents
  std::uint64_t seed = 31;
  for (const auto& uc : cases) {
    if (uc.policy.head_dim < 2) continue;
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, 26, seed);
    CAPTURE(uc.policy);
    comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
      runtest::ulysses_attention(c, uc.policy, docs, tokens, seed);
    });
    seed += 7;
  }
}

TEST_CASE("ulysses exchange: wrong sizes and a group of the wrong degree are refused with the op and rank") {
  const seq::ulysses_policy pol{.degree = 2, .heads = 4, .kv_heads = 2, .head_dim = 2};
  const std::vector<std::int64_t> tokens{3, 2};
  const auto plan = seq::plan_ulysses(tokens, pol);
  std::string msg;
  try {
    comm::loopback::run(2, [&](comm::loopback::communicator& c) {
      std::vector<double> x(
          static_cast<std::size_t>(run::ulysses_sequence_size(plan, run::ulysses_part::query, c.rank())) + 1),
          y(static_cast<std::size_t>(run::ulysses_head_size(plan, run::ulysses_part::query)));
      run::ulysses_to_heads(c, plan, run::ulysses_part::query, std::span<const double>(x),
                            std::span<double>(y));
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(
      msg.find("run::ulysses_to_heads: rank 0 passed a sequence-sharded query-shaped tensor of 25 elements; "
               "expected 24") != std::string::npos);
  msg.clear();
  try {
    comm::loopback::run(3, [&](comm::loopback::communicator& c) {
      std::vector<double> x, y;
      run::ulysses_to_sequence(c, plan, run::ulysses_part::key_value, std::span<const double>(x),
                               std::span<double>(y));
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(msg.find("run::ulysses_to_sequence on group [0,1,2] rank 0/3: a group of 3 ranks") !=
        std::string::npos);
}

namespace {

using device_comm = comm::emulated_device<comm::loopback::communicator>;

/// A verifiable value in [-0.5, 0.5) of (seed, tensor, token, head, column).
double uval(std::uint64_t seed, std::uint64_t tensor, std::int64_t t, std::int64_t h, std::int64_t e) {
  return static_cast<double>(key_hash({seed, tensor, static_cast<std::uint64_t>(t),
                                       static_cast<std::uint64_t>(h), static_cast<std::uint64_t>(e)}) >>
                             11) *
             0x1.0p-53 -
         0.5;
}

/// [tokens [first, first + n)][heads][dim] of tensor `tensor`.
template <class T>
std::vector<T> rows(std::uint64_t seed, std::uint64_t tensor, std::int64_t first, std::int64_t n, int heads,
                    int dim) {
  std::vector<T> out;
  for (std::int64_t t = first; t < first + n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < dim; ++e) out.push_back(static_cast<T>(uval(seed, tensor, t, h, e)));
  return out;
}

std::int64_t first_token(std::span<const std::int64_t> tokens, int rank) {
  std::int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += tokens[static_cast<std::size_t>(r)];
  return first;
}

/// Every exchange of run/ulysses.hpp on host vectors and again over emulated device memory (the same
/// inputs uploaded): the results equal bit for bit. Collective over c.
template <class T>
void exchange_host_vs_device(comm::loopback::communicator& c, const seq::ulysses_policy& pol,
                             std::span<const std::int64_t> tokens, std::uint64_t seed) {
  const auto plan = seq::plan_ulysses(tokens, pol);
  const int me = c.rank();
  const auto first = first_token(tokens, me), mine = tokens[static_cast<std::size_t>(me)];
  device_comm dc(c);
  model::emulated_device_memory mem;
  for (const auto part : {run::ulysses_part::query, run::ulysses_part::key_value}) {
    CAPTURE(static_cast<int>(part));
    const int H = part == run::ulysses_part::query ? pol.heads : pol.kv_heads;
    const auto x = rows<T>(seed, static_cast<std::uint64_t>(part), first, mine, H, pol.head_dim);
    // Host.
    std::vector<T> y(static_cast<std::size_t>(run::ulysses_head_size(plan, part))), back(x.size()),
        sum(x.size());
    run::ulysses_to_heads(c, plan, part, std::span<const T>(x), std::span<T>(y));
    run::ulysses_to_sequence(c, plan, part, std::span<const T>(y), std::span<T>(back));
    run::ulysses_to_sequence(c, plan, part, std::span<const T>(y), std::span<T>(sum),
                             run::ulysses_combine::sum);
    // Device: the same calls on uploaded buffers.
    const auto xd = runtest::upload(mem, x);
    model::emulated_device_memory::buffer<T> yd, backd, sumd;
    yd.resize(y.size()), backd.resize(x.size()), sumd.resize(x.size());
    run::ulysses_to_heads(dc, plan, part, xd.span(), yd.span(), mem);
    run::ulysses_to_sequence(dc, plan, part, std::span<const T>(yd.span()), backd.span(), mem);
    run::ulysses_to_sequence(dc, plan, part, std::span<const T>(yd.span()), sumd.span(), mem,
                             run::ulysses_combine::sum);
    CHECK_MESSAGE(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(yd.span())), y),
                  "to_heads on rank ", me);
    CHECK_MESSAGE(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(backd.span())), back),
                  "to_sequence(first) on rank ", me);
    CHECK_MESSAGE(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(sumd.span())), sum),
                  "to_sequence(sum) on rank ", me);
    CHECK_MESSAGE(runtest::bitwise_equal(back, x), "to_sequence(first) is not the inverse on rank ", me);
  }
  // The three-tensor helpers: buffers of the policy, equal to the host vectors.
  const auto q = rows<T>(seed, 7, first, mine, pol.heads, pol.head_dim);
  const auto k = rows<T>(seed, 8, first, mine, pol.kv_heads, pol.head_dim);
  const auto v = rows<T>(seed, 9, first, mine, pol.kv_heads, pol.head_dim);
  const auto h =
      run::ulysses_qkv_to_heads(c, plan, std::span<const T>(q), std::span<const T>(k), std::span<const T>(v));
  const auto g = run::ulysses_grads_to_sequence(c, plan, std::span<const T>(h.q), std::span<const T>(h.k),
                                                std::span<const T>(h.v));
  const auto qd = runtest::upload(mem, q), kd = runtest::upload(mem, k), vd = runtest::upload(mem, v);
  auto hd = run::ulysses_qkv_to_heads(dc, plan, qd.span(), kd.span(), vd.span(), mem);
  auto gd =
      run::ulysses_grads_to_sequence(dc, plan, std::span<const T>(hd.q.span()),
                                     std::span<const T>(hd.k.span()), std::span<const T>(hd.v.span()), mem);
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(hd.q.span())), h.q));
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(hd.k.span())), h.k));
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(hd.v.span())), h.v));
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(gd.q.span())), g.q));
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(gd.k.span())), g.k));
  CHECK(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(gd.v.span())), g.v));
}

/// Outputs of one Ulysses attention forward and backward on a rank.
template <class T>
struct attention_result {
  std::vector<T> out, lse, dq, dk, dv;
};

/// run::ulysses_attention_forward/backward over a packed stream of documents (rank r the r-th slice of
/// `tokens`), on host vectors with model::reference_attention and over emulated device memory with
/// emulated_reference_kernel: equal bit for bit, the kernel saw only device tensors and host metadata, and
/// the host run equals whole-stream attention on one rank (relative error <= 1e-9 in double). Collective.
template <class T>
void attention_host_vs_device(comm::loopback::communicator& c, const seq::ulysses_policy& pol,
                              std::span<const std::int64_t> docs, std::span<const std::int64_t> tokens,
                              seq::block_mask mask, std::uint64_t seed) {
  std::vector<std::int64_t> doc, pos;
  for (std::size_t d = 0; d < docs.size(); ++d)
    for (std::int64_t t = 0; t < docs[d]; ++t) doc.push_back(static_cast<std::int64_t>(d)), pos.push_back(t);
  const auto total = static_cast<std::int64_t>(doc.size());
  const auto plan = seq::plan_ulysses(tokens, pol);
  const int me = c.rank();
  const auto first = first_token(tokens, me), mine = tokens[static_cast<std::size_t>(me)];
  const model::attention_shape shape{pol.heads, pol.kv_heads, pol.head_dim};
  const auto q = rows<T>(seed, 0, first, mine, pol.heads, pol.head_dim);
  const auto k = rows<T>(seed, 1, first, mine, pol.kv_heads, pol.head_dim);
  const auto v = rows<T>(seed, 2, first, mine, pol.kv_heads, pol.head_dim);
  const auto dout = rows<T>(seed, 3, first, mine, pol.heads, pol.head_dim);
  const T scale = T(0.5);
  const auto lse_size = q.size() / static_cast<std::size_t>(pol.head_dim);

  attention_result<T> host{std::vector<T>(q.size()), std::vector<T>(lse_size), std::vector<T>(q.size()),
                           std::vector<T>(k.size()), std::vector<T>(v.size())};
  {
    const model::reference_attention kernel;
    const run::ulysses_attention_input<T> in{shape, scale, q, k, v, doc, pos, mask};
    run::ulysses_attention_forward(c, plan, kernel, in, std::span<T>(host.out), std::span<T>(host.lse));
    run::ulysses_attention_backward(c, plan, kernel, in, std::span<const T>(host.out),
                                    std::span<const T>(host.lse), std::span<const T>(dout),
                                    std::span<T>(host.dq), std::span<T>(host.dk), std::span<T>(host.dv));
  }
  device_comm dc(c);
  model::emulated_device_memory mem;
  runtest::emulated_reference_kernel kernel;
  const auto qd = runtest::upload(mem, q), kd = runtest::upload(mem, k), vd = runtest::upload(mem, v),
             doutd = runtest::upload(mem, dout);
  model::emulated_device_memory::buffer<T> out, lse, dq, dk, dv;
  out.resize(q.size()), lse.resize(lse_size), dq.resize(q.size()), dk.resize(k.size()), dv.resize(v.size());
  const run::ulysses_attention_input<T> in{shape, scale, qd.span(), kd.span(), vd.span(), doc, pos, mask};
  run::ulysses_attention_forward(dc, plan, kernel, in, out.span(), lse.span(), mem);
  run::ulysses_attention_backward(dc, plan, kernel, in, std::span<const T>(out.span()),
                                  std::span<const T>(lse.span()), doutd.span(), dq.span(), dk.span(),
                                  dv.span(), mem);
  CHECK(kernel.calls == 2);
  // Forward: q, k, v, out, lse; backward: q, k, v, dout, lse, delta, dq, dk, dv (none empty: every rank
  // holds the whole stream for its heads).
  CHECK(kernel.device_tensors == 14);
  CHECK(kernel.host_tensors == 0);
  CHECK(kernel.device_metadata == 0);
  const attention_result<T> dev{runtest::download(mem, std::span<const T>(out.span())),
                                runtest::download(mem, std::span<const T>(lse.span())),
                                runtest::download(mem, std::span<const T>(dq.span())),
                                runtest::download(mem, std::span<const T>(dk.span())),
                                runtest::download(mem, std::span<const T>(dv.span()))};
  CHECK_MESSAGE(runtest::bitwise_equal(dev.out, host.out), "out on rank ", me);
  CHECK_MESSAGE(runtest::bitwise_equal(dev.lse, host.lse), "lse on rank ", me);
  CHECK_MESSAGE(runtest::bitwise_equal(dev.dq, host.dq), "dq on rank ", me);
  CHECK_MESSAGE(runtest::bitwise_equal(dev.dk, host.dk), "dk on rank ", me);
  CHECK_MESSAGE(runtest::bitwise_equal(dev.dv, host.dv), "dv on rank ", me);

  if constexpr (std::is_same_v<T, double>) {  // the host run against the whole stream on one rank
    const auto fq = rows<T>(seed, 0, 0, total, pol.heads, pol.head_dim);
    const auto fk = rows<T>(seed, 1, 0, total, pol.kv_heads, pol.head_dim);
    const auto fv = rows<T>(seed, 2, 0, total, pol.kv_heads, pol.head_dim);
    const auto fdout = rows<T>(seed, 3, 0, total, pol.heads, pol.head_dim);
    const model::attention_block<T> b{shape, fq, fk, fv, doc, pos, doc, pos, mask, scale};
    const model::reference_attention ref;
    attention_result<T> want{
        std::vector<T>(fq.size()), std::vector<T>(static_cast<std::size_t>(total * pol.heads)),
        std::vector<T>(fq.size(), 0), std::vector<T>(fk.size(), 0), std::vector<T>(fv.size(), 0)};
    ref.forward(b, model::attention_forward_out<T>{want.out, want.lse});
    std::vector<T> delta(want.lse.size());
    seq::attention_delta(std::span<const T>(want.out), std::span<const T>(fdout), std::span<T>(delta),
                         static_cast<std::size_t>(pol.head_dim));
    ref.backward(b, model::attention_backward_io<T>{fdout, want.lse, delta, want.dq, want.dk, want.dv});
    auto err = [&](const std::vector<T>& got, const std::vector<T>& all, int width) {
      double num = 0, den = 1e-300;
      for (const T w : all) den = std::max(den, std::abs(w));
      for (std::size_t i = 0; i < got.size(); ++i)
        num = std::max(num, std::abs(got[i] - all[static_cast<std::size_t>(first * width) + i]));
      return num / den;
    };
    const int qw = pol.heads * pol.head_dim, kw = pol.kv_heads * pol.head_dim;
    CHECK_MESSAGE(err(host.out, want.out, qw) <= 1e-9, "out on rank ", me);
    CHECK_MESSAGE(err(host.lse, want.lse, pol.heads) <= 1e-9, "lse on rank ", me);
    CHECK_MESSAGE(err(host.dq, want.dq, qw) <= 1e-9, "dq on rank ", me);
    CHECK_MESSAGE(err(host.dk, want.dk, kw) <= 1e-9, "dk on rank ", me);
    CHECK_MESSAGE(err(host.dv, want.dv, kw) <= 1e-9, "dv on rank ", me);
  }
}

}  // namespace

TEST_CASE("ulysses exchange over emulated device memory equals the host exchange bit for bit") {
  std::uint64_t seed = 101;
  for (const auto& uc : cases) {
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, uc.total, seed);
    CAPTURE(uc.policy);
    comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
      exchange_host_vs_device<double>(c, uc.policy, tokens, seed);
      exchange_host_vs_device<float>(c, uc.policy, tokens, seed + 1);
    });
    ++seed;
  }
}

TEST_CASE("ulysses attention over emulated device memory equals the host run bit for bit (causal and full)") {
  const std::vector<std::int64_t> docs{9, 14, 3};  // 26 tokens in 3 documents
  std::uint64_t seed = 131;
  for (const auto& uc : cases) {
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, 26, seed);
    for (const auto mask : {seq::block_mask::causal, seq::block_mask::full}) {
      CAPTURE(uc.policy);
      CAPTURE(static_cast<int>(mask));
      comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
        attention_host_vs_device<double>(c, uc.policy, docs, tokens, mask, seed);
        attention_host_vs_device<float>(c, uc.policy, docs, tokens, mask, seed + 1);
      });
    }
    seed += 7;
  }
}

TEST_CASE("ulysses exchange over emulated device memory: a host buffer is refused, naming the operation") {
  const seq::ulysses_policy pol{.degree = 2, .heads = 4, .kv_heads = 2, .head_dim = 2};
  const std::vector<std::int64_t> tokens{3, 2};
  const auto plan = seq::plan_ulysses(tokens, pol);
  std::string msg;
  try {
    comm::loopback::run(2, [&](comm::loopback::communicator& c) {
      device_comm dc(c);
      model::emulated_device_memory mem;
      std::vector<double> x(
          static_cast<std::size_t>(run::ulysses_sequence_size(plan, run::ulysses_part::query, c.rank())));
      model::emulated_device_memory::buffer<double> y;
      y.resize(static_cast<std::size_t>(run::ulysses_head_size(plan, run::ulysses_part::query)));
      run::ulysses_to_heads(dc, plan, run::ulysses_part::query, std::span<const double>(x), y.span(), mem);
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(msg.find("emulated_device_memory::copy_2d") != std::string::npos);
  CHECK(msg.find("is a host pointer; expected an emulated device pointer") != std::string::npos);
}

TEST_CASE(
    "ulysses exchange over emulated device memory: a rank holding another plan is caught at the "
    "collective assertion level") {
  if constexpr (!assertion_enabled(assertion_level::collective)) {
    MESSAGE(
        "built below the collective assertion level: plan agreement is not checked (test_run_exchange_heavy "
        "runs this case)");
  } else {
    const seq::ulysses_policy pol{.degree = 3, .heads = 3, .kv_heads = 3, .head_dim = 2};
    const auto a = seq::plan_ulysses(std::vector<std::int64_t>{2, 3, 1}, pol);
    const auto b = seq::plan_ulysses(std::vector<std::int64_t>{2, 2, 2}, pol);
    std::string msg;
    try {
      comm::loopback::run(3, [&](comm::loopback::communicator& c) {
        const auto& plan = c.rank() == 0 ? a : b;
        device_comm dc(c);
        model::emulated_device_memory mem;
        model::emulated_device_memory::buffer<double> x, y;
        x.resize(
            static_cast<std::size_t>(run::ulysses_sequence_size(plan, run::ulysses_part::query, c.rank())));
        y.resize(static_cast<std::size_t>(run::ulysses_head_size(plan, run::ulysses_part::query)));
        run::ulysses_to_heads(dc, plan, run::ulysses_part::query, std::span<const double>(x.span()), y.span(),
                              mem);
      });
    } catch (const mismatch_error& e) {
      msg = e.what();
    }
    CHECK(msg.find("ulysses plan hashes disagree across the group of 3 ranks: rank 0 (global 0) has") !=
          std::string::npos);
  }
}
