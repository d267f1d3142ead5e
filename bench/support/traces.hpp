// SPDX-License-Identifier: Apache-2.0
// Benchmark support: the request traces in shared/data/workloads that are not plain length lists
// (those are read by hetmesh::balance::read_lengths).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <hetmesh/core/error.hpp>

namespace hetmesh::bench {

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
