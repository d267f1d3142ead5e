// SPDX-License-Identifier: Apache-2.0
// The position ids of a THD context-parallel partition (seq::cp_thd, what `hetmesh-plan cp --scheme thd
// --position-ids` prints), as TransformerEngine gives them: each padded document numbered 0.. (padding
// continues the count), then rank r takes chunks r and 2cp-1-r of every document. Properties over random
// packed streams; scripts/peers/thd_vs_te.py compares with TE's own functions.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <hetmesh/seq/partition.hpp>

using namespace hetmesh::seq;

namespace {

/// Which document (index) the padded-stream token `g` belongs to.
std::size_t doc_of(const std::vector<std::int64_t>& cu_padded, std::int64_t g) {
  std::size_t d = 0;
  while (cu_padded[d + 1] <= g) ++d;
  return d;
}

void check_position_ids(const cp_partition& p, int cp) {
  const auto& cu = p.cu_seqlens_padded;
  const std::size_t docs = cu.size() - 1;
  // covered[d][t]: how many ranks hold position t of document d.
  std::vector<std::vector<int>> covered(docs);
  for (std::size_t d = 0; d < docs; ++d) covered[d].assign(static_cast<std::size_t>(cu[d + 1] - cu[d]), 0);
  for (int r = 0; r < cp; ++r) {
    const auto& sh = p.ranks[static_cast<std::size_t>(r)];
    REQUIRE(sh.position_ids.size() == sh.token_index.size());
    std::vector<std::int64_t> expected;  // TE's rule: per document, chunk r then chunk 2cp-1-r
    for (std::size_t d = 0; d < docs; ++d) {
      const std::int64_t chunk = (cu[d + 1] - cu[d]) / (2 * cp);
      for (const std::int64_t k : {std::int64_t{r}, std::int64_t{2 * cp - 1 - r}})
        for (std::int64_t t = k * chunk; t < (k + 1) * chunk; ++t) expected.push_back(t);
    }
    if (cp > 1) CHECK(sh.position_ids == expected);
    for (std::size_t i = 0; i < sh.token_index.size(); ++i) {
      const std::int64_t g = sh.token_index[i];
      const std::size_t d = doc_of(cu, g);
      // Each id is the token's position within its (padded) sequence.
      CHECK(sh.position_ids[i] == g - cu[d]);
      REQUIRE(sh.position_ids[i] >= 0);
      REQUIRE(sh.position_ids[i] < cu[d + 1] - cu[d]);
      ++covered[d][static_cast<std::size_t>(sh.position_ids[i])];
    }
  }
  // The union over ranks covers each sequence's positions exactly once.
  for (std::size_t d = 0; d < docs; ++d)
    for (std::size_t t = 0; t < covered[d].size(); ++t) {
      INFO("document ", d, " position ", t);
      CHECK(covered[d][t] == 1);
    }
}

}  // namespace

TEST_CASE("seq thd: position ids are the positions of each rank's tokens in their document, TE's split") {
  // By hand: cp = 2, documents of 5 and 7 padded to 8 and 8; rank 0 holds chunks 0 and 3 (positions
  // 0,1,6,7) of both, rank 1 chunks 1 and 2 (2..5); position 5..7 of document 0 are padding.
  const auto p = cp_thd{.cp = 2, .pad = true}.plan(std::vector<std::int64_t>{5, 7});
  CHECK(p.ranks[0].position_ids == std::vector<std::int64_t>{0, 1, 6, 7, 0, 1, 6, 7});
  CHECK(p.ranks[1].position_ids == std::vector<std::int64_t>{2, 3, 4, 5, 2, 3, 4, 5});
  check_position_ids(p, 2);
}

TEST_CASE("seq thd: position ids over random packed streams, padded or not, cover every sequence once") {
  std::mt19937_64 rng(37);
  for (int cp = 1; cp <= 8; ++cp) {
    for (int trial = 0; trial < 20; ++trial) {
      const bool pad = trial % 2 == 0;
      std::vector<std::int64_t> lens(std::uniform_int_distribution<std::size_t>(1, 6)(rng));
      for (auto& l : lens) {
        l = std::uniform_int_distribution<std::int64_t>(pad ? 0 : 1, 10 * 2 * cp)(rng);
        if (!pad) l = (l + 2 * cp - 1) / (2 * cp) * (2 * cp);  // unpadded: 2cp divides each length
      }
      INFO("cp=", cp, " pad=", pad, " trial=", trial);
      check_position_ids(cp_thd{.cp = cp, .pad = pad}.plan(lens), cp);
    }
  }
}
