// SPDX-License-Identifier: Apache-2.0
// train::restore of a train::zero1 over device memory is refused at compile time: its inner optimizer's
// state would live on the device, and checkpoints read and write host memory for now.
#include <span>
#include <vector>

#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/train/checkpoint_state.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using memory = hetmesh::model::host_memory;
#else
using memory = hetmesh::model::emulated_device_memory;
#endif

int main() {
  struct record {
    long id = 0;
    std::span<double> value;
  };
  std::vector<double> w(4, 1.0);
  hetmesh::train::zero1<hetmesh::train::adam<double>, memory> z;
  const std::vector<hetmesh::train::rank_snapshot<double>> none;
  try {
    hetmesh::train::restore(hetmesh::train::memory_source<double>{none}, std::vector<record>{{1, w}}, z);
  } catch (const hetmesh::data_error&) {
    return 0;  // nothing saved: tensor 1 is missing
  }
  return 1;
}
