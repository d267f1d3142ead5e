// SPDX-License-Identifier: Apache-2.0
// A small trainer stand-in for the kill-and-resume test: streams steps of a data plane to a file (one
// line per step: step and a hash of its batch), checkpointing after each, and optionally kills itself
// with SIGKILL right after step `die_at` while its prefetch workers are mid-read. Restarted with the same
// arguments it resumes from the checkpoint. Usage:
//   test_data_stream DIR OUT CKPT STEPS WORKERS [DIE_AT]
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/loader.hpp>

#include "fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: test_data_stream DIR OUT CKPT STEPS WORKERS [DIE_AT]\n";
    return 2;
  }
  const std::string dir = argv[1], out = argv[2], ckpt = argv[3];
  const int steps = std::stoi(argv[4]), workers = std::stoi(argv[5]);
  const int die_at = argc > 6 ? std::stoi(argv[6]) : -1;
  try {
    // The data lives in DIR (not a temporary folder) so that the restarted process finds it.
    if (hetmesh::data::detail::file_size_or_missing(dir + "/web.idx") < 0) {
      test::make_indexed(dir + "/web", 5, 0, 70, 1, 120);
      test::make_indexed(dir + "/code", 5, 1, 40, 30, 300);
    }
    std::vector<std::string> shards;
    for (int sh = 0; sh < 2; ++sh) shards.push_back(fmt::format("{}/img-{:03}.tar", dir, sh));
    if (hetmesh::data::detail::file_size_or_missing(shards[0]) < 0) {
      test::temp_dir tmp;
      const auto made = test::make_wds(tmp, "img", 5, 2, 2, 12, 4, 40);
      for (std::size_t k = 0; k < made.size(); ++k) {
        std::filesystem::copy_file(made[k], shards[k]);
        std::filesystem::remove(wds_index_path(made[k]));  // the index is rebuilt beside the copy
      }
    }
    const mixture_config cfg{
        .seed = 99,
        .global_batch = 10,
        .sources = {{.name = "web", .paths = {dir + "/web"}, .weight = {{0, 0.6}, {40, 0.3}}},
                    {.name = "code", .paths = {dir + "/code"}, .weight = {{0, 0.2}, {40, 0.3}}},
                    {.name = "img",
                     .format = source_format::webdataset,
                     .paths = shards,
                     .weight = {{0, 0.2}, {40, 0.4}}}},
        .cost = {.text = {.a = 1, .b = 1}},
        .layout = mesh::make_mesh(mesh::dp(2)),
    };
    data_loader dl(cfg, {.workers = workers, .prefetch_steps = 3});
    std::int64_t start = 0;
    if (hetmesh::data::detail::file_size_or_missing(ckpt) >= 0) {
      const auto st = load_checkpoint(ckpt, cfg);
      dl.restore(st);
      start = st.step;
      // Keep the lines of the steps the checkpoint covers: a line written after the last checkpoint
      // belongs to a step that will be delivered again.
      std::ifstream in(out);
      std::vector<std::string> lines;
      for (std::string l; static_cast<std::int64_t>(lines.size()) < start && std::getline(in, l);)
        lines.push_back(l);
      std::ofstream rewrite(out, std::ios::trunc);
      for (const auto& l : lines) rewrite << l << '\n';
    }
    std::ofstream o(out, std::ios::app);
    for (std::int64_t step = start; step < steps; ++step) {
      const auto b = dl.next();
      hasher h;
      append(h, b.plan);
      for (const auto& s : b.samples) append_all(h, s.ref, s.tokens);
      for (const auto& s : b.samples)
        for (const auto& it : s.items) append_all(h, it.kind, it.tokens, it.payload.size());
      o << step << ' ' << fmt::format("{:016x}", h.digest()) << '\n';
      o.flush();
      save_checkpoint(ckpt, cfg, dl.state());
      if (step == die_at) std::raise(SIGKILL);
    }
  } catch (const std::exception& e) {
    std::cerr << "test_data_stream: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
