// SPDX-License-Identifier: Apache-2.0
// model::host_activation_store and activation_slot: round trips, byte accounting, the errors that name a
// slot, and a seeded random sequence of operations against a plain map.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include <hetmesh/core/random.hpp>
#include <hetmesh/model/activation.hpp>

using namespace hetmesh;
using namespace hetmesh::model;

TEST_CASE("activation store: write, read, release, with bytes accounted") {
  host_activation_store<double> s;
  const std::vector<double> a{1.5, -2.25, 3.0}, b{4.0};
  s.write({0, 1}, a);
  s.write({0, 1, 1}, b);
  s.write({2, 1}, b);
  CHECK(s.bytes() == 5 * 8);
  CHECK(s.slots() == 3);
  CHECK(s.contains({0, 1, 1}));
  const auto r = s.read({0, 1});
  CHECK(std::vector<double>(r.begin(), r.end()) == a);
  CHECK(s.read({0, 1}).data() == r.data());  // reads do not copy
  s.release({0, 1, 1});
  CHECK(!s.contains({0, 1, 1}));
  CHECK(s.bytes() == 4 * 8);
  s.write({0, 1, 1}, a);  // a released slot may be written again
  CHECK(s.release_all(0, 1) == 2);
  CHECK(s.slots() == 1);
  CHECK(s.bytes() == 8);
  CHECK(s.release_all(0, 1) == 0);
}

TEST_CASE("activation store: errors name the (stage, micro-batch) slot") {
  host_activation_store<float> s;
  const std::vector<float> x{1, 2};
  CHECK_THROWS_WITH_AS(
      (void)s.read({3, 7}),
      "activation slot (stage 3, micro-batch 7, tensor 0) read before it was written (or after it was "
      "released); expected the stage's forward of that micro-batch to run first",
      activation_error);
  s.write({3, 7}, x);
  CHECK_THROWS_WITH_AS(s.write({3, 7}, x),
                       doctest::Contains("(stage 3, micro-batch 7, tensor 0) written twice"),
                       activation_error);
  CHECK(s.bytes() == 8);  // the refused write changed nothing
  s.release({3, 7});
  CHECK_THROWS_WITH_AS((void)s.read({3, 7}),
                       doctest::Contains("(stage 3, micro-batch 7, tensor 0) read before"), activation_error);
  CHECK_THROWS_WITH_AS(s.release({3, 7}), doctest::Contains("released but holds nothing"), activation_error);
  CHECK_THROWS_AS((void)s.read({3, 7}), hetmesh::error);  // derives from hetmesh::error
}

TEST_CASE("activation slot: a stage's handle binds (stage, micro-batch)") {
  host_activation_store<double> s;
  const activation_slot slot(s, 4, 9);
  const std::vector<double> x{7, 8, 9};
  slot.save(2, std::span<const double>(x));
  CHECK(s.contains({4, 9, 2}));
  CHECK(slot.load(2)[1] == 8);
  CHECK(slot.stage() == 4);
  CHECK(slot.micro_batch() == 9);
  slot.release(2);
  CHECK(s.slots() == 0);
  CHECK(to_string(activation_key{1, 2, 3}) == "(stage 1, micro-batch 2, tensor 3)");
}

TEST_CASE("activation store: seeded random operations agree with a plain map") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    rng g(seed);
    host_activation_store<double> s;
    std::map<activation_key, std::vector<double>> model;
    for (int op = 0; op < 400; ++op) {
      const activation_key k{static_cast<int>(g.below(3)), static_cast<int>(g.below(4)),
                             static_cast<int>(g.below(2))};
      const bool held = model.contains(k);
      switch (g.below(3)) {
        case 0: {
          std::vector<double> v(static_cast<std::size_t>(g.uniform(0, 5)));
          for (auto& e : v) e = static_cast<double>(g.below(1000)) + 0.5;
          if (held) {
            CHECK_THROWS_AS(s.write(k, v), activation_error);
          } else {
            s.write(k, v);
            model[k] = v;
          }
          break;
        }
        case 1:
          if (held) {
            const auto r = s.read(k);
            CHECK(std::vector<double>(r.begin(), r.end()) == model[k]);
          } else {
            CHECK_THROWS_AS((void)s.read(k), activation_error);
          }
          break;
        default:
          if (held) {
            s.release(k);
            model.erase(k);
          } else {
            CHECK_THROWS_AS(s.release(k), activation_error);
          }
      }
      std::int64_t bytes = 0;
      for (const auto& [key, v] : model) bytes += static_cast<std::int64_t>(v.size() * sizeof(double));
      REQUIRE(s.bytes() == bytes);
      REQUIRE(s.slots() == model.size());
    }
  }
}
