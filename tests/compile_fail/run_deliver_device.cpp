// SPDX-License-Identifier: Apache-2.0
// run::deliver moves micro-batches in host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/delivery.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  (void)hetmesh::run::deliver(c, hetmesh::data::mixture_config{}, nullptr);
}
