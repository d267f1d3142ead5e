// SPDX-License-Identifier: Apache-2.0
// The partition families as policy types: each type's plan is its planner's, its traits say what it
// needs of the model, and it compares, hashes and prints.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/seq/partition.hpp>

using namespace hetmesh;
using namespace hetmesh::seq;

TEST_CASE("seq families: each type's plan is its planner's") {
  const std::vector<std::int64_t> lens{8, 16, 24};
  CHECK(cp_zigzag{.cp = 2}.plan(64) == partition_zigzag(64, 2));
  CHECK(cp_zigzag{.cp = 4, .pad = true}.plan(10) == partition_zigzag(10, 4, true));
  CHECK(cp_thd{.cp = 2}.plan(lens) == partition_thd(lens, 2));
  CHECK(cp_contiguous{.cp = 3}.plan(lens) == partition_contiguous(lens, 3));
  CHECK_THROWS_AS((void)cp_thd{.cp = 4}.plan(std::vector<std::int64_t>{10}), invalid_argument);

  const ulysses u{.degree = 2, .heads = 4, .kv_heads = 2, .head_dim = 8};
  const std::vector<std::int64_t> tokens{5, 7};
  CHECK(u.plan(tokens) == plan_ulysses(tokens, ulysses_policy{2, 4, 2, 8}));

  std::vector<seq_desc> seqs;
  for (std::int64_t i = 0; i < 40; ++i) seqs.push_back({i, 100 + 997 * i % 9000});
  const hdp<selective_offload> h{.capacity = 4096};
  CHECK(h.policy().offload.enabled);
  CHECK_FALSE(hdp<no_offload>{}.policy().offload.enabled);
  CHECK(h.plan(seqs, 8) == plan_hdp(seqs, h.policy(), 8));

  std::vector<seq_desc> items;  // encoder items: images and a few long videos
  for (std::int64_t i = 0; i < 24; ++i) items.push_back({i, i % 8 == 0 ? 6000 : 64 + 131 * i % 1500});
  const long_short_policy ls{.max_tokens_per_rank = 8192, .heads = 8};
  CHECK(ls.plan(items, 8) == plan_long_short(items, 8, ls));
}

TEST_CASE("seq families: traits, equality, hashing and printing") {
  static_assert(cp_zigzag::ring_attention && cp_thd::ring_attention && hdp<>::ring_attention);
  static_assert(!ulysses::ring_attention && !long_short_policy::ring_attention);
  static_assert(llm_partition<hdp<no_offload>> && !encoder_partition<hdp<no_offload>>);
  static_assert(encoder_partition<long_short_policy> && !llm_partition<long_short_policy>);
  static_assert(!partition_family<cp_policy>);  // a plan's record, not a family
  static_assert(partition_accepts<ulysses, false> && !partition_accepts<cp_thd, false>);
  static_assert(partition_accepts<cp_thd, true>);
  CHECK(cp_thd{.cp = 2} == cp_thd{.cp = 2});
  CHECK(cp_thd{.cp = 2} != cp_thd{.cp = 2, .pad = true});
  // The family is part of the hash: the same parameters under another family hash apart.
  CHECK(plan_hash(cp_thd{.cp = 2}) != plan_hash(cp_zigzag{.cp = 2}));
  CHECK(plan_hash(hdp<selective_offload>{}) != plan_hash(hdp<no_offload>{}));
  CHECK(plan_hash(hdp<>{.capacity = 1024}) == plan_hash(hdp<>{.capacity = 1024}));
  CHECK(to_string(cp_zigzag{.cp = 4, .pad = true}) == "cp_zigzag{cp=4, pad=true}");
  CHECK(to_string(cp_thd{.cp = 2}) == "cp_thd{cp=2, pad=false}");
  CHECK(to_string(ulysses{.degree = 2, .heads = 4}) == "ulysses{degree=2, heads=4, kv_heads=1, head_dim=1}");
  CHECK(to_string(hdp<selective_offload>{.capacity = 8})
            .starts_with("hdp<selective_offload{ratio_steps=100}>{C=8, "));
  CHECK(to_string(partition_role::encoder) == "encoder");
}
