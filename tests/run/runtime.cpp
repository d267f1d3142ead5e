// SPDX-License-Identifier: Apache-2.0
// Runtime pieces on loopback ranks with verifiable data: plan-hash agreement, decentralized grouped
// reordering, and adaptive resharding forward and back (transposed plan).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <hetmesh/balance/dp.hpp>
#include <hetmesh/balance/planner.hpp>
#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/run/agreement.hpp>
#include <hetmesh/run/grouped_reorder.hpp>
#include <hetmesh/run/reshard.hpp>

#include "balance/reshard_case.hpp"
#include "balance/support.hpp"

using namespace hetmesh;
using test::make_case;

namespace {
std::int64_t val(std::initializer_list<std::uint64_t> k) {
  return static_cast<std::int64_t>(key_hash(k) >> 2);
}
}  // namespace

TEST_CASE("disagreeing_ranks names the minority, deterministically") {
  CHECK(run::disagreeing_ranks(std::vector<std::uint64_t>{5, 5, 9, 5}) == std::vector<int>{2});
  CHECK(run::disagreeing_ranks(std::vector<std::uint64_t>{7, 7, 7}).empty());
  CHECK(run::disagreeing_ranks(std::vector<std::uint64_t>{9, 4}) ==
        std::vector<int>{0});  // tie: smaller hash wins
}

TEST_CASE("check_plan_agreement passes on equal plans and reports a mismatch naming the rank") {
  const cost::llm_compute llm{cost::bytescale_fig6a_layer(), 8, 3.0};
  std::mutex mu;
  std::vector<std::string> errors(4);
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    const auto seqs = test::random_batch(11, 50, 16, 4096);
    const auto plan = balance::plan_dp(seqs, llm, {.ranks = 4, .capacity = 4096});
    run::check_plan_agreement(c, plan, "dp plan");  // every rank computed the same plan: no throw
    // Rank 2 plans from different metadata (a stale batch): every rank must detect and name it.
    const auto other = balance::plan_dp(test::random_batch(c.rank() == 2 ? 12 : 11, 50, 16, 4096), llm,
                                        {.ranks = 4, .capacity = 4096});
    try {
      run::check_plan_agreement(c, other, "dp plan");
    } catch (const mismatch_error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK(e.find("dp plan hashes disagree") != std::string::npos);
    CHECK(e.find("rank 2 (global 2)") != std::string::npos);
    CHECK(e.find("rank 1 ") == std::string::npos);
  }
}

TEST_CASE("plan agreement and failure agreement over a device communicator, through device buffers") {
  // comm::emulated_device refuses host buffers: the hashes and flags must travel in the policy's memory.
  const cost::llm_compute llm{cost::bytescale_fig6a_layer(), 8, 3.0};
  std::mutex mu;
  std::vector<std::string> errors(4), failures(4);
  comm::loopback::run(4, [&](comm::loopback::communicator& host) {
    comm::emulated_device c(host.subgroup(std::vector<int>{0, 1, 2, 3}));
    const model::emulated_device_memory mem;
    const auto plan =
        balance::plan_dp(test::random_batch(11, 50, 16, 4096), llm, {.ranks = 4, .capacity = 4096});
    run::check_plan_agreement(c, mem, plan, "dp plan");
    run::assert_plan_agreement(c, mem, plan, "dp plan");
    const auto other = balance::plan_dp(test::random_batch(c.rank() == 1 ? 12 : 11, 50, 16, 4096), llm,
                                        {.ranks = 4, .capacity = 4096});
    try {
      run::check_plan_agreement(c, mem, other, "dp plan");
    } catch (const mismatch_error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
    run::agree_on_failure(c, mem, nullptr, "nothing failed");
    std::exception_ptr f;
    if (c.rank() == 3) f = std::make_exception_ptr(invalid_argument("rank 3 could not prepare"));
    try {
      run::agree_on_failure(c, mem, f, "device step");
    } catch (const error& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK(e.find("rank 1 (global 1)") != std::string::npos);
  for (int r = 0; r < 3; ++r)
    CHECK(failures[static_cast<std::size_t>(r)].find("device step: 1 of the group") != std::string::npos);
  CHECK(failures[3] == "rank 3 could not prepare");
}

TEST_CASE("grouped_reorder on loopback: every parcel lands where the plan says, intact, exactly once") {
  constexpr int world = 8, group = 4;
  constexpr std::uint64_t seed = 21;
  const auto groups = balance::locality_groups(world, group, 4);
  REQUIRE(groups.size() == 2);
  std::mutex mu;
  std::vector<std::pair<std::int64_t, int>> landed;  // (sample, item), over all ranks
  std::size_t sent = 0;
  balance::reorder_policy pol;
  pol.token_capacity = 40000;
  comm::loopback::run(world, [&](comm::loopback::communicator& wc) {
    const auto& members = groups[static_cast<std::size_t>(wc.rank() / group)];
    auto c = wc.subgroup(members);
    rng g(seed + static_cast<std::uint64_t>(wc.rank()));
    std::vector<seq::sample_meta> local;
    std::vector<run::parcel<std::int64_t>> parcels;
    const int n = 3 + wc.rank() % 3;
    for (int k = 0; k < n; ++k) {
      seq::sample_meta s;
      s.id = wc.rank() * 100 + k;
      s.owner = c.rank();
      s.tokens = g.uniform(64, 8000);
      const auto items = g.uniform(0, 3);
      for (std::int64_t i = 0; i < items; ++i) s.item_tokens.push_back(g.uniform(16, 3000));
      auto make = [&](int item, std::int64_t len) {
        run::parcel<std::int64_t> p{s.id, item, {}};
        for (std::int64_t j = 0; j < len; ++j)
          p.data.push_back(val({seed, static_cast<std::uint64_t>(s.id), static_cast<std::uint64_t>(item + 1),
                                static_cast<std::uint64_t>(j)}));
        parcels.push_back(std::move(p));
      };
      make(-1, s.tokens / 16 + 1);
      for (std::size_t i = 0; i < s.item_tokens.size(); ++i)
        make(static_cast<int>(i), s.item_tokens[i] / 8 + 1);
      local.push_back(std::move(s));
    }
    const auto res = run::grouped_reorder<comm::loopback::communicator, std::int64_t>(c, local, parcels, pol);
    // The plan covers exactly the group's samples.
    for (auto id : res.plan.sample_ids) CHECK(id / 100 / group == wc.rank() / group);
    // The result carries the gathered records and lengths: no second gather for the next room.
    REQUIRE(res.samples.size() == res.plan.sample_ids.size());
    for (std::size_t i = 0; i < res.samples.size(); ++i) {
      CHECK(res.samples[i].id == res.plan.sample_ids[i]);
      CHECK(res.samples[i].tokens == res.plan.tokens[i]);
      CHECK(res.samples[i].owner == res.plan.owner[i]);
    }
    for (const auto& s : local) CHECK(res.samples[static_cast<std::size_t>(res.plan.index_of(s.id))] == s);
    for (const auto& p : res.received) {
      CHECK(res.plan.destination(p.sample_id, p.item) == c.rank());
      for (std::size_t j = 0; j < p.data.size(); ++j)
        REQUIRE(p.data[j] == val({seed, static_cast<std::uint64_t>(p.sample_id),
                                  static_cast<std::uint64_t>(p.item + 1), static_cast<std::uint64_t>(j)}));
    }
    for (auto t : res.plan.llm_tokens_on) CHECK(t <= pol.token_capacity);
    std::lock_guard<std::mutex> lock(mu);
    sent += parcels.size();
    for (const auto& p : res.received) landed.emplace_back(p.sample_id, p.item);
  });
  CHECK(landed.size() == sent);
  CHECK(std::set<std::pair<std::int64_t, int>>(landed.begin(), landed.end()).size() == sent);
}

TEST_CASE("reshard on loopback: encoder outputs reach the LLM shards and gradients come back transposed") {
  constexpr int ranks = 4;
  constexpr std::int64_t width = 3;
  constexpr std::int64_t sentinel = -7;
  const auto rc = make_case(ranks, 8);
  // Where each item sits: (sample, position) -> (item, row).
  std::map<std::int64_t, std::vector<balance::item_span>> items_of;
  for (const auto& it : rc.items) items_of[it.sample_id].push_back(it);
  auto item_at = [&](std::int64_t s, std::int64_t p) -> const balance::item_span* {
    for (const auto& it : items_of[s])
      if (p >= it.position && p < it.position + it.rows) return &it;
    return nullptr;
  };
  std::atomic<std::int64_t> landed_rows{0};
  comm::loopback::run(ranks, [&](comm::loopback::communicator& c) {
    const int me = c.rank();
    const auto plan = balance::plan_reshard(ranks, rc.items, rc.enc, rc.blocks);
    std::vector<std::int64_t> enc_out(
        static_cast<std::size_t>(rc.enc_rows[static_cast<std::size_t>(me)] * width));
    for (const auto& b : rc.enc)
      if (b.rank == me)
        for (std::int64_t r = b.row_begin; r < b.row_end; ++r)
          for (std::int64_t k = 0; k < width; ++k)
            enc_out[static_cast<std::size_t>((b.offset + r - b.row_begin) * width + k)] =
                val({1, static_cast<std::uint64_t>(b.sample_id), static_cast<std::uint64_t>(b.item),
                     static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(k)});
    std::vector<std::int64_t> llm_in(
        static_cast<std::size_t>(rc.llm_rows[static_cast<std::size_t>(me)] * width), sentinel);
    run::reshard(c, plan, std::span<const std::int64_t>(enc_out), std::span<std::int64_t>(llm_in), width);
    std::int64_t checked = 0;
    for (const auto& b : rc.blocks) {
      if (b.rank != me) continue;
      for (std::int64_t p = b.tokens.begin; p < b.tokens.end; ++p) {
        const auto* it = item_at(b.sample_id, p);
        for (std::int64_t k = 0; k < width; ++k) {
          const auto got = llm_in[static_cast<std::size_t>((b.offset + p - b.tokens.begin) * width + k)];
          const auto want =
              it ? val({1, static_cast<std::uint64_t>(b.sample_id), static_cast<std::uint64_t>(it->item),
                        static_cast<std::uint64_t>(p - it->position), static_cast<std::uint64_t>(k)})
                 : sentinel;
          REQUIRE(got == want);
          checked += it ? 1 : 0;
        }
      }
    }
    // Backward: gradients at LLM positions travel back by the transposed plan.
    std::vector<std::int64_t> llm_grad(llm_in.size());
    for (const auto& b : rc.blocks)
      if (b.rank == me)
        for (std::int64_t p = b.tokens.begin; p < b.tokens.end; ++p)
          for (std::int64_t k = 0; k < width; ++k)
            llm_grad[static_cast<std::size_t>((b.offset + p - b.tokens.begin) * width + k)] =
                val({2, static_cast<std::uint64_t>(b.sample_id), static_cast<std::uint64_t>(p),
                     static_cast<std::uint64_t>(k)});
    std::vector<std::int64_t> enc_grad(enc_out.size(), sentinel);
    run::reshard(c, plan.transposed(), std::span<const std::int64_t>(llm_grad),
                 std::span<std::int64_t>(enc_grad), width);
    for (const auto& b : rc.enc) {
      if (b.rank != me) continue;
      const auto& it = *std::find_if(rc.items.begin(), rc.items.end(), [&](const auto& x) {
        return x.sample_id == b.sample_id && x.item == b.item;
      });
      for (std::int64_t r = b.row_begin; r < b.row_end; ++r)
        for (std::int64_t k = 0; k < width; ++k)
          REQUIRE(enc_grad[static_cast<std::size_t>((b.offset + r - b.row_begin) * width + k)] ==
                  val({2, static_cast<std::uint64_t>(b.sample_id),
                       static_cast<std::uint64_t>(it.position + r), static_cast<std::uint64_t>(k)}));
    }
    landed_rows += checked;
  });
  std::int64_t rows = 0;
  for (const auto& it : rc.items) rows += it.rows;
  CHECK(landed_rows.load() == rows * width);  // every item row landed once, on the rank holding its position
  // Rings really split samples across ranks in this case (the reshard crosses CP/HDP shards).
  bool ring = false;
  for (const auto& it : rc.llm.sharding.items) ring = ring || it.degree > 1;
  CHECK(ring);
}
