// SPDX-License-Identifier: Apache-2.0
// At the collective assertion level, ring attention checks that neighbours hold the same schedule: a
// rank passing another schedule of the same ring is caught before any KV moves, naming the ring and
// the position; on the device path too (the hash travels in device buffers of the memory policy).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/host_memory.hpp>

#include "run/ring_attention_body.hpp"

using namespace hetmesh;
using namespace ringtest;

TEST_CASE("ring attention: a rank with another schedule of the same ring is caught (collective level)") {
  static_assert(assertion_enabled(assertion_level::collective));
  const auto good = seq::ring_for(seq::partition_zigzag(32, 4), {0, 1, 2, 3});
  const auto other = seq::ring_for(seq::partition_zigzag(40, 4), {0, 1, 2, 3});
  std::vector<std::string> errors(4);
  std::vector<int> mismatch(4, 0);
  comm::loopback::run(
      4,
      [&](comm::loopback::communicator& c) {
        const auto& s = c.rank() == 2 ? other : good;
        auto io = make_io<double>(s, c.rank(), {{0, c.rank() == 2 ? 40 : 32}}, 3);
        model::reference_attention k;
        try {
          run::ring_attention_forward(c, s, k, input_of(io), std::span<double>(io.out),
                                      std::span<double>(io.lse));
        } catch (const mismatch_error& e) {
          mismatch[static_cast<std::size_t>(c.rank())] = 1;
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        } catch (const error& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      std::chrono::milliseconds(2000));
  for (int r = 0; r < 4; ++r) MESSAGE("rank ", r, ": ", errors[static_cast<std::size_t>(r)]);
  // Rank 2 receives rank 1's hash and rank 3 receives rank 2's: both differ from their own.
  CHECK(mismatch[2] == 1);
  CHECK(mismatch[3] == 1);
  CHECK(errors[3].find("ring [0,1,2,3], position 3") != std::string::npos);
  CHECK(errors[3].find("holds another schedule") != std::string::npos);
}

TEST_CASE(
    "ring attention on emulated device memory: a rank with another schedule is caught (collective level)") {
  static_assert(assertion_enabled(assertion_level::collective));
  const auto good = seq::ring_for(seq::partition_zigzag(32, 4), {0, 1, 2, 3});
  const auto other = seq::ring_for(seq::partition_zigzag(40, 4), {0, 1, 2, 3});
  std::vector<std::string> errors(4);
  std::vector<int> mismatch(4, 0);
  comm::loopback::run(
      4,
      [&](comm::loopback::communicator& c) {
        comm::emulated_device<comm::loopback::communicator> dev(comm::split(c, 0, c.rank()));
        model::emulated_device_memory mem;
        const auto& s = c.rank() == 2 ? other : good;
        auto io = make_io<double>(s, c.rank(), {{0, c.rank() == 2 ? 40 : 32}}, 3);
        model::emulated_device_memory::buffer<double> q, k, v, out, lse;
        for (auto [d, h] : {std::pair{&q, &io.q}, std::pair{&k, &io.k}, std::pair{&v, &io.v}}) {
          d->resize(h->size());
          mem.upload(d->span(), std::span<const double>(*h));
        }
        out.resize(io.out.size());
        lse.resize(io.lse.size());
        const run::ring_attention_input<double> in{kShape, 0.25, q.span(), k.span(), v.span()};
        emulated_device_kernel kern;
        try {
          run::ring_attention_forward(dev, s, kern, in, out.span(), lse.span(), mem);
        } catch (const mismatch_error& e) {
          mismatch[static_cast<std::size_t>(c.rank())] = 1;
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        } catch (const error& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      std::chrono::milliseconds(2000));
  for (int r = 0; r < 4; ++r) MESSAGE("rank ", r, ": ", errors[static_cast<std::size_t>(r)]);
  CHECK(mismatch[0] == 0);
  CHECK(mismatch[2] == 1);
  CHECK(mismatch[3] == 1);
  CHECK(errors[3].find("ring [0,1,2,3], position 3") != std::string::npos);
  CHECK(errors[3].find("holds another schedule") != std::string::npos);
}
