// SPDX-License-Identifier: Apache-2.0
// run::reshard stages rows through host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/reshard.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<float> src(4), dst(4);
  hetmesh::run::reshard(c, hetmesh::balance::reshard_plan{}, std::span<const float>(src),
                        std::span<float>(dst), 1);
}
