// SPDX-License-Identifier: Apache-2.0
// run::check_plan_agreement gathers hashes into a host vector: a device communicator is refused at
// compile time.
#include <hetmesh/run/agreement.hpp>
#include <hetmesh/seq/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::test_communicator c;
  hetmesh::run::check_plan_agreement(c, hetmesh::seq::ulysses_plan{});
}
