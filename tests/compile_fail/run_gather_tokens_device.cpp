// SPDX-License-Identifier: Apache-2.0
// run::gather_tokens unpacks token rows from host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/dispatch.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<double> src(4), dst(4);
  hetmesh::run::gather_tokens(c, hetmesh::balance::dispatch_plan{}, std::span<const double>(src),
                              std::span<double>(dst), 1);
}
