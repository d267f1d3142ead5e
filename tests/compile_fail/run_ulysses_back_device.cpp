// SPDX-License-Identifier: Apache-2.0
// The inverse Ulysses exchange unpacks heads from host vectors: a device communicator is refused at
// compile time.
#include <hetmesh/run/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<float> heads(4), seq(4);
  hetmesh::run::ulysses_to_sequence(c, hetmesh::seq::ulysses_plan{}, hetmesh::run::ulysses_part::key_value,
                                    std::span<const float>(heads), std::span<float>(seq),
                                    hetmesh::run::ulysses_combine::sum);
}
