// SPDX-License-Identifier: Apache-2.0
// comm::all_gather_vectors returns host vectors: a device communicator is refused at compile time.
#include <hetmesh/comm/collectives.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<float> mine(4);
  (void)hetmesh::comm::all_gather_vectors(c, std::span<const float>(mine));
}
