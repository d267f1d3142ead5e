// SPDX-License-Identifier: Apache-2.0
// run::receive_step receives micro-batches into host vectors: a device communicator is refused at
// compile time.
#include <hetmesh/run/data_service.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  (void)hetmesh::run::receive_step(c, hetmesh::data::mixture_config{}, 0);
}
