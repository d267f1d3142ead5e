// SPDX-License-Identifier: Apache-2.0
// A type that is not a schedule family (no requires_split_backward, no generate) is refused with a
// message listing what a family provides.
#include <string_view>

#include <hetmesh/pipeline/schedule_family.hpp>

struct my_schedule {
  static constexpr std::string_view name = "mine";
  friend constexpr bool operator==(const my_schedule&, const my_schedule&) = default;
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using schedule = hetmesh::pipeline::gpipe;
#else
using schedule = my_schedule;
#endif

static_assert(hetmesh::pipeline::check_schedule_accepts<schedule, true>());

int main() { return 0; }
