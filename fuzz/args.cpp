// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the tools' argument parser (tools/common/hetmesh_tools/args.hpp). The input is a command line,
// its arguments separated by NUL bytes; it must parse or throw usage_error, and the typed getters must return
// values inside their ranges or throw usage_error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../tools/common/hetmesh_tools/args.hpp"
#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hetmesh::tools;
  static constexpr option_spec opts[] = {{"--per-shard", "N", "samples per shard"},
                                         {"--dtype", "uint16|int32", "element type"},
                                         {"--verbose", "", "a switch"},
                                         {"--traffic", "DIM=BYTES", "repeatable", true}};
  static constexpr std::string_view names[] = {"IN", "OUT"};
  const std::vector<std::string> args = hetmesh::fuzz::nul_separated(data, size);
  try {
    const auto a = parse_args(args, opts, names, 1);
    if (a.positionals().empty() || a.positionals().size() > 2) __builtin_trap();
    const auto n = a.integer("--per-shard", 5, 1, 1000);
    if (n < 1 || n > 1000) __builtin_trap();
    const auto t = a.choice("--dtype", "int32", {"uint16", "int32"});
    if (t != "uint16" && t != "int32") __builtin_trap();
    (void)a.all("--traffic");
  } catch (const usage_error&) {
  }
  return 0;
}
