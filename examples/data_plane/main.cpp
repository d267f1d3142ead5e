// SPDX-License-Identifier: Apache-2.0
// example_data_plane: three sources (two token corpora in Megatron's indexed format, one image-text
// WebDataset source), a curriculum written as JSON, and a data plane on a host of its own serving four
// trainer ranks (tp = 2, dp = 2) over loopback threads. Each step prints the quotas, the balanced cost of
// each data-parallel rank and what every trainer received; then the run is checkpointed and resumed.
// Usage: example_data_plane [steps]
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/data.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/data/webdataset.hpp>
#include <hetmesh/run/data_service.hpp>
#include <hetmesh_tools/args.hpp>

namespace data = hetmesh::data;
namespace run = hetmesh::run;

namespace {

// Writes a corpus of `n` documents of `lo`..`hi` tokens (token ids are a function of the seed).
void write_tokens(const std::string& prefix, std::uint64_t seed, int n, std::int64_t lo, std::int64_t hi) {
  data::indexed_dataset_writer w(prefix, data::dtype::int32);
  hetmesh::rng g(seed);
  for (int i = 0; i < n; ++i) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(g.uniform(lo, hi)));
    for (auto& x : t) x = static_cast<std::int32_t>(g.uniform(0, 50000));
    w.add_sequence(std::span<const std::int32_t>(t));
    w.end_document();
  }
  w.finish();
}

// Writes a WebDataset shard of image-text samples: `key.json` (lengths, text tokens, one image of 576
// encoder tokens) beside `key.jpg` (its bytes; decoding them is the trainer's hook, here the default).
void write_images(const std::string& path, int n) {
  data::wds_writer w(path);
  hetmesh::rng g(3);
  for (int i = 0; i < n; ++i) {
    std::vector<std::int32_t> text(static_cast<std::size_t>(g.uniform(16, 64)));
    for (auto& x : text) x = static_cast<std::int32_t>(g.uniform(0, 50000));
    const nlohmann::json meta{
        {"tokens", text.size()}, {"text_tokens", text}, {"items", {{{"ext", "jpg"}, {"tokens", 576}}}}};
    const std::string js = meta.dump();
    std::vector<std::byte> jpg(static_cast<std::size_t>(g.uniform(200, 400)), std::byte{0xd8});
    const auto* b = reinterpret_cast<const std::byte*>(js.data());
    const std::vector<std::pair<std::string, std::vector<std::byte>>> members{{"json", {b, b + js.size()}},
                                                                              {"jpg", std::move(jpg)}};
    w.add(fmt::format("img_{:05}", i), members);
  }
  w.finish();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 6;
  if (!hetmesh::tools::parse_command_line(argc, argv, "example_data_plane",
                                          {{"STEPS", "", "steps to run", &steps, 1, 1000000}},
                                          "usage: example_data_plane [STEPS]"))
    return 2;
  std::string dir = (std::filesystem::temp_directory_path() / "hetmesh-example-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  try {
    write_tokens(dir + "/web", 1, 400, 32, 512);
    write_tokens(dir + "/code", 2, 200, 128, 2048);
    write_images(dir + "/img-000.tar", 200);
    // The mixture as a user writes it: weights per source as piecewise-linear schedules of the step.
    const auto cfg = data::mixture_from_json(nlohmann::json::parse(fmt::format(R"({{
      "seed": 7, "global_batch": 16, "micro_batches": 2,
      "sources": [
        {{"name": "web",  "paths": ["{0}/web"],  "weight": [[0, 0.7], [4, 0.4]]}},
        {{"name": "code", "paths": ["{0}/code"], "weight": [[0, 0.3], [4, 0.3]]}},
        {{"name": "img",  "format": "webdataset", "paths": ["{0}/img-000.tar"], "weight": [[0, 0.0], [4, 0.3]]}}],
      "cost": {{"linear": 4096, "quadratic": 1, "item_linear": 4096}},
      "layout": {{"order": "tp-cp-ep-dp-pp", "tp": 2, "dp": 2}}}})",
                                                                               dir)));
    fmt::print(
        "mixture: {} sources, global batch {}, trainer mesh {} ({} data-parallel indices); trainers 0-3, "
        "data-plane host 4\n",
        cfg.sources.size(), cfg.global_batch, cfg.layout, cfg.layout.dp_size());
    std::vector<std::string> lines(static_cast<std::size_t>(steps));
    data::planner_state after{};
    hetmesh::comm::loopback::run(5, [&](hetmesh::comm::loopback::communicator& world) {
      const auto sl = data::service_layout_of(cfg.layout, world.size());
      if (sl.is_host(world.rank())) {
        data::data_loader dl(cfg, {.workers = 1, .serve_dp = data::served_by(sl, cfg.layout, world.rank())});
        for (int s = 0; s < steps; ++s) {
          auto b = dl.next();
          lines[static_cast<std::size_t>(s)] = fmt::format(
              "step {}: quotas (web, code, img) = {}, dp cost = {}", s, b.plan.quotas, b.plan.rank_cost);
          run::serve_step(world, cfg, b);
        }
        after = dl.state();  // the checkpoint: a few integers per source
        return;
      }
      const std::vector<int> trainer_ranks{0, 1, 2, 3};
      auto trainers = world.subgroup(std::span<const int>(trainer_ranks));
      for (int s = 0; s < steps; ++s) {
        const auto mine = run::receive_step(world, cfg, s);
        std::vector<std::int64_t> tokens;
        std::size_t images = 0;
        for (const auto& mb : mine) {
          tokens.push_back(static_cast<std::int64_t>(mb.tokens.size()));
          images += mb.items.size();
        }
        for (int r = 0; r < 4; ++r) {  // print in rank order, one trainer at a time
          if (r == world.rank())
            fmt::print("  step {} trainer {}: {} micro-batches of {} tokens, {} image(s)\n", s, r,
                       mine.size(), tokens, images);
          hetmesh::comm::barrier(trainers);
        }
      }
    });
    for (const auto& l : lines) fmt::print("{}\n", l);
    // Resume: a fresh data plane restored from the saved state continues the same stream.
    data::save_checkpoint(dir + "/state.json", cfg, after);
    data::data_loader resumed(cfg, {.workers = 0});
    resumed.restore(data::load_checkpoint(dir + "/state.json", cfg));
    data::data_loader straight(cfg, {.workers = 0});
    for (int s = 0; s < steps; ++s) (void)straight.next();
    const bool same = resumed.next().plan == straight.next().plan;
    fmt::print("checkpoint {} bytes; resumed step {} {} the uninterrupted run's\n",
               std::filesystem::file_size(dir + "/state.json"), steps, same ? "equals" : "DIFFERS FROM");
    std::filesystem::remove_all(dir);
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "example_data_plane: {}\n", e.what());
    std::filesystem::remove_all(dir);
    return 1;
  }
}
