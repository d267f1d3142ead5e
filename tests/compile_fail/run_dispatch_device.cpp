// SPDX-License-Identifier: Apache-2.0
// run::dispatch_tokens packs token rows in host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/dispatch.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<std::int32_t> src(4), dst(4);
  hetmesh::run::dispatch_tokens(c, hetmesh::balance::dispatch_plan{}, std::span<const std::int32_t>(src),
                                std::span<std::int32_t>(dst), 1);
}
