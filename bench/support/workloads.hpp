// SPDX-License-Identifier: Apache-2.0
// Benchmark support: where the workload files are, and the request traces that are not plain length
// lists (those are read by hetmesh::balance::read_lengths). The default folder is the vendored one,
// tests/data/workloads, whose absolute path CMake passes as HETMESH_WORKLOADS_DIR
// (hetmesh_use_workloads); `--workloads DIR` overrides it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/core/error.hpp>

#if !defined(HETMESH_WORKLOADS_DIR) || !defined(HETMESH_SOURCE_DIR)
#error \
    "HETMESH_WORKLOADS_DIR is not defined: call hetmesh_use_workloads(<benchmark target>) in its CMakeLists.txt"
#endif

namespace hetmesh::bench {

/// The workloads folder: `given` (from --workloads) when not empty, else the vendored folder.
/// Throws invalid_argument when it is not a directory, data_error when it lacks one of `needed`.
inline std::filesystem::path workloads_dir(std::string_view given,
                                           std::initializer_list<std::string_view> needed) {
  const std::filesystem::path dir =
      given.empty() ? std::filesystem::path(HETMESH_WORKLOADS_DIR) : std::filesystem::path(given);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw_error<invalid_argument>("workloads folder {} is not a directory{}", dir.string(),
                                  given.empty() ? " (the vendored tests/data/workloads)" : " (--workloads)");
  for (auto name : needed)
    if (!std::filesystem::is_regular_file(dir / name, ec))
      throw_error<data_error>("workloads folder {} has no {}", dir.string(), name);
  return dir;
}

/// `p` as a path relative to the project root (what the JSON results record, so they name no
/// machine's absolute paths).
inline std::string project_relative(const std::filesystem::path& p) {
  return std::filesystem::weakly_canonical(p)
      .lexically_relative(std::filesystem::weakly_canonical(HETMESH_SOURCE_DIR))
      .generic_string();
}

/// Azure LLM inference traces (azure_2023_{conv,code}.csv: a header, then context_tokens,
/// generated_tokens per request): a request's LLM length is context_tokens + generated_tokens.
/// Lines with fewer than two fields are skipped. Throws data_error when the file cannot be opened.
inline std::vector<std::int64_t> read_azure_csv(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw_error<data_error>("cannot open {}", file.string());
  std::string line;
  std::getline(in, line);  // header
  std::vector<std::int64_t> out;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string a, b;
    if (!std::getline(ss, a, ',') || !std::getline(ss, b, ',')) continue;
    out.push_back(std::stoll(a) + std::stoll(b));
  }
  return out;
}

}  // namespace hetmesh::bench
