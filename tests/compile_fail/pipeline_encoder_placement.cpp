// SPDX-License-Identifier: Apache-2.0
// add_encoder takes an encoder placement (pipeline::encoder_placement: `encoder_ranks()` and `place(...)`,
// the library's three or a user's); a type without them is refused with a message naming what it needs.
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/joint.hpp>

struct encoder_everywhere {
  int ranks = 8;
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using placement = hetmesh::pipeline::encoder_pool;
#else
using placement = encoder_everywhere;
#endif

int main() {
  const auto llm = hetmesh::pipeline::one_f_one_b{}.generate(2, 2);
  const auto s =
      hetmesh::pipeline::add_encoder(llm, placement{}, hetmesh::pipeline::uniform_costs{}.model(), {});
  return s.num_ranks > 0 ? 0 : 1;
}
