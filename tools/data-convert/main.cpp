// SPDX-License-Identifier: Apache-2.0
// hetmesh-data-convert: converts JSONL to the data plane's formats and inspects them.
//   hetmesh-data-convert indexed IN.jsonl OUT_PREFIX [--dtype uint16|int32]
//       each line {"tokens": [ids]} or {"text": "..."} (UTF-8 bytes as ids) -> OUT_PREFIX.bin/.idx
//   hetmesh-data-convert webdataset IN.jsonl OUT_PREFIX [--per-shard N]
//       each line {"tokens": N | "text_tokens": [...], "items": [...], "files": {"jpg": path}} -> shards
//   hetmesh-data-convert info PATH      (a dataset prefix or a .tar shard: prints its summary as JSON)
// Arguments go through tools/common/hetmesh_tools/args.hpp: unknown options, missing values, numbers with
// trailing garbage and stray arguments are refused. Bad input (arguments or data) exits 2 with one line on
// stderr, "hetmesh-data-convert: error: ..."; outputs appear only when a conversion succeeds.
#include <iostream>
#include <string>
#include <vector>

#include <hetmesh/core/checked.hpp>
#include <hetmesh/data/convert.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/webdataset.hpp>
#include <hetmesh_tools/args.hpp>
#include <hetmesh_tools/subcommand_main.hpp>

#include "progress.hpp"

namespace {

constexpr const char* usage_text =
    "usage:\n"
    "  hetmesh-data-convert indexed IN.jsonl OUT_PREFIX [--dtype uint16|int32]\n"
    "  hetmesh-data-convert webdataset IN.jsonl OUT_PREFIX [--per-shard N]\n"
    "  hetmesh-data-convert info PREFIX_OR_SHARD\n";

nlohmann::json stats_json(const hetmesh::data::convert_stats& s) {
  return {{"lines", s.lines}, {"samples", s.samples}, {"tokens", s.tokens}, {"outputs", s.outputs}};
}

int run(const std::string& cmd, const std::vector<std::string>& rest) {
  using namespace hetmesh::data;
  namespace tl = hetmesh::tools;
  static constexpr std::string_view in_out[] = {"IN.jsonl", "OUT_PREFIX"};
  static constexpr std::string_view one_path[] = {"PREFIX_OR_SHARD"};
  if (cmd == "info") {
    const auto a = tl::parse_args(rest, {}, one_path);
    const std::string& path = a.positionals()[0];
    nlohmann::json j;
    if (path.size() > 4 && path.substr(path.size() - 4) == ".tar") {
      const auto idx = open_wds_index(path);
      std::int64_t tokens = 0, items = 0;
      for (const auto& e : idx.samples) {
        tokens = hetmesh::checked_add(tokens, e.meta.tokens, "text tokens of the shard");
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
      for (std::int64_t i = 0; i < ds.size(); ++i)
        tokens = hetmesh::checked_add(tokens, ds.length(i), "tokens");
      j = {{"format", "indexed"},    {"dtype", fmt::format("{}", ds.type())},
           {"sequences", ds.size()}, {"documents", ds.documents()},
           {"tokens", tokens},       {"bytes", ds.data_bytes()}};
    }
    std::cout << j.dump(1) << '\n';
    return 0;
  }
  if (cmd == "indexed") {
    static constexpr tl::option_spec opts[] = {{"--dtype", "uint16|int32", "element type of the .bin"}};
    const auto a = tl::parse_args(rest, opts, in_out);
    const dtype type =
        a.choice("--dtype", "int32", {"uint16", "int32"}) == "uint16" ? dtype::uint16 : dtype::int32;
    hetmesh_tool::convert_progress progress(a.positionals()[0], a.positionals()[1]);
    const auto st = convert_jsonl_to_indexed(a.positionals()[0], a.positionals()[1], type);
    progress.finish();
    std::cout << stats_json(st).dump(1) << '\n';
    return 0;
  }
  if (cmd == "webdataset") {
    static constexpr tl::option_spec opts[] = {{"--per-shard", "N", "samples per shard, >= 1"}};
    const auto a = tl::parse_args(rest, opts, in_out);
    const auto per_shard = a.integer("--per-shard", 1000, 1, std::int64_t{1} << 40);
    hetmesh_tool::convert_progress progress(a.positionals()[0], a.positionals()[1]);
    const auto st = convert_jsonl_to_webdataset(a.positionals()[0], a.positionals()[1], per_shard);
    progress.finish();
    std::cout << stats_json(st).dump(1) << '\n';
    return 0;
  }
  hetmesh::throw_error<tl::usage_error>("unknown command '{}'; expected indexed, webdataset or info", cmd);
}

}  // namespace

int main(int argc, char** argv) {
  return hetmesh::tools::subcommand_main(argc, argv, "hetmesh-data-convert", usage_text, run);
}
