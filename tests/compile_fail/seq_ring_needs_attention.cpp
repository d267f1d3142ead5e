// SPDX-License-Identifier: Apache-2.0
// A ring partition (HDP with selective offload) over a model without an attention kernel is refused:
// the library drives the user's kernel across the ring.
#include <hetmesh/seq/partition.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using partition = hetmesh::seq::ulysses;  // attention is local after the all-to-all
#else
using partition = hetmesh::seq::hdp<hetmesh::seq::selective_offload>;
#endif

constexpr bool model_has_attention_kernel = false;
static_assert(hetmesh::seq::check_partition_accepts<partition, model_has_attention_kernel>());

int main() { return 0; }
