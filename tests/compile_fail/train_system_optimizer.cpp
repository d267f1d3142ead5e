// SPDX-License-Identifier: Apache-2.0
// train::system calls the optimizer hook with the stage's parameters and gradients: a hook that cannot be
// called so is refused at compile time, saying how it is called.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using optimizer = compile_fail::no_update;
#else
struct optimizer {  // takes a learning rate, not the parameters
  void operator()(double) const {}
};
#endif

int main() {
  compile_fail::run_step<hetmesh::model::scale_stage<double>, hetmesh::model::reference_attention,
                         optimizer>();
}
