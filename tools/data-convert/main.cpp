// SPDX-License-Identifier: Apache-2.0
// hetmesh-data-convert: converts JSONL to the data plane's formats and inspects them.
//   hetmesh-data-convert indexed IN.jsonl OUT_PREFIX [--dtype uint16|int32]
//       each line {"tokens": [ids]} or {"text": "..."} (UTF-8 bytes as ids) -> OUT_PREFIX.bin/.idx
//   hetmesh-data-convert webdataset IN.jsonl OUT_PREFIX [--per-shard N]
//       each line {"tokens": N | "text_tokens": [...], "items": [...], "files": {"jpg": path}} -> shards
//   hetmesh-data-convert info PATH      (a dataset prefix or a .tar shard: prints its summary as JSON)
#include <cstring>
#include <iostream>
#include <string>

#include <hetmesh/data/convert.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/webdataset.hpp>

#include "progress.hpp"

namespace {

int usage() {
  std::cerr << "usage:\n"
               "  hetmesh-data-convert indexed IN.jsonl OUT_PREFIX [--dtype uint16|int32]\n"
               "  hetmesh-data-convert webdataset IN.jsonl OUT_PREFIX [--per-shard N]\n"
               "  hetmesh-data-convert info PREFIX_OR_SHARD\n";
  return 2;
}

nlohmann::json stats_json(const hetmesh::data::convert_stats& s) {
  return {{"lines", s.lines}, {"samples", s.samples}, {"tokens", s.tokens}, {"outputs", s.outputs}};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace hetmesh::data;
  if (argc < 3) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd == "info") {
      const std::string path = argv[2];
      nlohmann::json j;
      if (path.size() > 4 && path.substr(path.size() - 4) == ".tar") {
        const auto idx = open_wds_index(path);
        std::int64_t tokens = 0, items = 0;
        for (const auto& e : idx.samples) {
          tokens += e.meta.tokens;
          items += static_cast<std::int64_t>(e.meta.item_tokens.size());
        }
        j = {{"format", "webdataset"},
             {"samples", idx.samples.size()},
             {"text_tokens", tokens},
             {"items", items},
             {"bytes", idx.shard_bytes}};
      } else {
        const indexed_dataset ds(path);
        std::int64_t tokens = 0;
        for (std::int64_t i = 0; i < ds.size(); ++i) tokens += ds.length(i);
        j = {{"format", "indexed"},    {"dtype", fmt::format("{}", ds.type())},
             {"sequences", ds.size()}, {"documents", ds.documents()},
             {"tokens", tokens},       {"bytes", ds.data_bytes()}};
      }
      std::cout << j.dump(1) << '\n';
      return 0;
    }
    if (argc < 4) return usage();
    const std::string in = argv[2], out = argv[3];
    if (cmd == "indexed") {
      dtype type = dtype::int32;
      for (int i = 4; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--dtype") != 0) return usage();
        const std::string v = argv[i + 1];
        if (v == "uint16")
          type = dtype::uint16;
        else if (v == "int32")
          type = dtype::int32;
        else
          return usage();
      }
      hetmesh_tool::convert_progress progress(in, out);
      const auto st = convert_jsonl_to_indexed(in, out, type);
      progress.finish();
      std::cout << stats_json(st).dump(1) << '\n';
      return 0;
    }
    if (cmd == "webdataset") {
      std::int64_t per_shard = 1000;
      for (int i = 4; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--per-shard") != 0) return usage();
        per_shard = std::stoll(argv[i + 1]);
      }
      hetmesh_tool::convert_progress progress(in, out);
      const auto st = convert_jsonl_to_webdataset(in, out, per_shard);
      progress.finish();
      std::cout << stats_json(st).dump(1) << '\n';
      return 0;
    }
    return usage();
  } catch (const std::exception& e) {
    std::cerr << "hetmesh-data-convert: " << e.what() << '\n';
    return 1;
  }
}
