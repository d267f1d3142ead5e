// SPDX-License-Identifier: Apache-2.0
// Properties of seq/ planners over seeded random inputs, interoperability vectors (Megatron-LM,
// TransformerEngine, ByteScale's worked example) and errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/seq.hpp>

using namespace hetmesh;
using namespace hetmesh::seq;

namespace {

std::vector<seq_desc> random_seqs(std::uint64_t seed, int n, std::int64_t max_len, std::int64_t min_len = 1) {
  rng g(seed);
  std::vector<seq_desc> out;
  for (int i = 0; i < n; ++i) {
    // Log-uniform lengths: many short, a few long, like real corpora.
    const double u = g.unit();
    const auto len = static_cast<std::int64_t>(
        std::exp(std::log(static_cast<double>(min_len)) +
                 u * (std::log(static_cast<double>(max_len)) - std::log(static_cast<double>(min_len)))));
    out.push_back({static_cast<std::int64_t>(g.below(1u << 30)) * 64 + i, std::max(min_len, len)});
  }
  return out;
}

std::vector<seq_desc> shuffled(std::vector<seq_desc> v, std::uint64_t seed) {
  rng g(seed);
  shuffle(std::span<seq_desc>(v), g);
  return v;
}

}  // namespace

TEST_CASE("offload solver reproduces ByteScale's worked example (l=32, C=8K, Act ~ s)") {
  offload_model m;  // Act(s) = s, layers 32, overlap ignored (infinite bandwidth)
  m.d2h_bandwidth = m.h2d_bandwidth = std::numeric_limits<double>::infinity();
  m.activation.layers = 32;  // a declared link needs the layers per rank
  const std::int64_t C = 8192;
  struct row {
    std::int64_t s;
    int d[5];
  };
  // r = 0, 0.25, 0.5, 0.75, 1.0 (ByteScale §3.3 table)
  const row rows[] = {{65536, {8, 7, 5, 3, 1}},
                      {319488, {39, 30, 21, 12, 3}},
                      {1048576, {128, 98, 68, 38, 8}},
                      {2097152, {256, 196, 136, 76, 16}}};
  for (const auto& r : rows)
    for (int k = 0; k <= 4; ++k) {
      CAPTURE(r.s);
      CAPTURE(k);
      CHECK(offload_ranks(r.s, C, m, k, 4) == r.d[k]);
    }
  // The solver at full overlap picks r = 1 for 1M: 8 ranks; with offloading off: 128 ranks.
  const auto c = solve_offload(1048576, C, m, {}, 16384);
  CHECK(c.ranks == 8);
  CHECK(c.ratio_k == c.ratio_steps);
  CHECK(c.ratio_lower_bound == doctest::Approx(32.0 / (30.0 * 128.0)));
  CHECK(solve_offload(1048576, C, m, {.enabled = false}, 16384).ranks == 128);
}

TEST_CASE("offload solver: the overlap bound caps r, the least r reaching the least D is chosen") {
  offload_model m;
  m.activation.alpha = 1.0;  // bytes per token per layer (scaled)
  m.layer.a = 1e-9;
  m.layer.b = 0;
  m.d2h_bandwidth = 1.0e3;
  m.activation.layers = 32;  // a declared link needs the layers per rank
  m.h2d_bandwidth = 5.0e2;
  const std::int64_t C = 8192;
  for (std::int64_t s : {16384LL, 65536LL, 262144LL, 1048576LL}) {
    const auto c = solve_offload(s, C, m, {}, 1 << 20);
    const double rmax = std::min(1.0, m.compute(s) * 5.0e2 / m.activation_bytes(s));
    CHECK(c.ratio_max == doctest::Approx(rmax));
    CHECK(c.ratio() <= rmax + 1e-12);
    CHECK(c.ranks == offload_ranks(s, C, m, static_cast<int>(std::floor(rmax * 100 + 1e-9)), 100));
    if (c.ratio_k > 0) CHECK(offload_ranks(s, C, m, c.ratio_k - 1, 100) > c.ranks);
    // Overlap condition holds for the chosen ratio.
    CHECK(m.compute(s) >= m.activation_bytes(s) * c.ratio() / 5.0e2 - 1e-12);
  }
}

TEST_CASE("offload solver: a sequence the pool cannot hold even with full offloading") {
  offload_model m;
  m.d2h_bandwidth = m.h2d_bandwidth = std::numeric_limits<double>::infinity();
  m.activation.layers = 32;  // a declared link needs the layers per rank
  CHECK_THROWS_AS((void)solve_offload(2097152, 8192, m, {}, 15), capacity_error);  // needs 16 at r = 1
  CHECK_NOTHROW((void)solve_offload(2097152, 8192, m, {}, 16));
  std::vector<seq_desc> one{{7, 4 * 1048576}};
  CHECK_THROWS_AS((void)plan_hdp(one, hdp_policy{.capacity = 8192, .offload = {.enabled = true}}, 16),
                  capacity_error);
}

TEST_CASE("packing: best-fit decreasing, exactly once, capacity, permutation invariance, position ids") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const auto docs = random_seqs(seed, 200, 4096);
    const pack_policy pol{.capacity = 4096};
    const auto plan = pack(docs, pol);
    std::map<std::int64_t, int> seen;
    std::int64_t total = 0;
    for (const auto& mb : plan.micro_batches) {
      CHECK(mb.tokens() <= pol.capacity);
      CHECK(mb.cu_seqlens.size() == mb.docs.size() + 1);
      const auto pos = mb.position_ids();
      REQUIRE(static_cast<std::int64_t>(pos.size()) == mb.tokens());
      for (std::size_t d = 0; d < mb.docs.size(); ++d) {
        seen[mb.docs[d].id]++;
        CHECK(mb.cu_seqlens[d + 1] - mb.cu_seqlens[d] == mb.docs[d].length);
        CHECK(pos[static_cast<std::size_t>(mb.cu_seqlens[d])] == 0);
        CHECK(pos[static_cast<std::size_t>(mb.cu_seqlens[d + 1] - 1)] == mb.docs[d].length - 1);
      }
      total += mb.tokens();
    }
    CHECK(seen.size() == docs.size());
    for (auto& [id, n] : seen) CHECK(n == 1);
    // Best fit never opens a bin while one that fits exists: any two bins together exceed C.
    const auto n = plan.micro_batches.size();
    CHECK(static_cast<std::int64_t>(n) >= (total + pol.capacity - 1) / pol.capacity);
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = a + 1; b < n; ++b)
        CHECK(plan.micro_batches[a].tokens() + plan.micro_batches[b].tokens() > pol.capacity);
    CHECK(plan_hash(pack(shuffled(docs, seed * 7), pol)) == plan_hash(plan));
    CHECK(pack(shuffled(docs, seed * 7), pol) == plan);
  }
}

namespace {
// Best-fit decreasing written the slow, obvious way: scan every bin.
std::vector<std::vector<std::int64_t>> slow_bfd(std::vector<seq_desc> docs, std::int64_t cap) {
  std::sort(docs.begin(), docs.end(), [](const seq_desc& a, const seq_desc& b) {
    return a.length != b.length ? a.length > b.length : a.id < b.id;
  });
  std::vector<std::vector<std::int64_t>> bins;
  std::vector<std::int64_t> room;
  for (const auto& d : docs) {
    std::size_t best = bins.size();
    for (std::size_t b = 0; b < bins.size(); ++b)
      if (room[b] >= d.length && (best == bins.size() || room[b] < room[best])) best = b;
    if (best == bins.size()) {
      bins.emplace_back();
      room.push_back(cap);
    }
    bins[best].push_back(d.id);
    room[best] -= d.length;
  }
  return bins;
}
}  // namespace

TEST_CASE("packing equals a brute-force best-fit decreasing, for small and huge capacities") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    for (std::int64_t cap : {std::int64_t{1000}, std::int64_t{4096}, (std::int64_t{1} << 20) + 7}) {
      const auto docs = random_seqs(seed, 300, cap, 1);
      const auto plan = pack(docs, {.capacity = cap});
      const auto ref = slow_bfd(docs, cap);
      REQUIRE(plan.micro_batches.size() == ref.size());
      for (std::size_t b = 0; b < ref.size(); ++b) {
        std::vector<std::int64_t> ids;
        for (const auto& d : plan.micro_batches[b].docs) ids.push_back(d.id);
        CHECK(ids == ref[b]);
      }
    }
}

TEST_CASE("packing: over-long documents are reported, never cut") {
  std::vector<seq_desc> docs{{1, 100}, {2, 5000}, {3, 300}, {4, 9000}};
  CHECK_THROWS_AS((void)pack(docs, {.capacity = 4096}), capacity_error);
  try {
    (void)pack(docs, {.capacity = 4096});
  } catch (const capacity_error& e) {
    CHECK(std::string(e.what()).find("id=4") != std::string::npos);
  }
  const auto p = pack(docs, {.capacity = 4096, .overlong = overlong_action::reject});
  REQUIRE(p.rejected.size() == 2);
  CHECK(p.rejected[0].id == 4);
  CHECK(p.rejected[1].id == 2);
  REQUIRE(p.micro_batches.size() == 1);
  CHECK(p.micro_batches[0].tokens() == 400);
  CHECK_THROWS_AS((void)pack(std::vector<seq_desc>{{1, 3}, {1, 4}}, {.capacity = 10}), invalid_argument);
}

namespace {
// Megatron-LM get_batch_on_this_cp_rank (per-sequence): view seq as [2cp, L/2cp], take rows r and
// 2cp-1-r. Written independently of partition_zigzag.
std::vector<std::int64_t> megatron_zigzag(std::int64_t len, int cp, int r) {
  const std::int64_t c = len / (2 * cp);
  std::vector<std::int64_t> idx;
  for (int row : {r, 2 * cp - 1 - r})
    for (std::int64_t j = 0; j < c; ++j) idx.push_back(row * c + j);
  return idx;
}
// TransformerEngine thd_partition_indices_kernel, restated: for output token t on rank r, find the
// sequence in cu_seqlens/cp, then map into the first or second half chunk.
std::vector<std::int64_t> te_thd_indices(const std::vector<std::int64_t>& cu, int ws, int rank) {
  std::vector<std::int64_t> cus;
  for (auto x : cu) cus.push_back(x / ws);
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t < cu.back() / ws; ++t) {
    std::size_t s = 0;
    while (cus[s + 1] <= t) ++s;
    const std::int64_t len = cus[s + 1] - cus[s];
    std::int64_t index = t - cus[s];
    const std::int64_t offset = index < len / 2 ? rank : (ws - 1) * 2 - rank;
    index += cus[s] * ws + len / 2 * offset;
    out.push_back(index);
  }
  return out;
}

void check_partition_exactly_once(const cp_partition& p) {
  const auto total = p.padded_tokens();
  std::vector<int> hits(static_cast<std::size_t>(total), 0);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& sh = p.ranks[r];
    REQUIRE(sh.position_ids.size() == sh.token_index.size());
    for (std::size_t i = 0; i < sh.token_index.size(); ++i) {
      const auto g = sh.token_index[i];
      hits[static_cast<std::size_t>(g)]++;
      CHECK(p.owner_rank[static_cast<std::size_t>(g)] == static_cast<int>(r));
      CHECK(p.owner_local[static_cast<std::size_t>(g)] == static_cast<std::int64_t>(i));
      // position = offset inside the padded document
      const auto d = std::upper_bound(p.cu_seqlens_padded.begin(), p.cu_seqlens_padded.end(), g) -
                     p.cu_seqlens_padded.begin() - 1;
      CHECK(sh.position_ids[i] == g - p.cu_seqlens_padded[static_cast<std::size_t>(d)]);
      const bool real = sh.position_ids[i] < p.cu_seqlens[static_cast<std::size_t>(d) + 1] -
                                                 p.cu_seqlens[static_cast<std::size_t>(d)];
      CHECK(sh.source_index[i] ==
            (real ? p.cu_seqlens[static_cast<std::size_t>(d)] + sh.position_ids[i] : -1));
    }
    CHECK(sh.cu_seqlens.front() == 0);
    CHECK(sh.cu_seqlens.back() == sh.tokens());
  }
  for (auto h : hits) CHECK(h == 1);
}
}  // namespace

TEST_CASE("zigzag equals Megatron-LM get_batch_on_this_cp_rank; contiguous and zigzag are exact covers") {
  for (int cp : {1, 2, 3, 4, 8}) {
    for (std::int64_t len : {2 * cp, 2 * cp * 7, 2 * cp * 64}) {
      const auto p = partition_zigzag(len, cp);
      check_partition_exactly_once(p);
      for (int r = 0; r < cp; ++r)
        CHECK(p.ranks[static_cast<std::size_t>(r)].token_index == megatron_zigzag(len, cp, r));
    }
  }
  CHECK_THROWS_AS((void)partition_zigzag(10, 4), invalid_argument);  // 10 % 8 != 0
  const auto padded = partition_zigzag(10, 4, true);
  CHECK(padded.padded_tokens() == 16);
  check_partition_exactly_once(padded);
  const std::int64_t lens[] = {5, 0, 17, 3};
  check_partition_exactly_once(partition_contiguous(lens, 4));
}

TEST_CASE("THD per-document zigzag equals TransformerEngine's partitioned indices, incl. padding") {
  // TransformerEngine's own example: lengths 7, 11, 5 at cp = 2 pad to cu_seqlens [0, 8, 20, 28].
  const std::int64_t te_lens[] = {7, 11, 5};
  const auto te = partition_thd(te_lens, 2, true);
  CHECK(te.cu_seqlens_padded == std::vector<std::int64_t>{0, 8, 20, 28});
  CHECK(te.ranks[0].cu_seqlens == std::vector<std::int64_t>{0, 4, 10, 14});
  CHECK_THROWS_AS((void)partition_thd(te_lens, 2, false), invalid_argument);
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    rng g(seed);
    for (int cp : {1, 2, 3, 4}) {
      std::vector<std::int64_t> lens;
      const int n = 1 + static_cast<int>(g.below(6));
      for (int i = 0; i < n; ++i) lens.push_back(static_cast<std::int64_t>(g.below(60)));
      const auto p = partition_thd(lens, cp, true);
      check_partition_exactly_once(p);
      for (std::size_t d = 0; d < lens.size(); ++d) {
        const auto pl = p.cu_seqlens_padded[d + 1] - p.cu_seqlens_padded[d];
        CHECK(pl % (2 * cp) == 0);
        CHECK(pl - lens[d] < 2 * cp);  // padded at its end, by less than 2cp
        CHECK(pl >= lens[d]);
      }
      for (int r = 0; r < cp; ++r)
        CHECK(p.ranks[static_cast<std::size_t>(r)].token_index == te_thd_indices(p.cu_seqlens_padded, cp, r));
      // Equal tokens and equal causal work on every rank (per document, both chunks mirror).
      std::vector<std::int64_t> work;
      for (const auto& sh : p.ranks) {
        CHECK(sh.tokens() == p.padded_tokens() / cp);
        work.push_back(causal_work(sh));
      }
      CHECK(*std::max_element(work.begin(), work.end()) == *std::min_element(work.begin(), work.end()));
    }
  }
}

TEST_CASE("zigzag evens causal work per rank; contiguous does not (max/mean reported)") {
  const int cp = 8;
  const std::int64_t len = 2 * cp * 512;
  auto ratio = [](const cp_partition& p) {
    std::int64_t mx = 0, sum = 0;
    for (const auto& sh : p.ranks) {
      const auto w = causal_work(sh);
      mx = std::max(mx, w);
      sum += w;
    }
    return static_cast<double>(mx) * static_cast<double>(p.ranks.size()) / static_cast<double>(sum);
  };
  const std::int64_t one[] = {len};
  const double z = ratio(partition_zigzag(len, cp)), c = ratio(partition_contiguous(one, cp));
  MESSAGE("causal work max/mean over cp=8, one 8192-token sequence: zigzag ", z, ", contiguous ", c);
  CHECK(z == doctest::Approx(1.0));
  CHECK(c > 1.8);
}

TEST_CASE("ring schedule: each position meets every KV chunk once, pairs cover its causal work exactly") {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    rng g(seed);
    const int cp = 1 + static_cast<int>(g.below(5));
    std::vector<std::int64_t> lens;
    for (int i = 0; i < 4; ++i) lens.push_back(static_cast<std::int64_t>(1 + g.below(80)));
    for (const auto& part : {partition_thd(lens, cp, true), partition_contiguous(lens, cp)}) {
      std::vector<int> ring(static_cast<std::size_t>(cp));
      for (int i = 0; i < cp; ++i) ring[static_cast<std::size_t>(i)] = 100 + 3 * ((i * 7) % cp);  // any ranks
      const auto s = ring_for(part, ring);
      for (int p = 0; p < cp; ++p) {
        std::set<int> sources;
        for (int t = 0; t < cp; ++t) {
          const auto& st = s.steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
          sources.insert(st.kv_source);
          if (t + 1 < cp) {
            CHECK(st.send_to == s.next(p));
            CHECK(st.recv_from == s.prev(p));
            // what p sends at step t is what p+1 uses at step t+1
            CHECK(s.steps[static_cast<std::size_t>(s.next(p))][static_cast<std::size_t>(t + 1)].kv_source ==
                  st.kv_source);
          } else {
            CHECK(st.send_to == -1);
          }
        }
        CHECK(static_cast<int>(sources.size()) == cp);
        CHECK(s.work[static_cast<std::size_t>(p)] == causal_work(part.ranks[static_cast<std::size_t>(p)]));
      }
      CHECK(plan_hash(s) == plan_hash(ring_for(part, ring)));
    }
  }
  CHECK_THROWS_AS((void)make_ring_schedule({1, 1}, {{}, {}}), invalid_argument);
}

namespace {
void check_hdp_plan(const hdp_plan& plan, std::span<const seq_desc> seqs) {
  const auto& sh = plan.sharding;
  std::int64_t total = 0;
  for (const auto& s : seqs) total += s.length;
  CHECK(plan.global_tokens() == total);
  // Every token of every sequence exactly once.
  std::map<std::int64_t, std::vector<token_range>> got;
  for (int r = 0; r < sh.pool; ++r) {
    const auto& mbs = plan.per_rank[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < mbs.size(); ++i) {
      const auto& mb = mbs[i];
      if (i > 0) CHECK(std::pair(mbs[i - 1].order, mbs[i - 1].item) < std::pair(mb.order, mb.item));
      const auto& item = sh.items[static_cast<std::size_t>(mb.item)];
      CHECK(plan.ring(mb)[static_cast<std::size_t>(mb.ring_position)] == r);
      CHECK(mb.tokens <= sh.policy.capacity * (item.offload.ratio_k > 0 ? sh.policy.model.layers() : 1));
      if (item.packed) CHECK(mb.tokens <= sh.policy.capacity);
      if (!item.packed && item.offload.ratio_k == 0) CHECK(mb.tokens <= sh.policy.capacity);
      for (const auto& sg : mb.segments) got[sg.seq_id].push_back(sg.tokens);
    }
  }
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    auto v = got[s.id];
    std::sort(v.begin(), v.end());
    std::int64_t at = 0;
    for (const auto& rg : v) {
      CHECK(rg.begin == at);
      at = rg.end;
    }
    CHECK(at == s.length);
  }
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    const auto& ring = plan.placement[i].ring;
    CHECK(static_cast<int>(ring.size()) == sh.items[i].degree);
    CHECK(std::set<int>(ring.begin(), ring.end()).size() == ring.size());
    if (!sh.items[i].packed) {
      const auto& it = sh.items[i];
      CHECK(it.degree == offload_ranks(it.tokens, sh.policy.capacity, sh.policy.model, it.offload.ratio_k,
                                       it.offload.ratio_steps));
    }
  }
  // Running each rank's list in order completes (no ring waits on a rank stuck behind it).
  std::vector<std::size_t> head(static_cast<std::size_t>(sh.pool), 0);
  std::size_t done = 0, total_mb = 0;
  for (const auto& v : plan.per_rank) total_mb += v.size();
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < sh.pool; ++r) {
      const auto& mbs = plan.per_rank[static_cast<std::size_t>(r)];
      if (head[static_cast<std::size_t>(r)] >= mbs.size()) continue;
      const auto& mb = mbs[head[static_cast<std::size_t>(r)]];
      bool ready = true;
      for (int m : plan.ring(mb)) {
        const auto& other = plan.per_rank[static_cast<std::size_t>(m)];
        const auto h = head[static_cast<std::size_t>(m)];
        ready = ready && h < other.size() && other[h].item == mb.item;
      }
      if (!ready) continue;
      for (int m : plan.ring(mb)) head[static_cast<std::size_t>(m)]++;
      done += static_cast<std::size_t>(mb.degree);
      progress = true;
    }
  }
  CHECK(done == total_mb);
}
}  // namespace

TEST_CASE("HDP: exactly once, capacity, rings of D distinct ranks, no deadlock, permutation invariance") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const auto seqs = random_seqs(seed, 300, 300000, 16);
    for (bool off : {false, true}) {
      hdp_policy pol{.capacity = 8192, .offload = {.enabled = off}};
      pol.model.layer.a = 2e-6;  // compute hides offloading only for longer sequences
      pol.model.d2h_bandwidth = pol.model.h2d_bandwidth = 1.0;
      pol.model.activation.layers = 32;  // a declared link needs the layers per rank
      const auto plan = plan_hdp(seqs, pol, 64);
      check_hdp_plan(plan, seqs);
      CHECK(plan_hash(plan_hdp(shuffled(seqs, seed + 99), pol, 64)) == plan_hash(plan));
      auto pol_ll = pol;
      pol_ll.placement = hdp_placement_kind::least_loaded;
      const auto ll = plan_hdp(seqs, pol_ll, 64);
      check_hdp_plan(ll, seqs);
      CHECK(ll.sharding.items == plan.sharding.items);
      CHECK(plan_hash(plan_hdp(shuffled(seqs, seed + 5), pol_ll, 64)) == plan_hash(ll));
      // Greedy on modelled cost keeps the most loaded rank within one largest item of the mean here.
      std::vector<std::int64_t> load(64, 0);
      std::int64_t biggest = 0, total = 0;
      for (std::size_t i = 0; i < ll.sharding.items.size(); ++i) {
        const auto c = hdp_item_cost(ll.sharding.items[i], pol.model);
        biggest = std::max(biggest, c);
        for (int r : ll.placement[i].ring) {
          load[static_cast<std::size_t>(r)] += c;
          total += c;
        }
      }
      CHECK(*std::max_element(load.begin(), load.end()) <= total / 64 + biggest + 1);
      if (!off)
        for (const auto& it : plan.sharding.items)
          if (!it.packed) CHECK(it.degree == (it.tokens + 8191) / 8192);
    }
  }
}

namespace {
/// The least-loaded greedy as first written (std heap of (load, rank) pairs, pop and push per
/// ring member): the reference the faster placement must equal, plan for plan.
std::vector<hdp_placement> reference_least_loaded(const hdp_sharding& sh) {
  std::vector<std::int64_t> cost(sh.items.size());
  std::vector<std::size_t> order(sh.items.size());
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    cost[i] = hdp_item_cost(sh.items[i], sh.policy.model);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return cost[a] != cost[b] ? cost[a] > cost[b] : a < b; });
  using slot = std::pair<std::int64_t, int>;
  std::vector<slot> heap;
  for (int r = 0; r < sh.pool; ++r) heap.push_back({0, r});
  std::vector<hdp_placement> out(sh.items.size());
  for (std::size_t turn = 0; turn < order.size(); ++turn) {
    const std::size_t i = order[turn];
    std::vector<slot> taken;
    for (int k = 0; k < sh.items[i].degree; ++k) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      taken.push_back(heap.back());
      heap.pop_back();
    }
    out[i].order = static_cast<std::int64_t>(turn);
    for (auto& t : taken) {
      out[i].ring.push_back(t.second);
      heap.push_back({t.first + cost[i], t.second});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
    std::sort(out[i].ring.begin(), out[i].ring.end());
  }
  return out;
}
}  // namespace

TEST_CASE("HDP: the fast paths equal their references (least-loaded heap, counting-sort best fit)") {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    auto seqs = random_seqs(seed, 400, 200000, 16);
    // Ascending ids take best fit's counting sort; random ids its comparison sort.
    auto ascending = seqs;
    for (std::size_t i = 0; i < ascending.size(); ++i) ascending[i].id = static_cast<std::int64_t>(i);
    for (const auto* batch : {&seqs, &ascending})
      for (int pool : {61, 1024}) {
        hdp_policy pol{.capacity = 4096};
        if (seed % 2 == 0) pol.model.layer = {.a = 1e-4, .b = 1.0, .c = 0};  // loads past 2^43 ns: pair keys
        const auto sh = hdp_shard(*batch, pol, pool);
        CHECK(hdp_least_loaded_placement(sh) == reference_least_loaded(sh));
        std::vector<seq_desc> shorts;
        for (const auto& s : *batch)
          if (s.length <= pol.capacity) shorts.push_back(s);
        const auto plan = pack(shorts, {.capacity = pol.capacity});
        const auto ref = slow_bfd(shorts, pol.capacity);
        REQUIRE(plan.micro_batches.size() == ref.size());
        for (std::size_t b = 0; b < ref.size(); ++b) {
          std::vector<std::int64_t> ids;
          for (const auto& d : plan.micro_batches[b].docs) ids.push_back(d.id);
          CHECK(ids == ref[b]);
        }
      }
  }
}

TEST_CASE("HDP: any ring size, uneven zigzag chunks, assemble checks placements") {
  std::vector<seq_desc> seqs{{10, 3 * 8192 - 5}, {11, 1000}, {12, 2000}, {13, 8192}};
  const auto plan = plan_hdp(seqs, {.capacity = 8192}, 5);
  REQUIRE(plan.sharding.items.size() == 3);
  CHECK(plan.sharding.items[0].degree == 3);
  CHECK(hdp_ranges(3 * 8192 - 5, 3, 0) == std::vector<token_range>{{0, 4095}, {20475, 24571}});
  check_hdp_plan(plan, seqs);
  auto sh = hdp_shard(seqs, {.capacity = 8192}, 5);
  auto pl = hdp_naive_placement(sh);
  pl[0].ring = {0, 1, 1};
  CHECK_THROWS_AS((void)hdp_assemble(sh, pl), invalid_argument);
  pl[0].ring = {0, 1};
  CHECK_THROWS_AS((void)hdp_assemble(sh, pl), invalid_argument);
  pl[0].ring = {0, 1, 7};
  CHECK_THROWS_AS((void)hdp_assemble(sh, pl), invalid_argument);
  CHECK_THROWS_AS((void)hdp_shard(seqs, {.capacity = 8192}, 2), capacity_error);  // 3 ranks needed, pool 2
  CHECK(to_string(plan).find("hdp_plan") == 0);
}

TEST_CASE("Ulysses: plan counts and head / GQA checks") {
  const std::int64_t toks[] = {5, 7, 6, 6};
  const auto u = plan_ulysses(toks, {.degree = 4, .heads = 8, .kv_heads = 2, .head_dim = 3});
  CHECK(u.heads_per_rank == 2);
  CHECK(u.kv_replication == 2);
  CHECK(u.kv_head_begin == std::vector<int>{0, 0, 1, 1});
  CHECK(u.q_send_counts[1][3] == 7 * 2 * 3);
  CHECK(u.kv_send_counts[1][3] == 7 * 1 * 3);
  const auto u2 = plan_ulysses(toks, {.degree = 4, .heads = 8, .kv_heads = 8, .head_dim = 3});
  CHECK(u2.kv_heads_per_rank == 2);
  CHECK(u2.kv_head_begin == std::vector<int>{0, 2, 4, 6});
  CHECK_THROWS_AS((void)plan_ulysses(toks, {.degree = 4, .heads = 6, .kv_heads = 6}), invalid_argument);
  CHECK_THROWS_AS((void)plan_ulysses(toks, {.degree = 4, .heads = 12, .kv_heads = 3}), invalid_argument);
  CHECK_THROWS_AS((void)plan_ulysses(toks, {.degree = 4, .heads = 8, .kv_heads = 3}), invalid_argument);
  CHECK_THROWS_AS(
      (void)plan_ulysses(std::span<const std::int64_t>(toks, 3), {.degree = 4, .heads = 8, .kv_heads = 8}),
      invalid_argument);
}

TEST_CASE("long-short SP: short whole, long on aligned intra-node groups dividing heads, loads modelled") {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const auto items = random_seqs(seed, 60, 20000, 64);
    const long_short_policy pol{.max_tokens_per_rank = 40000,
                                .heads = 16,
                                .cluster = {.devices_per_node = 8},
                                .balance_factor = 1.0,
                                .encoder = {.layer = {.a = 1e-4, .b = 1.0}, .train_factor = 1.0}};
    const int ranks = 16;
    const auto plan = plan_long_short(items, ranks, pol);
    std::map<std::int64_t, int> seen;
    std::vector<hetmesh::cost::fixed> load(ranks);
    std::vector<std::int64_t> tok(ranks, 0);
    for (const auto& a : plan.items) {
      seen[a.item.id]++;
      CHECK(pol.heads % a.degree == 0);
      CHECK(a.first_rank % a.degree == 0);
      const int node = pol.cluster.devices_per_node;
      CHECK(a.first_rank / node == (a.first_rank + a.degree - 1) / node);
      std::int64_t at = 0;
      for (int k = 0; k < a.degree; ++k) {
        CHECK(a.splits[static_cast<std::size_t>(k)].begin == at);
        CHECK(a.splits[static_cast<std::size_t>(k)].size() >= 1);  // no empty piece
        at = a.splits[static_cast<std::size_t>(k)].end;
        load[static_cast<std::size_t>(a.first_rank + k)] +=
            hetmesh::cost::fixed::from_ticks(a.cost.ticks / a.degree + (k < a.cost.ticks % a.degree ? 1 : 0));
        tok[static_cast<std::size_t>(a.first_rank + k)] += a.splits[static_cast<std::size_t>(k)].size();
      }
      CHECK(at == a.item.length);
      CHECK(a.cost == hetmesh::cost::fixed::from_units(pol.cost(a.item.length)));  // rounded once
    }
    CHECK(seen.size() == items.size());
    for (int r = 0; r < ranks; ++r) {
      CHECK(load[static_cast<std::size_t>(r)] == plan.load[static_cast<std::size_t>(r)]);  // exact sums
      CHECK(tok[static_cast<std::size_t>(r)] <= pol.max_tokens_per_rank);
    }
    CHECK(plan_long_short(shuffled(items, seed), ranks, pol) == plan);
    if (seed == 1) {
      const double mx = std::max_element(plan.load.begin(), plan.load.end())->units();
      const double mean =
          std::accumulate(plan.load.begin(), plan.load.end(), hetmesh::cost::fixed{}).units() / ranks;
      MESSAGE("long-short modelled load max/mean: ", mx / mean, ", groups: ", to_string(plan.groups));
    }
  }
  std::vector<seq_desc> huge{{1, 100000}};
  CHECK_THROWS_AS(
      (void)plan_long_short(huge, 16,
                            {.max_tokens_per_rank = 10000, .heads = 16, .cluster = {.devices_per_node = 8}}),
      capacity_error);  // needs 10 ranks; groups are at most gcd(16, 8) = 8
  CHECK_NOTHROW((void)plan_long_short(
      huge, 16, {.max_tokens_per_rank = 12500, .heads = 16, .cluster = {.devices_per_node = 8}}));
}

TEST_CASE("long-short SP: a group never has more ranks than its item has tokens (no empty piece)") {
  // Every item is long by balance (beta tiny); short items of 1-5 tokens may only split as far as their
  // tokens go, so every member of a group holds a piece and meets the others in the item's collectives.
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const auto items = random_seqs(seed, 12, 5, 1);
    const long_short_policy pol{.max_tokens_per_rank = 64,
                                .heads = 8,
                                .min_split_tokens = 0,  // short items split for balance too
                                .cluster = {.devices_per_node = 8},
                                .balance_factor = 0.01};
    const auto plan = plan_long_short(items, 8, pol);
    int split = 0;
    for (const auto& a : plan.items) {
      CHECK(a.degree <= a.item.length);
      split += a.degree > 1 ? 1 : 0;
      for (const auto& r : a.splits) CHECK(r.size() >= 1);
    }
    CHECK(split > 0);  // the balance rule did split items
  }
}

TEST_CASE(
    "long-short SP: the plan is invariant under permutation and under a reordering of the model's "
    "arithmetic") {
  // The same model written two ways: coefficients 0.1 + 0.2 and 0.3 differ in the last bit of a double,
  // as a cost summed in another order would. Rounded once to fixed-point, both give the same decisions.
  const double a1 = 0.1e-4 + 0.2e-4, a2 = 0.3e-4;
  REQUIRE(a1 != a2);
  for (std::uint64_t seed = 11; seed <= 20; ++seed) {
    const auto items = random_seqs(seed, 80, 30000, 64);
    long_short_policy p1{.max_tokens_per_rank = 50000,
                         .heads = 8,
                         .cluster = {.devices_per_node = 8},
                         .balance_factor = 1.0,
                         .encoder = {.layer = {.a = a1, .b = 0.1 + 0.7}, .train_factor = 1.0}};
    long_short_policy p2 = p1;
    p2.encoder.layer.a = a2;
    p2.encoder.layer.b = 0.8;
    const auto plan1 = plan_long_short(items, 16, p1);
    const auto plan2 = plan_long_short(items, 16, p2);
    CHECK(plan1.items == plan2.items);
    CHECK(plan1.load == plan2.load);
    CHECK(plan1.groups == plan2.groups);
    for (std::uint64_t k = 1; k <= 4; ++k)
      CHECK(plan_long_short(shuffled(items, seed * 7 + k), 16, p1) == plan1);
  }
}

TEST_CASE("every plan and policy prints") {
  const std::vector<seq_desc> seqs{{1, 40000}, {2, 100}, {3, 9000}};
  const auto hp = plan_hdp(seqs, {.capacity = 8192}, 8);
  CHECK(to_string(hp.sharding.policy).find("C=8192") != std::string::npos);
  CHECK(to_string(hp.sharding.items[0]).find("ring D=5") != std::string::npos);
  CHECK(to_string(hp.per_rank[0][0]).find("pos=0/5") != std::string::npos);
  CHECK(to_string(hp.placement[0]).find("ring=[0, 1, 2, 3, 4]") != std::string::npos);
  CHECK(to_string(hdp_placement_kind::least_loaded) == "least_loaded");
  CHECK(to_string(overlong_action::reject) == "reject");
  const auto pp = pack(seqs, {.capacity = 40000});
  CHECK(to_string(pp).find("micro_batches=2") != std::string::npos);
  CHECK(to_string(pp.micro_batches[0]).find("cu_seqlens=[0, 40000]") != std::string::npos);
  const std::int64_t lens[] = {4, 8};
  const auto part = partition_thd(lens, 2);
  CHECK(to_string(part).find("cu_seqlens_padded=[0, 4, 12]") != std::string::npos);
  CHECK(to_string(part.ranks[1].chunks[0]) == "d0c1[1,2)@0");
  const auto rs = ring_for(part, {3, 9});
  CHECK(to_string(rs).find("ring=[3, 9]") != std::string::npos);
  CHECK(to_string(rs.steps[0][0]).find("q0xkv0:full, q1xkv0:full, q1xkv1:full, q2xkv2:causal") !=
        std::string::npos);
  CHECK(to_string(block_mask::full) == "full");
  CHECK(to_string(cp_policy{cp_scheme::zigzag, 4, true}) == "cp_policy{zigzag, cp=4, pad=true}");
  offload_model hides;
  hides.d2h_bandwidth = hides.h2d_bandwidth = std::numeric_limits<double>::infinity();
  hides.activation.layers = 32;  // a declared link needs the layers per rank
  const auto c = solve_offload(1048576, 8192, hides, {}, 1024);
  CHECK(to_string(c).find("D=8") != std::string::npos);
  CHECK(to_string(offload_policy{}).find("steps=100") != std::string::npos);
  const std::int64_t toks[] = {3, 3};
  CHECK(to_string(plan_ulysses(toks, {.degree = 2, .heads = 4, .kv_heads = 2, .head_dim = 8}))
            .find("kv/rank=1") != std::string::npos);
  const auto ls = plan_long_short(
      seqs, 8, {.max_tokens_per_rank = 20000, .heads = 8, .cluster = {.devices_per_node = 8}});
  CHECK(to_string(ls).find("groups=[(0, 2), (0, 8)]") != std::string::npos);
  CHECK(to_string(ls.items[0]) == "seq{id=1, len=40000}->ranks[0,8)");
}
