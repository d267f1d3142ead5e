// SPDX-License-Identifier: Apache-2.0
// The parity cases of test_train (loopback) and test_train_mpi (mpirun -np 8): the same bodies and the
// same tolerances, given a way to run a body on 8 ranks and get rank 0's verdict.
#pragma once

#include <doctest/doctest.h>

#include "train/train_body.hpp"

namespace traintest {

inline void check_verdict(const verdict& v, double tol, const char* what) {
  const std::string msg = std::string(what) + ": " + v.describe();
  MESSAGE(msg);
  CHECK(v.rel <= tol);
  CHECK(v.loss_rel <= tol);
  CHECK(v.targets == v.expected_targets);
  CHECK(v.tokens == v.expected_tokens);
  CHECK(v.optimizer_calls == 1);
}

/// Static CP zigzag and THD with cp = 2, 4 and 8 (dp = 8 / cp), HDP with both placements of seq::plan_hdp
/// (train::family_placement) and placed by balance::bytescale, in double and float, over seeded random
/// batches. `on8(body)` runs body(world) on 8 ranks and returns rank 0's verdict.
template <class On8>
void parity_cases(On8 on8) {
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    for (int cp : {2, 4, 8}) {
      const auto zz = seq::cp_zigzag{.cp = cp, .pad = true};
      const auto thd = seq::cp_thd{.cp = cp, .pad = true};
      check_verdict(on8([&](auto& w) { return parity_body<double>(w, zz, seed, 10, 40); }), 1e-10,
                    "zigzag double");
      check_verdict(on8([&](auto& w) { return parity_body<float>(w, zz, seed, 10, 40); }), 1e-5,
                    "zigzag float");
      check_verdict(on8([&](auto& w) { return parity_body<double>(w, thd, seed, 10, 40); }), 1e-10,
                    "thd double");
      check_verdict(on8([&](auto& w) { return parity_body<float>(w, thd, seed, 10, 40); }), 1e-5,
                    "thd float");
    }
    const auto uly = seq::ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4};
    check_verdict(on8([&](auto& w) { return parity_body<double>(w, uly, seed, 10, 40); }), 1e-10,
                  "ulysses double");
    check_verdict(on8([&](auto& w) { return parity_body<float>(w, uly, seed, 10, 40); }), 1e-5,
                  "ulysses float");
    for (auto placement : {seq::hdp_placement_kind::waves, seq::hdp_placement_kind::least_loaded}) {
      const auto hdp = test_hdp(placement);
      const auto vd = on8([&](auto& w) { return parity_body<double>(w, hdp, seed, 12, 60); });
      check_verdict(vd, 1e-10, "hdp double");
      CHECK(vd.ring_sizes.back() > 2);  // rings of several sizes, packs included
      CHECK(vd.ring_sizes.front() == 1);
      check_verdict(on8([&](auto& w) { return parity_body<float>(w, hdp, seed, 12, 60); }), 1e-5,
                    "hdp float");
    }
    const auto hdp = test_hdp();
    const auto bs = balance::bytescale{};
    check_verdict(on8([&](auto& w) { return parity_body<double>(w, hdp, seed, 12, 60, bs); }), 1e-10,
                  "hdp bytescale double");
    check_verdict(on8([&](auto& w) { return parity_body<float>(w, hdp, seed, 12, 60, bs); }), 1e-5,
                  "hdp bytescale float");
  }
}

}  // namespace traintest
