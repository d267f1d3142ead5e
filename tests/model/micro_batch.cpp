// SPDX-License-Identifier: Apache-2.0
// model::micro_batch: the per-rank views a plan gives, checked against the single-rank view of the same
// batch over seeded random multimodal batches and 1-8 ranks (exactly once, positions kept under CP, targets
// across rank boundaries, encoder landings), a hand-worked THD example, and errors.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include <hetmesh/core/random.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/micro_batch.hpp>

using namespace hetmesh;
using namespace hetmesh::model;

namespace {

/// A random step: 1-10 documents of 0-150 tokens (token ids a pure function of (seed, doc, position),
/// never 0), up to 3 encoder items of 3 encoders each, and sometimes a loss mask.
step_batch random_batch(std::uint64_t seed, int max_docs = 10, std::int64_t max_len = 150) {
  rng g(seed);
  step_batch b;
  b.pad_token = -7;
  const int docs = static_cast<int>(g.uniform(1, max_docs));
  std::int64_t item_id = 0;
  for (int d = 0; d < docs; ++d) {
    document doc;
    doc.id = static_cast<std::int64_t>(g.below(1000)) * 16 + d;
    const std::int64_t len = g.below(8) == 0 ? 0 : g.uniform(1, max_len);
    for (std::int64_t p = 0; p < len; ++p)
      doc.tokens.push_back(
          static_cast<std::int64_t>(
              key_hash({seed, static_cast<std::uint64_t>(d), static_cast<std::uint64_t>(p)}) % 50000) +
          1);
    std::int64_t at = 0;
    const int items = static_cast<int>(g.below(4));
    for (int i = 0; i < items && at < len; ++i) {
      const std::int64_t pos = g.uniform(at, len - 1);
      const std::int64_t n = g.uniform(1, std::max<std::int64_t>(1, (len - pos) / 2));
      doc.items.push_back({static_cast<int>(g.below(3)), item_id++, pos, n});
      at = pos + n;
    }
    if (g.below(3) == 0)
      for (std::int64_t p = 0; p < len; ++p) doc.loss_mask.push_back(g.below(4) == 0 ? 0 : 1);
    b.documents.push_back(std::move(doc));
  }
  check_step_batch(b);
  return b;
}

/// What the single-rank view says of each stream token.
struct token_facts {
  std::int64_t token, position, doc_id, target;
  double weight;
};

std::vector<token_facts> reference(const step_batch& b) {
  std::vector<seq::seq_segment> whole;
  for (const auto& d : b.documents) whole.push_back({d.id, {0, d.length()}});
  const auto mb = make_segment_micro_batch(b, whole);
  std::vector<token_facts> out;
  for (std::size_t i = 0; i < mb.tokens.size(); ++i) {
    REQUIRE(mb.stream_index[i] == static_cast<std::int64_t>(i));
    out.push_back({mb.tokens[i], mb.positions[i], mb.doc_ids[i], mb.targets[i], mb.loss_weights[i]});
  }
  return out;
}

/// Every property a rank's micro-batch must have, against the reference.
void check_view(const step_batch& b, const std::vector<token_facts>& ref, const micro_batch& m) {
  const auto v = m.view();
  const auto n = static_cast<std::size_t>(v.size());
  REQUIRE(v.positions.size() == n);
  REQUIRE(v.doc_ids.size() == n);
  REQUIRE(v.stream_index.size() == n);
  REQUIRE(v.targets.size() == n);
  REQUIRE(v.loss_weights.size() == n);
  std::map<std::int64_t, const document*> by_id;
  for (const auto& d : b.documents) by_id[d.id] = &d;
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = v.stream_index[i];
    if (s >= 0) {
      const auto& f = ref[static_cast<std::size_t>(s)];
      CHECK(v.tokens[i] == f.token);
      CHECK(v.positions[i] == f.position);  // TE's rule: a token keeps its position in its document
      CHECK(v.doc_ids[i] == f.doc_id);
      CHECK(v.targets[i] == f.target);
      CHECK(v.loss_weights[i] == f.weight);
      // The builders' sweep agrees with the one-token rule, an independent statement of it.
      CHECK((v.loss_weights[i] != 0.0) == target_counts(*by_id.at(v.doc_ids[i]), v.positions[i]));
    } else {  // padding continues its document and never counts
      CHECK(v.tokens[i] == b.pad_token);
      CHECK(v.positions[i] >= by_id.at(v.doc_ids[i])->length());
      CHECK(v.targets[i] == ignore_target);
      CHECK(v.loss_weights[i] == 0.0);
    }
  }
  // cu_seqlens: from 0 to size(), non-decreasing, each interval one document.
  REQUIRE(v.cu_seqlens.size() == v.seqlen_docs.size() + 1);
  CHECK(v.cu_seqlens.front() == 0);
  CHECK(v.cu_seqlens.back() == v.size());
  for (std::size_t k = 0; k + 1 < v.cu_seqlens.size(); ++k) {
    REQUIRE(v.cu_seqlens[k] <= v.cu_seqlens[k + 1]);
    for (auto i = v.cu_seqlens[k]; i < v.cu_seqlens[k + 1]; ++i)
      CHECK(v.doc_ids[static_cast<std::size_t>(i)] == v.seqlen_docs[k]);
  }
  // Segments tile the local buffer in order.
  std::int64_t at = 0;
  for (const auto& sg : v.segments) {
    CHECK(sg.local_offset == at);
    CHECK(sg.doc_id == b.documents[static_cast<std::size_t>(sg.doc)].id);
    for (std::int64_t k = 0; k < sg.positions.size(); ++k)
      CHECK(v.positions[static_cast<std::size_t>(at + k)] == sg.positions.begin + k);
    at += sg.positions.size();
  }
  CHECK(at == v.size());
  // Each landing replaces exactly the placeholder tokens of its item.
  for (const auto& l : v.encoder_outputs) {
    const encoder_item* item = nullptr;
    const document* doc = nullptr;
    for (const auto& d : b.documents)
      for (const auto& it : d.items)
        if (it.encoder == l.encoder && it.id == l.item) item = &it, doc = &d;
    REQUIRE(item != nullptr);
    for (std::int64_t k = 0; k < l.item_tokens.size(); ++k) {
      const auto i = static_cast<std::size_t>(l.local_offset + k);
      REQUIRE(i < n);
      CHECK(v.doc_ids[i] == doc->id);
      CHECK(v.positions[i] == item->position + l.item_tokens.begin + k);
    }
  }
  CHECK(v.step_tokens == static_cast<std::int64_t>(ref.size()));
}

/// Over a whole step: tokens and targets exactly once, every encoder item's output landing exactly once.
void check_step(const step_batch& b, const std::vector<micro_batch>& parts) {
  const auto ref = reference(b);
  for (const auto& m : parts) check_view(b, ref, m);
  CHECK(micro_batch_exactly_once_violation(b, parts) == "");
  std::int64_t targets = 0;
  for (const auto& m : parts) targets += m.view().local_targets();
  std::int64_t expected_targets = 0;
  for (const auto& f : ref) expected_targets += f.weight != 0.0 ? 1 : 0;
  CHECK(targets == expected_targets);
  if (!parts.empty()) CHECK(parts.front().step_targets == expected_targets);
  std::vector<id_range> items, landed;
  for (const auto& d : b.documents)
    for (const auto& it : d.items) items.push_back({it.id * 4 + it.encoder, 0, it.tokens});
  for (const auto& m : parts)
    for (const auto& l : m.encoder_outputs)
      landed.push_back({l.item * 4 + l.encoder, l.item_tokens.begin, l.item_tokens.end});
  CHECK(exactly_once_violation(items, landed) == "");
}

}  // namespace

TEST_CASE("micro_batch: THD and contiguous CP views cover the step exactly once, for 1-8 ranks") {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const auto b = random_batch(seed);
    const auto lengths = document_lengths(b);
    for (int cp = 1; cp <= 8; ++cp) {
      CAPTURE(seed);
      CAPTURE(cp);
      for (const bool thd : {true, false}) {
        const auto p =
            thd ? seq::partition_thd(lengths, cp, /*pad=*/true) : seq::partition_contiguous(lengths, cp);
        std::vector<micro_batch> parts;
        for (int r = 0; r < cp; ++r) {
          parts.push_back(make_cp_micro_batch(b, p, r));
          CHECK(parts.back().cu_seqlens == p.ranks[static_cast<std::size_t>(r)].cu_seqlens);
        }
        check_step(b, parts);
      }
    }
  }
}

TEST_CASE("micro_batch: zigzag of one long document, with padding, for 1-8 ranks") {
  for (std::uint64_t seed = 100; seed < 130; ++seed) {
    auto b = random_batch(seed, 1, 400);
    for (int cp = 1; cp <= 8; ++cp) {
      CAPTURE(seed);
      CAPTURE(cp);
      const auto p = seq::partition_zigzag(b.documents[0].length(), cp, /*pad=*/true);
      std::vector<micro_batch> parts;
      for (int r = 0; r < cp; ++r) parts.push_back(make_cp_micro_batch(b, p, r));
      check_step(b, parts);
      // Equal shares: zigzag gives each rank the same number of (padded) tokens.
      for (const auto& m : parts) CHECK(m.tokens.size() == parts.front().tokens.size());
    }
  }
}

TEST_CASE("micro_batch: HDP rings and packs cover the step exactly once, for pools of 1-8 ranks") {
  int rings = 0;
  for (std::uint64_t seed = 200; seed < 260; ++seed) {
    const auto b = random_batch(seed, 12, 300);
    for (int pool = 1; pool <= 8; ++pool) {
      CAPTURE(seed);
      CAPTURE(pool);
      std::int64_t longest = 0;
      for (const auto& d : b.documents) longest = std::max(longest, d.length());
      seq::hdp_policy pol;
      pol.capacity = std::max<std::int64_t>(16, (longest + pool - 1) / pool + 4);
      const auto descs = document_descs(b);
      const auto plan = seq::plan_hdp(descs, pol, pool);
      const auto summary = summarize_step(b);  // once per step, shared by every micro-batch
      std::vector<micro_batch> parts;
      for (int r = 0; r < pool; ++r) {
        int index = 0;
        for (const auto& mb : plan.per_rank[static_cast<std::size_t>(r)]) {
          parts.push_back(make_hdp_micro_batch(b, summary, mb, r, index++));
          CHECK(parts.back() == make_hdp_micro_batch(b, mb, r, index - 1));
          CHECK(parts.back().view().size() == mb.tokens);
          if (mb.degree > 1)
            CHECK(parts.back().seqlen_docs.size() == 1);  // a ring's two chunks: one interval
          rings += mb.degree > 1 ? 1 : 0;
        }
      }
      check_step(b, parts);
    }
  }
  CHECK(rings > 100);  // the property covered rings, not only packs
}

TEST_CASE("micro_batch: a hand-worked THD example (one document of 8 tokens, cp = 2)") {
  step_batch b;
  b.documents.push_back(
      {.id = 42, .tokens = {10, 11, 12, 13, 14, 15, 16, 17}, .items = {{1, 9, 3, 2}}, .loss_mask = {}});
  const std::int64_t len[1] = {8};
  const auto p = seq::partition_thd(len, 2);
  const auto r0 = make_cp_micro_batch(b, p, 0), r1 = make_cp_micro_batch(b, p, 1);
  // Rank 0 holds chunks 0 and 3 (positions 0,1,6,7); rank 1 chunks 1 and 2 (positions 2..5).
  CHECK(r0.positions == std::vector<std::int64_t>{0, 1, 6, 7});
  CHECK(r1.positions == std::vector<std::int64_t>{2, 3, 4, 5});
  CHECK(r0.cu_seqlens == std::vector<std::int64_t>{0, 4});
  CHECK(r0.seqlen_docs == std::vector<std::int64_t>{42});
  // Position 1's target (12) lives on rank 1; positions 2 and 3 predict the image placeholders (3, 4)
  // and do not count; position 4 (an image token) predicts 15 and counts; the last token has no target.
  CHECK(r0.targets == std::vector<std::int64_t>{11, 12, 17, ignore_target});
  CHECK(r0.loss_weights == std::vector<double>{1, 1, 1, 0});
  CHECK(r1.targets == std::vector<std::int64_t>{ignore_target, ignore_target, 15, 16});
  CHECK(r1.loss_weights == std::vector<double>{0, 0, 1, 1});
  CHECK(r0.step_targets == 5);
  // The image (encoder 1, item 9) covers positions 3 and 4, both on rank 1 at local tokens 1 and 2.
  CHECK(r0.encoder_outputs.empty());
  REQUIRE(r1.encoder_outputs.size() == 1);
  CHECK(r1.encoder_outputs[0] == encoder_landing{1, 9, {0, 2}, 1});
  CHECK(to_string(r1).find("enc1:item9[0,2)@1") != std::string::npos);
}

TEST_CASE("micro_batch: an item cut by a CP chunk boundary lands in pieces on two ranks") {
  step_batch b;
  b.documents.push_back(
      {.id = 1, .tokens = {1, 2, 3, 4, 5, 6, 7, 8}, .items = {{0, 5, 1, 4}}, .loss_mask = {}});
  const std::int64_t len[1] = {8};
  const auto p = seq::partition_thd(len, 2);
  const auto r0 = make_cp_micro_batch(b, p, 0), r1 = make_cp_micro_batch(b, p, 1);
  // Item tokens at positions 1..4: position 1 on rank 0 (local 1), positions 2..4 on rank 1 (local 0..2).
  REQUIRE(r0.encoder_outputs.size() == 1);
  CHECK(r0.encoder_outputs[0] == encoder_landing{0, 5, {0, 1}, 1});
  REQUIRE(r1.encoder_outputs.size() == 1);
  CHECK(r1.encoder_outputs[0] == encoder_landing{0, 5, {1, 4}, 0});
}

TEST_CASE("micro_batch: errors name what is wrong") {
  const auto b = random_batch(7);
  auto lengths = document_lengths(b);
  lengths.push_back(4);
  const auto wrong = seq::partition_thd(lengths, 2, true);
  CHECK_THROWS_WITH_AS((void)make_cp_micro_batch(b, wrong, 0),
                       doctest::Contains("do not match the batch's document"), invalid_argument);
  const auto p = seq::partition_thd(document_lengths(b), 2, true);
  CHECK_THROWS_WITH_AS((void)make_cp_micro_batch(b, p, 2),
                       doctest::Contains("rank 2; expected a rank in [0, 2)"), invalid_argument);
  const seq::seq_segment unknown[1] = {{-5, {0, 1}}};
  CHECK_THROWS_WITH_AS((void)make_segment_micro_batch(b, unknown), doctest::Contains("document id -5"),
                       invalid_argument);
  const seq::seq_segment outside[1] = {{b.documents[0].id, {0, b.documents[0].length() + 1}}};
  CHECK_THROWS_WITH_AS((void)make_segment_micro_batch(b, outside),
                       doctest::Contains("expected a range inside"), invalid_argument);

  step_batch dup;
  dup.documents = {{.id = 3, .tokens = {1, 2}, .items = {}, .loss_mask = {}},
                   {.id = 3, .tokens = {1}, .items = {}, .loss_mask = {}}};
  CHECK_THROWS_WITH_AS(check_step_batch(dup), doctest::Contains("document id 3 appears twice"),
                       invalid_argument);
  step_batch overlap;
  overlap.documents = {
      {.id = 1, .tokens = {1, 2, 3, 4}, .items = {{0, 1, 0, 2}, {0, 2, 1, 2}}, .loss_mask = {}}};
  CHECK_THROWS_WITH_AS(check_step_batch(overlap),
                       doctest::Contains("item 2 (encoder 0) covers tokens [1, 3)"), invalid_argument);
  step_batch mask;
  mask.documents = {{.id = 1, .tokens = {1, 2, 3}, .items = {}, .loss_mask = {1}}};
  CHECK_THROWS_WITH_AS(check_step_batch(mask), doctest::Contains("loss mask of 1 entries for 3 tokens"),
                       invalid_argument);
  step_batch twice;
  twice.documents = {{.id = 1, .tokens = {1, 2}, .items = {{2, 8, 0, 1}}, .loss_mask = {}},
                     {.id = 2, .tokens = {1, 2}, .items = {{2, 8, 0, 1}}, .loss_mask = {}}};
  CHECK_THROWS_WITH_AS(check_step_batch(twice), doctest::Contains("encoder 2 item id 8 appears twice"),
                       invalid_argument);
}

TEST_CASE("micro_batch: the exactly-once check catches a lost and a doubled token") {
  const auto b = random_batch(11, 4, 60);
  std::vector<seq::seq_segment> whole;
  for (const auto& d : b.documents) whole.push_back({d.id, {0, d.length()}});
  auto m = make_segment_micro_batch(b, whole);
  REQUIRE(m.tokens.size() >= 2);
  std::vector<micro_batch> twice{m, m};
  CHECK(micro_batch_exactly_once_violation(b, twice).find("assigned twice") != std::string::npos);
  m.stream_index.back() = -1;
  std::vector<micro_batch> lost{m};
  CHECK(micro_batch_exactly_once_violation(b, lost).find("never assigned") != std::string::npos);
}

TEST_CASE("encoder_batch: long-short pieces cover every item exactly once, for 1-8 ranks") {
  int split = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    rng g(seed);
    std::vector<seq::seq_desc> items;
    const int n = static_cast<int>(g.uniform(1, 12));
    for (int i = 0; i < n; ++i) items.push_back({i * 3 + 1, g.uniform(1, 3000)});
    for (int ranks = 1; ranks <= 8; ++ranks) {
      CAPTURE(seed);
      CAPTURE(ranks);
      seq::long_short_policy pol;
      pol.max_tokens_per_rank = 40000;  // room for every item on one rank
      pol.heads = 8;
      pol.cluster.devices_per_node = 8;
      const auto plan = seq::plan_long_short(items, ranks, pol);
      std::vector<id_range> expected, got;
      for (const auto& it : items) expected.push_back({it.id, 0, it.length});
      for (int r = 0; r < ranks; ++r) {
        const auto eb = make_encoder_batch(plan, 2, r);
        const auto v = eb.view();
        CHECK(v.encoder == 2);
        std::int64_t at = 0;
        for (const auto& pc : v.pieces) {
          CHECK(pc.offset == at);
          at += pc.tokens.size();
          got.push_back({pc.item, pc.tokens.begin, pc.tokens.end});
          split += pc.degree > 1 ? 1 : 0;
        }
        CHECK(v.size() == at);
        CHECK(at == plan.tokens[static_cast<std::size_t>(r)]);
      }
      CHECK(exactly_once_violation(expected, got) == "");
      CHECK_THROWS_AS((void)make_encoder_batch(plan, 0, ranks), invalid_argument);
    }
  }
  encoder_batch eb;
  eb.encoder = 1;
  eb.pieces = {{4, 10, {5, 10}, 0, 2, 1}};
  eb.tokens = 5;
  CHECK(to_string(eb) == "encoder_batch{encoder=1, rank=0, mb=0, tokens=5, pieces=[item4[5,10)/10@0]}");
  CHECK(split > 20);  // the property covered Ulysses pieces, not only whole items
}
