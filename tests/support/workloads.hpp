// SPDX-License-Identifier: Apache-2.0
// Test helper: the vendored workload files (tests/data/workloads, see its README.md). CMake passes the
// folder's absolute path as HETMESH_WORKLOADS_DIR (hetmesh_use_workloads); a missing file is an error
// naming it, never a reason to test something else.
#pragma once

#include <filesystem>
#include <string_view>

#include <hetmesh/core/error.hpp>

#ifndef HETMESH_WORKLOADS_DIR
#error "HETMESH_WORKLOADS_DIR is not defined: call hetmesh_use_workloads(<test target>) in its CMakeLists.txt"
#endif

namespace hetmesh::test {

/// The vendored workload file `name`. Throws data_error naming the path when it is not a regular file
/// (the checkout is incomplete: the file belongs to the repository).
inline std::filesystem::path workload_file(std::string_view name) {
  const std::filesystem::path p = std::filesystem::path(HETMESH_WORKLOADS_DIR) / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec))
    throw_error<data_error>(
        "vendored workload file {} is missing; it belongs to the repository "
        "(tests/data/workloads/README.md)",
        p.string());
  return p;
}

}  // namespace hetmesh::test
