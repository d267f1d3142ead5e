// SPDX-License-Identifier: Apache-2.0
// train::system drives the user's attention kernel through ring attention: a kernel without backward is
// refused at compile time with a message naming the two calls a kernel needs.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using kernel = hetmesh::model::reference_attention;
#else
struct kernel {  // forward only
  void forward(const hetmesh::model::attention_block<double>&,
               hetmesh::model::attention_forward_out<double>) {}
};
#endif

int main() { compile_fail::run_step<hetmesh::model::scale_stage<double>, kernel>(); }
