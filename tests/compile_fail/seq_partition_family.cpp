// SPDX-License-Identifier: Apache-2.0
// A type that is not a sequence partition family (no role, no ring_attention, no plan_type) is refused
// with a message listing what a family provides.
#include <string_view>

#include <hetmesh/seq/partition.hpp>

struct my_partition {
  static constexpr std::string_view name = "mine";
  int degree = 2;
  friend constexpr bool operator==(const my_partition&, const my_partition&) = default;
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using partition = hetmesh::seq::ulysses;
#else
using partition = my_partition;
#endif

static_assert(hetmesh::seq::check_partition_accepts<partition, true>());

int main() { return 0; }
