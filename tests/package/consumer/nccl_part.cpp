// The nccl component: NCCL's host API links and answers without a GPU.
#include <nccl.h>
#include <hetmesh/config.hpp>

static_assert(HETMESH_HAS_NCCL == 1, "hetmesh::nccl defines HETMESH_HAS_NCCL=1");

int consumer_nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return -1;
  return v;
}
