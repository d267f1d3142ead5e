// SPDX-License-Identifier: Apache-2.0
// train::capture saves the optimizer's state: an optimizer that is neither one of the library's nor has
// checkpoint hooks is refused at compile time, saying which hooks to add.
#include <span>
#include <vector>

#include <hetmesh/train/checkpoint_state.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using optimizer = hetmesh::train::adam<double>;
#else
struct optimizer {  // keeps state, but says nothing of how to save it
  std::vector<double> velocity;
};
#endif

int main() {
  struct record {
    long id = 0;
    std::span<double> value;
  };
  std::vector<double> w(4, 1.0);
  const optimizer o{};
  return static_cast<int>(hetmesh::train::capture(std::vector<record>{{1, w}}, o).pieces.size()) - 3;
}
