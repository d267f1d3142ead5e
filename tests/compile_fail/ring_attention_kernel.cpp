// SPDX-License-Identifier: Apache-2.0
// Ring attention drives a model::attention_kernel: a kernel without backward is refused at compile time
// with a message naming the two calls a kernel needs.
#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ring_attention.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using kernel = hetmesh::model::reference_attention;
#else
struct kernel {  // forward only
  void forward(const hetmesh::model::attention_block<double>&,
               hetmesh::model::attention_forward_out<double>) {}
};
#endif

int main() {
  hetmesh::comm::loopback::run(1, [](hetmesh::comm::loopback::communicator& c) {
    const auto s = hetmesh::seq::make_ring_schedule({0}, {{{0, 0, {0, 2}, 0}}});
    kernel k;
    std::vector<double> q(2), out(2), lse(2);
    const hetmesh::run::ring_attention_input<double> in{{1, 1, 1}, 1.0, q, q, q};
    hetmesh::run::ring_attention_forward(c, s, k, in, std::span<double>(out), std::span<double>(lse));
  });
}
