// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism through train::system (system_options::mesh): the multimodal model (tiny_stack's
// attention blocks with q, k, v column-parallel and o row-parallel over ctx.tp, two encoders) on 8
// loopback ranks under tp 2 with pp 1 and 2 and every partition family (DP, static CP, HDP, Ulysses over
// each rank's heads) matches a 1-rank run of the whole model (train::check_parity, comparing each rank's
// block of a split tensor with the full tensor's elements); the groups the system derived are Megatron's
// for its order; bad meshes are refused naming the dimension.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/moe_lm.hpp"
#include "train/pipeline_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

template <class Partition, class Balancer = train::family_placement>
mm_verdict tp_parity(const Partition& partition, int pp, int tp, Balancer balancer = {}) {
  train::system_options o;
  o.mesh.tp = tp;
  return testsupport::rank0_of(8, [&](auto& w) {
    return mm_parity_body<double>(w, partition, balancer, train::pipeline_config<>{pp, {}, {}}, 31, 8, 28, o);
  });
}

}  // namespace

TEST_CASE("tensor parallel: tp 2 x pp {1, 2} under every partition family matches a 1-rank run") {
  // Ulysses splits each tp rank's 2 query and 1 KV heads (kTpShape over tp 2) over its group.
  const seq::ulysses ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4};
  for (int pp : {1, 2}) {
    CAPTURE(pp);
    const mm_verdict runs[] = {
        tp_parity(seq::cp_thd{.cp = 1}, pp, 2), tp_parity(seq::cp_zigzag{.cp = 2, .pad = true}, pp, 2),
        tp_parity(seq::hdp<seq::no_offload>{.capacity = 12}, pp, 2), tp_parity(ulysses, pp, 2)};
    for (const auto& v : runs) {
      MESSAGE(v.describe());
      CHECK(v.rel <= 2e-5);
      CHECK(v.rel <= 1e-10);
      CHECK(v.loss_rel <= 1e-10);
      CHECK(v.targets == v.expected_targets);  // every token's loss counted once, not once per tp rank
      CHECK(v.tokens == v.expected_tokens);
      CHECK(v.stages == pp);
    }
  }
}

TEST_CASE("tensor parallel: tp 2 x pp 2 x cp 2 x dp 2 on 16 ranks matches a 1-rank run") {
  train::system_options o;
  o.mesh = {.tp = 2, .cp = 2};
  const auto v = testsupport::rank0_of(16, [&](auto& w) {
    return mm_parity_body<double>(w, seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                                  train::pipeline_config<>{2, {}, {}}, 33, 10, 28, o);
  });
  MESSAGE(v.describe());
  CHECK(v.rel <= 1e-10);
  CHECK(v.loss_rel <= 1e-10);
  CHECK(v.targets == v.expected_targets);
  CHECK(v.stages == 2);
}

TEST_CASE("tensor parallel: the system's groups are Megatron's for its order, and ctx.tp is set") {
  comm::loopback::run(8, [&](comm::loopback::communicator& c) {
    train::system_options o;
    o.mesh = {.tp = 2, .cp = 2, .ep = 2};
    train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator> sys(
        {.cp = 2, .pad = true}, train::family_placement{}, train::pipeline_config<>{2, {}, {}}, c, {}, o);
    const mesh::megatron_moe_mesh mm({.world = 8, .tp = 2, .cp = 2, .pp = 2, .ep = 2});
    const auto& g = sys.groups();
    auto holds = [&](const std::vector<std::vector<int>>& family, const train::system_group& mine) {
      return family[static_cast<std::size_t>(mine.index)] == mine.ranks &&
             mine.ranks[static_cast<std::size_t>(mine.position)] == c.rank();
    };
    CHECK(holds(mm.decoder_groups("tp"), g.tp));
    CHECK(holds(mm.decoder_groups("dp-cp"), g.pool));
    CHECK(holds(mm.decoder_groups("pp"), g.pipe));
    CHECK(holds(mm.expert_groups("ep"), g.ep));
    CHECK(sys.pool_size() == 2);
    CHECK(sys.tp_size() == 2);
    CHECK(sys.tp_rank() == c.rank() % 2);          // tp fastest in tp-cp-ep-dp-pp
    CHECK(sys.pool_rank() == (c.rank() / 2) % 2);  // then the pool (cp x dp)
    CHECK(sys.pipeline_rank() == c.rank() / 4);    // pp slowest
    CHECK(sys.split().tp == 2);
    CHECK(sys.split().tp_rank == sys.tp_rank());
    CHECK(sys.ranks().at(sys.pipeline_rank(), sys.pool_rank()) == g.tp.ranks);  // tp peers read the same data
    // The encoders' domain row: every rank of this pipeline rank (Megatron's tp-dp-cp group), one model with
    // mesh::decoupled: on nodes of 4 devices each row is one node and spans the LLM's tp and cp.
    CHECK(holds(mm.decoder_groups("tp-dp-cp"), g.row));
    CHECK(g.row.position == sys.pool_rank() * 2 + sys.tp_rank());
    const auto placed = sys.layout().encoder_placement(mesh::topology{.nodes = 2, .devices_per_node = 4});
    const auto rows = placed.encoder_groups(train::system_layout::encoder_row_dim);
    REQUIRE(rows.size() == 2);
    for (const auto& row : rows) {
      CHECK(row.in_node());
      CHECK(row.llm_dims == std::vector<mesh::dim>{mesh::tp, mesh::cp});
    }
  });
}

TEST_CASE("tensor parallel: a mesh that does not fit the world is refused naming the dimension") {
  auto refusal = [](int world, train::system_mesh m, int pp = 1) {
    std::string text;
    comm::loopback::run(world, [&](comm::loopback::communicator& c) {
      train::system_options o;
      o.mesh = m;
      try {
        train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator> sys(
            {.cp = 1}, train::family_placement{}, train::pipeline_config<>{pp, {}, {}}, c, {}, o);
      } catch (const invalid_argument& e) {
        if (c.rank() == 0) text = e.what();
      }
    });
    return text;
  };
  CHECK(refusal(6, {.tp = 4}).find("is not tp 4 x pool x 1 pipeline ranks") != std::string::npos);
  CHECK(refusal(8, {.tp = 2, .cp = 3}).find("mesh cp = 3 does not divide the pool of 4") !=
        std::string::npos);
  CHECK(refusal(4, {.tp = 1, .ep = 3}).find("mesh ep = 3 x etp = 1 does not divide") != std::string::npos);
  CHECK(refusal(4, {.tp = 0}).find("mesh tp = 0; expected >= 1") != std::string::npos);
  CHECK(refusal(8, {.tp = 2, .order = "tp-cp-xx-dp-pp"}).find("unknown dim 'xx'") != std::string::npos);
}

TEST_CASE("tensor parallel: train::system_layout's groups equal megatron-core's goldens for every shape") {
  std::ifstream in(HETMESH_MESH_DATA_DIR "/megatron_moe_groups.json");
  REQUIRE(in);
  const auto doc = nlohmann::json::parse(in);
  int compared = 0;
  for (const auto& c : doc.at("cases")) {
    if (c.contains("refused")) continue;
    const auto& s = c.at("shape");
    const train::system_mesh m{.tp = s.at("tp").get<int>(),
                               .cp = s.at("cp").get<int>(),
                               .ep = s.at("ep").get<int>(),
                               .etp = s.value("etp", 0),
                               .order = s.at("order").get<std::string>()};
    CAPTURE(s.dump());
    const train::system_layout l(m, s.at("world").get<int>(), s.at("pp").get<int>());
    const auto& g = c.at("groups");
    using groups = std::vector<std::vector<int>>;
    CHECK(l.family(0) == g.at("TENSOR_MODEL_PARALLEL_GROUP").get<groups>());
    CHECK(l.family(1) == g.at("DATA_PARALLEL_GROUP_WITH_CP").get<groups>());
    CHECK(l.family(2) == g.at("PIPELINE_MODEL_PARALLEL_GROUP").get<groups>());
    CHECK(l.family(4) == g.at("EXPERT_MODEL_PARALLEL_GROUP").get<groups>());
    CHECK(l.family(5) == g.at("EXPERT_DATA_PARALLEL_GROUP").get<groups>());
    // The encoder mesh's rows (the encoders' domain at one pipeline rank): Megatron's tp-dp-cp group, in its
    // order when tp is innermost (every golden's order).
    CHECK(l.family(6) == g.at("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP").get<groups>());
    for (int r = 0; r < l.world(); ++r) {
      const auto gr = l.groups_of(r);
      CHECK(gr.row.position == gr.pool.position * m.tp + gr.tp.position);
    }
    ++compared;
  }
  CHECK(compared >= 8);  // every shape megatron-core accepted in the goldens
}

TEST_CASE(
    "tensor and expert parallel: a model whose sizes do not split over the mesh is refused naming them") {
  const auto batch = random_batch(61, 4, 16);
  // Runs one step of `make(sys)` under `partition` and `mesh` on `world` ranks; rank 0's error.
  auto refusal = [&](int world, const auto& partition, train::system_mesh mesh, auto make) {
    std::string text;
    comm::loopback::run(world, [&](comm::loopback::communicator& c) {
      train::system_options o;
      o.mesh = mesh;
      using P = std::remove_cvref_t<decltype(partition)>;
      train::system<P, model::reference_attention, comm::loopback::communicator> sys(
          partition, train::family_placement{}, train::pipeline_config<>{}, c, {}, o);
      auto m = make(sys);
      try {
        (void)sys.run(sys.plan(batch), batch, m, [](auto&&, auto&&) {});
      } catch (const invalid_argument& e) {
        if (c.rank() == 0) text = e.what();
      }
    });
    return text;
  };
  const lm_shape three_heads{.vocab = 13, .width = 6, .attn = {3, 3, 2}};
  auto whole = [&](const lm_shape& s) {  // the model unsplit: tp 1 in its own eyes
    return [s](auto& sys) { return tiny_stack<double>(s, 1, kBlocks, sys.num_stages(), sys.local_stages()); };
  };
  CHECK(refusal(2, seq::cp_thd{.cp = 1}, {.tp = 2}, whole(three_heads))
            .find("mesh tp = 2 does not divide the stage's 3 attention heads") != std::string::npos);
  const seq::ulysses four{.degree = 4,
                          .heads = 4,
                          .kv_heads = 2,
                          .head_dim = 4};  // plans, but 4 heads / tp 2 do not split 4 ways
  CHECK(refusal(8, four, {.tp = 2},
                [](auto& sys) { return tiny_stack<double>(kTpShape, 1, kBlocks, sys.split()); })
            .find("Ulysses degree 4 x mesh tp = 2 does not divide the stage's 4 attention heads") !=
        std::string::npos);
  CHECK(refusal(6, seq::cp_thd{.cp = 1}, {.ep = 3}, [](auto& sys) {
          return moe_lm<double>(kShape, 1, sys.split());
        }).find("mesh ep = 3 does not divide the stage's 4 experts") != std::string::npos);
}
