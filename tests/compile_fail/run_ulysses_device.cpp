// SPDX-License-Identifier: Apache-2.0
// The Ulysses exchange packs heads in host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<float> q(4), out(4);
  hetmesh::run::ulysses_to_heads(c, hetmesh::seq::ulysses_plan{}, hetmesh::run::ulysses_part::query,
                                 std::span<const float>(q), std::span<float>(out));
}
