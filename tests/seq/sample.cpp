// SPDX-License-Identifier: Apache-2.0
// The one sample record: stable ids from (source, epoch, position), unique and decodable within their
// limits, refused outside them.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <tuple>

#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/sample.hpp>

using namespace hetmesh;
using L = seq::sample_id_layout;

TEST_CASE("sample id: unique over random (source, epoch, position) triples; round trip") {
  rng g(2024);
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> triples;
  std::set<std::int64_t> ids;
  const auto check = [&](std::int64_t s, std::int64_t e, std::int64_t p) {
    const auto id = seq::make_sample_id(s, e, p);
    CHECK(id >= 0);
    const auto o = seq::sample_origin_of(id);
    CHECK(o == seq::sample_origin{s, e, p});
    CHECK(seq::make_sample_id(o) == id);
    // Distinct triples give distinct ids: the two sets grow together.
    CHECK(triples.insert({s, e, p}).second == ids.insert(id).second);
  };
  for (int k = 0; k < 20000; ++k) {
    // Mix small values (dense collisions of low bits) and values up to each limit.
    const bool small = g.below(2) == 0;
    const auto s = static_cast<std::int64_t>(g.below(small ? 4 : L::max_source + 1));
    const auto e = static_cast<std::int64_t>(g.below(small ? 4 : L::max_epoch + 1));
    const auto p =
        static_cast<std::int64_t>(g.below(small ? 64 : static_cast<std::uint64_t>(L::max_position) + 1));
    check(s, e, p);
  }
  check(L::max_source, L::max_epoch, L::max_position);  // the largest id
  check(0, 0, 0);
  CHECK(triples.size() == ids.size());
  // Ids order as (source, epoch, position).
  CHECK(seq::make_sample_id(0, 1, 0) > seq::make_sample_id(0, 0, L::max_position));
  CHECK(seq::make_sample_id(1, 0, 0) > seq::make_sample_id(0, L::max_epoch, L::max_position));
}

TEST_CASE("sample id: parts outside the limits are refused, never wrapped") {
  CHECK_THROWS_WITH_AS((void)seq::make_sample_id(L::max_source + 1, 0, 0), doctest::Contains("source"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)seq::make_sample_id(0, L::max_epoch + 1, 0), doctest::Contains("epoch"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)seq::make_sample_id(0, 0, L::max_position + 1), doctest::Contains("position"),
                       invalid_argument);
  CHECK_THROWS_AS((void)seq::make_sample_id(-1, 0, 0), invalid_argument);
  CHECK_THROWS_AS((void)seq::sample_origin_of(-5), invalid_argument);
}

TEST_CASE("sample record: lengths per modality, origin from the id, printed") {
  const seq::sample_meta m{
      .id = seq::make_sample_id(3, 1, 42), .tokens = 100, .item_tokens = {64, 256}, .bytes = 9};
  CHECK(m.encoder_tokens() == 320);
  CHECK(m.origin() == seq::sample_origin{3, 1, 42});
  CHECK(to_string(m.origin()) == "s3/e1/p42");
  CHECK(to_string(m).find("tokens=100") != std::string::npos);
}
