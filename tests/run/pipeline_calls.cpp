// SPDX-License-Identifier: Apache-2.0
// function_ref refers to a callable without owning or copying it, and pipeline_calls_of turns the owning
// (stage_functions, activation_sizes) and typed (stage_calls, sizes_of) forms into references, leaving
// out exactly the callables that are absent (no_call, an empty std::function).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/core/function_ref.hpp>
#include <hetmesh/run/pipeline_calls.hpp>

namespace {

TEST_CASE("function_ref calls the object it refers to, not a copy, and is empty by default") {
  int calls = 0;
  auto count = [&calls](int by) { calls += by; };
  hetmesh::function_ref<void(int)> f(count);
  REQUIRE(static_cast<bool>(f));
  f(2);
  const auto g = f;  // a copy refers to the same callable
  g(3);
  CHECK(calls == 5);
  CHECK_FALSE(static_cast<bool>(hetmesh::function_ref<void(int)>{}));

  struct counter {
    int n = 0;
    std::int64_t operator()(int a, int b) { return ++n, static_cast<std::int64_t>(a) * b; }
  } c;
  hetmesh::function_ref<std::int64_t(int, int)> h(c);
  CHECK(h(6, 7) == 42);
  CHECK(h(1, 1) == 1);
  CHECK(c.n == 2);  // the referenced object's state, not a copy's

  const auto unsigned_size = [](int a, int) { return static_cast<std::size_t>(a); };
  hetmesh::function_ref<std::int64_t(int, int)> converted(unsigned_size);  // result converted to R
  CHECK(converted(9, 0) == 9);
}

TEST_CASE("pipeline_calls_of refers to the set callables and leaves out no_call and empty std::function") {
  std::vector<int> seen;
  hetmesh::run::stage_functions<float> owned;
  owned.forward = [&](int s, int, std::span<const float>, std::span<float>) { seen.push_back(s); };
  owned.encoder_forward = [&](int e, int, std::span<float>) { seen.push_back(100 + e); };
  hetmesh::run::activation_sizes sizes{.output = [](int s, int mb) -> std::int64_t { return s * 10 + mb; }};
  const auto r = hetmesh::run::pipeline_calls_of(owned, sizes);
  CHECK(static_cast<bool>(r.forward));
  CHECK(static_cast<bool>(r.encoder_forward));
  CHECK_FALSE(static_cast<bool>(r.backward));  // empty std::function: left out
  CHECK_FALSE(static_cast<bool>(r.backward_weight));
  CHECK_FALSE(static_cast<bool>(r.encoder_output_size));
  r.forward(1, 0, {}, {});
  r.encoder_forward(2, 0, {});
  CHECK(seen == std::vector<int>{1, 102});
  CHECK(r.output_size(3, 4) == 34);

  auto fwd = [&](int s, int, std::span<const double>, std::span<double>) { seen.push_back(-s); };
  auto bwi = [&](int s, int, std::span<const double>, std::span<double>) { seen.push_back(-10 - s); };
  auto out = [](int, int) { return std::int64_t{5}; };
  const hetmesh::run::stage_calls<double, decltype(fwd), hetmesh::run::no_call, decltype(bwi)> typed{
      fwd, {}, bwi};
  const hetmesh::run::sizes_of<decltype(out)> typed_sizes{out};
  const auto t = hetmesh::run::pipeline_calls_of(typed, typed_sizes);
  CHECK(static_cast<bool>(t.forward));
  CHECK_FALSE(static_cast<bool>(t.backward));  // no_call: left out
  CHECK(static_cast<bool>(t.backward_input));
  CHECK_FALSE(static_cast<bool>(t.encoder_output_size));
  t.forward(2, 0, {}, {});
  t.backward_input(3, 0, {}, {});
  CHECK(seen == std::vector<int>{1, 102, -2, -13});
  CHECK(t.output_size(0, 0) == 5);
}

}  // namespace
