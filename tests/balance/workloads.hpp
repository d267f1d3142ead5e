// SPDX-License-Identifier: Apache-2.0
// Test helper: finds the shared workloads folder (../shared/data/workloads from the project root, or
// shared/data/workloads inside it) from this file's own path, so tests need no configured macro.
#pragma once

#include <filesystem>
#include <optional>

namespace hetmesh::test {

inline std::optional<std::filesystem::path> workloads_dir() {
  const std::filesystem::path here = std::filesystem::path(__FILE__).parent_path();  // <root>/tests/balance
  const std::filesystem::path root = here.parent_path().parent_path();
  for (const auto& p :
       {root / "shared" / "data" / "workloads", root.parent_path() / "shared" / "data" / "workloads"}) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) return p;
  }
  return std::nullopt;
}

}  // namespace hetmesh::test
