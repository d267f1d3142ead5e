// SPDX-License-Identifier: Apache-2.0
// model::activation_slot::save over any contiguous range (issue 34, 5a): vectors, arrays, spans and C arrays
// save without a wrapper and round-trip; a range of another element type is refused at compile time.
#include <doctest/doctest.h>

#include <array>
#include <list>
#include <span>
#include <vector>

#include <hetmesh/model/activation.hpp>

using namespace hetmesh::model;

namespace {
using range_store = host_activation_store<float>;
template <class R>
concept slot_saves = requires(const activation_slot<range_store>& slot, R&& r) {
  slot.save(0, static_cast<R&&>(r));
};
}  // namespace

// A const or mutable vector, an array, a span (of const or mutable data) and a C array all save; a
// range of another element type, and a range that is not contiguous, do not.
static_assert(slot_saves<std::vector<float>&>);
static_assert(slot_saves<const std::vector<float>&>);
static_assert(slot_saves<std::vector<float>>);
static_assert(slot_saves<std::array<float, 3>&>);
static_assert(slot_saves<std::span<float>>);
static_assert(slot_saves<std::span<const float>>);
static_assert(slot_saves<const float (&)[4]>);
static_assert(!slot_saves<std::vector<double>&>);
static_assert(!slot_saves<std::vector<int>&>);
static_assert(!slot_saves<std::list<float>&>);

TEST_CASE("activation slot: save takes any contiguous range of the store's element type, without a copy") {
  range_store s;
  const activation_slot slot(s, 1, 2);
  std::vector<float> v{1.5F, -2.0F, 3.25F};
  const std::vector<float> cv{4.0F, 5.0F};
  std::array<float, 3> a{6.0F, 7.0F, 8.0F};
  const float c[4] = {9.0F, 10.0F, 11.0F, 12.0F};
  slot.save(0, v);                            // mutable vector
  slot.save(1, cv);                           // const vector
  slot.save(2, a);                            // std::array
  slot.save(3, c);                            // C array
  slot.save(4, std::span<float>(v).last(2));  // a mutable span, as before the change with const spans
  slot.save(5, std::span<const float>(cv));   // the old spelling still works
  slot.save(6, std::vector<float>{13.0F});    // a temporary: copied into the slot before it dies
  auto as_vec = [&](int t) {
    const auto r = slot.load(t);
    return std::vector<float>(r.begin(), r.end());
  };
  CHECK(as_vec(0) == v);
  CHECK(as_vec(1) == cv);
  CHECK(as_vec(2) == std::vector<float>(a.begin(), a.end()));
  CHECK(as_vec(3) == std::vector<float>(c, c + 4));
  CHECK(as_vec(4) == std::vector<float>{-2.0F, 3.25F});
  CHECK(as_vec(5) == cv);
  CHECK(as_vec(6) == std::vector<float>{13.0F});
  CHECK(s.bytes() == static_cast<std::int64_t>((3 + 2 + 3 + 4 + 2 + 2 + 1) * sizeof(float)));
  v[0] = 99.0F;  // the slot holds a copy: later writes to the source do not reach it
  CHECK(as_vec(0)[0] == 1.5F);
  // The store's contract is unchanged: a second save of the same tensor names the slot.
  CHECK_THROWS_WITH_AS(slot.save(0, v), doctest::Contains("(stage 1, micro-batch 2, tensor 0) written twice"),
                       activation_error);
  // An empty range slot_saves an empty slot, which can be loaded.
  slot.save(7, std::vector<float>{});
  CHECK(slot.load(7).empty());
}
