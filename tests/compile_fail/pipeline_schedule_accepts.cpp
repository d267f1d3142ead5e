// SPDX-License-Identifier: Apache-2.0
// The same rule as a `requires` clause, as train::system states it: a system over a zero-bubble family
// and a stage without split backward does not satisfy pipeline::schedule_accepts.
#include <hetmesh/pipeline/schedule_family.hpp>

template <class Schedule, bool StageHasSplitBackward>
requires hetmesh::pipeline::schedule_accepts<Schedule, StageHasSplitBackward>
struct toy_system {
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using schedule = hetmesh::pipeline::interleaved_1f1b;
#else
using schedule = hetmesh::pipeline::zero_bubble;
#endif

int main() {
  [[maybe_unused]] toy_system<schedule, false> s;
  return 0;
}
