// SPDX-License-Identifier: Apache-2.0
// run::grouped_reorder moves parcels through host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/grouped_reorder.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  std::vector<hetmesh::seq::sample_meta> meta;
  std::vector<hetmesh::run::parcel<float>> parcels;
  (void)hetmesh::run::grouped_reorder(c, std::span<const hetmesh::seq::sample_meta>(meta),
                                      std::span<const hetmesh::run::parcel<float>>(parcels));
}
