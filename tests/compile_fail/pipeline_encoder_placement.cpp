// SPDX-License-Identifier: Apache-2.0
// add_encoder takes an encoder placement family (joint pipeline, first stage, separate pool); any
// other type is refused with a message naming the three.
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
