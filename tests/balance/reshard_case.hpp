// SPDX-License-Identifier: Apache-2.0
// A seeded reshard workload shared by the balance tests (the plan) and the run tests (its execution):
// samples with encoder items placed by the grouped-reorder plan (items of >= 128 rows split over two
// ranks) and LLM shards from an HDP plan whose small capacity turns long samples into zigzag rings.
#pragma once

#include <cstdint>
#include <vector>

#include <hetmesh/balance/planner.hpp>
#include <hetmesh/balance/reorder.hpp>
#include <hetmesh/balance/reshard.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/hdp.hpp>

namespace hetmesh::test {

struct reshard_case {
  std::vector<seq::seq_desc> seqs;
  std::vector<balance::item_span> items;
  std::vector<balance::encoder_block> enc;
  std::vector<std::int64_t> enc_rows;  // per rank
  seq::hdp_plan llm;
  std::vector<balance::llm_block> blocks;
  std::vector<std::int64_t> llm_rows;  // per rank
};

inline reshard_case make_case(int ranks, std::uint64_t seed) {
  reshard_case rc;
  rng g(seed);
  std::vector<seq::sample_meta> metas;
  for (int i = 0; i < 14; ++i) {
    const std::int64_t id = 100 + 3 * i;
    const std::int64_t len = g.uniform(200, 3000);
    rc.seqs.push_back({id, len});
    seq::sample_meta m{.id = id, .tokens = len, .item_tokens = {}, .owner = static_cast<int>(id % ranks)};
    std::int64_t pos = g.uniform(0, 40);
    for (int k = 0; k < 3; ++k) {
      const std::int64_t rows = g.uniform(16, 400);
      if (pos + rows > len) break;
      rc.items.push_back({id, k, pos, rows});
      m.item_tokens.push_back(rows);
      pos += rows + g.uniform(0, 60);
    }
    metas.push_back(std::move(m));
  }
  // Encoder side: the grouped-reorder plan picks each item's rank; items of >= 128 rows are split over
  // two ranks (as long-short sequence parallelism would), to exercise multi-block items.
  const auto rp = balance::plan_grouped_reorder(metas, ranks);
  rc.enc_rows.assign(static_cast<std::size_t>(ranks), 0);
  for (const auto& it : rc.items) {
    const auto idx = static_cast<std::size_t>(rp.index_of(it.sample_id));
    const int r0 = rp.encoder_rank[static_cast<std::size_t>(rp.item_offset[idx] + it.item)];
    auto add = [&](int r, std::int64_t b, std::int64_t e) {
      rc.enc.push_back({it.sample_id, it.item, r, b, e, rc.enc_rows[static_cast<std::size_t>(r)]});
      rc.enc_rows[static_cast<std::size_t>(r)] += e - b;
    };
    if (it.rows >= 128) {
      add(r0, 0, it.rows / 2);
      add((r0 + 1) % ranks, it.rows / 2, it.rows);
    } else {
      add(r0, 0, it.rows);
    }
  }
  // LLM side: the gap-filling HDP plan with a small capacity, so long samples become zigzag rings.
  rc.llm = balance::plan_gap_filling_hdp(rc.seqs, {.capacity = 1024}, ranks, balance::step_model{});
  rc.blocks = balance::llm_blocks_from_hdp(rc.llm);
  rc.llm_rows.assign(static_cast<std::size_t>(ranks), 0);
  for (const auto& b : rc.blocks) rc.llm_rows[static_cast<std::size_t>(b.rank)] += b.tokens.size();
  return rc;
}

}  // namespace hetmesh::test
