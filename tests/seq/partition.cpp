// SPDX-License-Identifier: Apache-2.0
// The partition families as policy types: each type's plan is its planner's, its traits say what it
// needs of the model, and it compares, hashes and prints. Also the context-parallel corners against the
// peers: zigzag at cp = 1 (Megatron-LM), errors naming their planner, and THD position ids with padding
// (TransformerEngine's generate_positional_ids_for_cp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
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

namespace {
std::vector<std::int64_t> iota_to(std::int64_t n, std::int64_t from = 0) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = from; i < n; ++i) v.push_back(i);
  return v;
}
}  // namespace

TEST_CASE("zigzag with cp = 1 passes any length through unchanged, as Megatron-LM's does") {
  for (const std::int64_t len : {0, 1, 2, 7, 13, 64, 1001}) {
    CAPTURE(len);
    const auto p = partition_zigzag(len, 1);
    CHECK(p.padded_tokens() == len);
    REQUIRE(p.ranks.size() == 1);
    CHECK(p.ranks[0].token_index == iota_to(len));
    CHECK(p.ranks[0].source_index == iota_to(len));
    CHECK(p.ranks[0].position_ids == iota_to(len));
    CHECK(p.ranks[0].cu_seqlens == std::vector<std::int64_t>{0, len});
    CHECK(p.policy.scheme == cp_scheme::zigzag);
    CHECK(cp_zigzag{.cp = 1}.plan(len) == p);
  }
  // The same for THD (TransformerEngine's get_batch_on_this_cp_rank returns the batch unchanged at cp = 1).
  const std::vector<std::int64_t> lens{5, 3, 8, 0, 1};
  const auto t = partition_thd(lens, 1);
  CHECK(t.cu_seqlens_padded == std::vector<std::int64_t>{0, 5, 8, 16, 16, 17});
  CHECK(t.ranks[0].token_index == iota_to(17));
  CHECK(t.ranks[0].source_index == iota_to(17));
  // Asked to pad, cp = 1 pads to a multiple of 2 like any cp (TE's pad_thd_sequences_for_cp(.., 2)).
  CHECK(partition_zigzag(7, 1, true).padded_tokens() == 8);
  CHECK(partition_thd(lens, 1, true).cu_seqlens_padded == std::vector<std::int64_t>{0, 6, 10, 18, 18, 20});
}

TEST_CASE("zigzag errors name zigzag, THD errors name THD") {
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string z = message([] { (void)partition_zigzag(10, 4); });
  CHECK(z.find("partition_zigzag") != std::string::npos);
  CHECK(z.find("partition_thd") == std::string::npos);
  CHECK(z.find("10 tokens") != std::string::npos);
  CHECK(z.find("2*cp = 8") != std::string::npos);
  CHECK(message([] { (void)partition_zigzag(11, 0); }).find("partition_zigzag: cp = 0") != std::string::npos);
  CHECK(message([] { (void)partition_zigzag(-3, 2); }).find("partition_zigzag") != std::string::npos);
  const std::int64_t lens[] = {8, 6};
  const std::string t = message([&] { (void)partition_thd(lens, 2); });
  CHECK(t.find("partition_thd: document 1 has 6 tokens") != std::string::npos);
}

TEST_CASE("THD position ids equal TransformerEngine's generate_positional_ids_for_cp, pads included") {
  // Golden values worked by hand from TE's definitions: generate_positional_ids_for_cp(cu_seqlens, 2cp)
  // counts each document from 0 through its padding; get_batch_on_this_cp_rank gives rank r, per
  // document, slices r and 2cp-1-r of the padded document.
  const std::vector<std::int64_t> lens{5, 8, 3};
  const std::vector<std::int64_t> cu{0, 5, 13, 16};
  std::vector<std::int64_t> te = iota_to(8);  // 5 -> 8
  for (auto v : iota_to(8)) te.push_back(v);  // 8 stays 8
  for (auto v : iota_to(4)) te.push_back(v);  // 3 -> 4
  CHECK(padded_position_ids(cu, 4) == te);
  const auto p = partition_thd(lens, 2, true);
  CHECK(p.cu_seqlens_padded == std::vector<std::int64_t>{0, 8, 16, 20});
  CHECK(p.ranks[0].position_ids == std::vector<std::int64_t>{0, 1, 6, 7, 0, 1, 6, 7, 0, 3});
  CHECK(p.ranks[1].position_ids == std::vector<std::int64_t>{2, 3, 4, 5, 2, 3, 4, 5, 1, 2});
  // Pad tokens (source -1) keep TE's positions: 5, 6, 7 of document 0 and 3 of document 2.
  CHECK(p.ranks[0].source_index == std::vector<std::int64_t>{0, 1, -1, -1, 5, 6, 11, 12, 13, -1});
  CHECK(p.ranks[1].source_index == std::vector<std::int64_t>{2, 3, 4, -1, 7, 8, 9, 10, 14, 15});

  // TE's documented example (lengths 7, 11, 5 at cp = 2): padded to 8, 12, 8.
  std::vector<std::int64_t> te2 = iota_to(8);
  for (auto v : iota_to(12)) te2.push_back(v);
  for (auto v : iota_to(8)) te2.push_back(v);
  CHECK(padded_position_ids(std::vector<std::int64_t>{0, 7, 18, 23}, 4) == te2);
  // Empty documents add nothing; divisibility 1 is the unpadded stream.
  CHECK(padded_position_ids(std::vector<std::int64_t>{0, 0, 3, 3}, 6) == iota_to(6));
  CHECK(padded_position_ids(std::vector<std::int64_t>{0, 2, 5}, 1) ==
        std::vector<std::int64_t>{0, 1, 0, 1, 2});
  CHECK_THROWS_AS((void)padded_position_ids(std::vector<std::int64_t>{1, 4}, 4), invalid_argument);
  CHECK_THROWS_AS((void)padded_position_ids(std::vector<std::int64_t>{0, 4, 2}, 4), invalid_argument);
  CHECK_THROWS_AS((void)padded_position_ids(std::vector<std::int64_t>{0, 4}, 0), invalid_argument);

  // Every rank's ids are TE's stream ids at its tokens, for seeded random packs and cp 1..5.
  std::uint64_t state = 0x16u;
  const auto next = [&](std::uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>((state >> 33) % n);
  };
  for (int trial = 0; trial < 40; ++trial) {
    const int cp = 1 + static_cast<int>(next(5));
    std::vector<std::int64_t> ls;
    for (std::int64_t i = 0, n = 1 + next(6); i < n; ++i) ls.push_back(next(40));
    const auto part = partition_thd(ls, cp, true);
    const auto ids = padded_position_ids(part.cu_seqlens, 2 * cp);
    REQUIRE(static_cast<std::int64_t>(ids.size()) == part.padded_tokens());
    for (const auto& sh : part.ranks) {
      for (std::size_t i = 0; i < sh.token_index.size(); ++i)
        CHECK(sh.position_ids[i] == ids[static_cast<std::size_t>(sh.token_index[i])]);
    }
  }
}
