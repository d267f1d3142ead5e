// SPDX-License-Identifier: Apache-2.0
// run::check_plan_agreement over a device communicator needs the communicator's memory policy (the hashes
// travel through device buffers): without one, the call is refused at compile time, naming the overload to
// use.
#include <hetmesh/run/agreement.hpp>
#include <hetmesh/seq/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  hetmesh::run::check_plan_agreement(c, hetmesh::seq::ulysses_plan{});
}
