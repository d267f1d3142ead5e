// SPDX-License-Identifier: Apache-2.0
// Benchmark support: writing a benchmark's JSON result file.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace hetmesh::bench {

/// Writes `j` (indented by 2, newline-terminated) to `path`, creating its folders, and prints
/// "wrote PATH" on stdout.
inline void write_json(const nlohmann::json& j, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace hetmesh::bench
