// SPDX-License-Identifier: Apache-2.0
// run::execute_pipeline keeps activations in host vectors: a device communicator is refused at compile time.
#include <hetmesh/run/pipeline_executor.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  hetmesh::run::execute_pipeline(c, hetmesh::pipeline::schedule{}, hetmesh::run::stage_functions<float>{},
                                 hetmesh::run::activation_sizes{});
}
