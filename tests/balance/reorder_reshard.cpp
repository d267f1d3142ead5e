// SPDX-License-Identifier: Apache-2.0
// The plans behind the runtime pieces: decentralized grouped reordering and adaptive resharding
// (their execution over loopback ranks is tested in tests/run/runtime.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include <hetmesh/balance/reorder.hpp>
#include <hetmesh/balance/reshard.hpp>

#include "reshard_case.hpp"
#include "support.hpp"

using namespace hetmesh;
using test::make_case;

TEST_CASE("plan_grouped_reorder: balance, permutation invariance, capacity") {
  std::vector<seq::sample_meta> s;
  rng g(5);
  for (int i = 0; i < 400; ++i) {
    const int owner = static_cast<int>(g.below(16));
    seq::sample_meta m{.id = i * 3 + 1, .tokens = g.uniform(32, 16000), .item_tokens = {}, .owner = owner};
    for (std::int64_t k = g.uniform(0, 4); k > 0; --k) m.item_tokens.push_back(g.uniform(64, 7290));
    s.push_back(std::move(m));
  }
  const balance::reorder_policy pol;
  const auto plan = balance::plan_grouped_reorder(s, 16, pol);
  // Loads of leaving every sample with its loader, for comparison.
  std::vector<cost::fixed> llm_stay(16), enc_stay(16);
  for (const auto& m : s) {
    llm_stay[static_cast<std::size_t>(m.owner)] += pol.llm.sequence_fixed(m.tokens);
    for (auto t : m.item_tokens) enc_stay[static_cast<std::size_t>(m.owner)] += pol.encoder.item_fixed(t);
  }
  const auto mx = [](const std::vector<cost::fixed>& v) { return *std::max_element(v.begin(), v.end()); };
  CHECK(mx(plan.llm_load) < mx(llm_stay));
  CHECK(mx(plan.encoder_load) < mx(enc_stay));
  cost::fixed tot{};
  for (auto l : plan.llm_load) tot += l;
  CHECK(mx(plan.llm_load).units() <=
        tot.units() / 16 * 1.10);  // within 10% of perfect on 25 samples per rank
  std::int64_t parcels = 0;
  for (auto p : plan.parcels) parcels += p;
  CHECK(parcels == static_cast<std::int64_t>(s.size() + plan.encoder_rank.size()));
  auto rev = s;
  std::reverse(rev.begin(), rev.end());
  CHECK(balance::plan_grouped_reorder(rev, 16, pol) == plan);
  balance::reorder_policy tight = pol;
  tight.token_capacity = 1000;
  CHECK_THROWS_AS((void)balance::plan_grouped_reorder(s, 16, tight), capacity_error);
  CHECK_THROWS_AS((void)balance::locality_groups(12, 6, 4), invalid_argument);
}

TEST_CASE("plan_reshard: exact cover, coalescing, transpose, bad layouts") {
  const auto rc = make_case(4, 3);
  const auto plan = balance::plan_reshard(4, rc.items, rc.enc, rc.blocks);
  std::int64_t rows = 0;
  for (const auto& it : rc.items) rows += it.rows;
  CHECK(plan.total_rows() == rows);
  CHECK(plan.transposed().transposed() == plan);
  CHECK(plan.transposed().total_rows() == rows);
  for (std::size_t k = 1; k < plan.runs.size(); ++k) {  // coalesced: no two mergeable neighbours remain
    const auto& a = plan.runs[k - 1];
    const auto& b = plan.runs[k];
    CHECK_FALSE((a.src == b.src && a.dst == b.dst && a.src_offset + a.rows == b.src_offset &&
                 a.dst_offset + a.rows == b.dst_offset));
  }
  // One item produced twice, or a position no LLM block holds, is rejected.
  auto twice = rc.enc;
  twice.push_back(twice.front());
  CHECK_THROWS_AS((void)balance::plan_reshard(4, rc.items, twice, rc.blocks), invalid_argument);
  auto missing = rc.blocks;
  missing.erase(missing.begin());
  CHECK_THROWS_AS((void)balance::plan_reshard(4, rc.items, rc.enc, missing), invalid_argument);
  // A whole item on one encoder rank into one LLM block: a single coalesced run.
  const std::vector<balance::item_span> one{{1, 0, 10, 50}};
  const std::vector<balance::encoder_block> e1{{1, 0, 2, 0, 20, 0}, {1, 0, 2, 20, 50, 20}};
  const std::vector<balance::llm_block> l1{{1, 3, {0, 100}, 7}};
  const auto p1 = balance::plan_reshard(4, one, e1, l1);
  REQUIRE(p1.runs.size() == 1);
  CHECK(p1.runs[0] == balance::reshard_run{2, 3, 0, 17, 50});
}

TEST_CASE("grouped reorder: the plan carries the gathered lengths; blocks_from_reorder feeds plan_reshard") {
  rng g(17);
  const int ranks = 4;
  std::vector<seq::sample_meta> s;
  std::vector<balance::item_span> items;
  for (int i = 0; i < 30; ++i) {
    const int owner = static_cast<int>(g.below(ranks));
    seq::sample_meta m{
        .id = seq::make_sample_id(i % 3, 0, 7 * i), .tokens = g.uniform(300, 4000), .owner = owner};
    std::int64_t pos = g.uniform(0, 20);
    for (int k = 0; k < 3; ++k) {
      const std::int64_t rows = g.uniform(8, 90);
      if (pos + rows > m.tokens) break;
      items.push_back({m.id, k, pos, rows});
      m.item_tokens.push_back(rows);
      pos += rows + g.uniform(0, 30);
    }
    s.push_back(std::move(m));
  }
  const auto plan = balance::plan_grouped_reorder(s, ranks);
  // Lengths, in canonical order, equal to what was gathered: no second gather needed.
  REQUIRE(plan.tokens.size() == s.size());
  for (const auto& m : s) {
    const auto i = static_cast<std::size_t>(plan.index_of(m.id));
    CHECK(plan.tokens[i] == m.tokens);
    const std::vector<std::int64_t> its(plan.item_tokens.begin() + plan.item_offset[i],
                                        plan.item_tokens.begin() + plan.item_offset[i + 1]);
    CHECK(its == m.item_tokens);
  }
  const auto blocks = balance::blocks_from_reorder(plan);
  REQUIRE(blocks.llm.size() == s.size());
  REQUIRE(blocks.encoder.size() == items.size());
  std::vector<std::int64_t> llm_rows(ranks, 0), enc_rows(ranks, 0);
  for (const auto& b : blocks.llm) {  // whole samples on their planned rank, packed in canonical order
    const auto i = static_cast<std::size_t>(plan.index_of(b.sample_id));
    CHECK(b.rank == plan.llm_rank[i]);
    CHECK(b.tokens == seq::token_range{0, plan.tokens[i]});
    CHECK(b.offset == llm_rows[static_cast<std::size_t>(b.rank)]);
    llm_rows[static_cast<std::size_t>(b.rank)] += b.tokens.size();
  }
  CHECK(llm_rows == plan.llm_tokens_on);
  for (const auto& b : blocks.encoder) {  // whole items on their planned encoder rank
    CHECK(b.rank == plan.destination(b.sample_id, b.item));
    CHECK(b.row_begin == 0);
    CHECK(b.offset == enc_rows[static_cast<std::size_t>(b.rank)]);
    enc_rows[static_cast<std::size_t>(b.rank)] += b.row_end;
  }
  // The reshard over these blocks moves every item row exactly once.
  const auto rp = balance::plan_reshard(ranks, items, blocks.encoder, blocks.llm);
  std::int64_t moved = 0, rows = 0;
  for (const auto& r : rp.runs) moved += r.rows;
  for (const auto& it : items) rows += it.rows;
  CHECK(moved == rows);
  auto bad = plan;
  bad.tokens.pop_back();
  CHECK_THROWS_AS((void)balance::blocks_from_reorder(bad), invalid_argument);
}
