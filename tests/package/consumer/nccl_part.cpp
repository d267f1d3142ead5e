// The nccl component: NCCL's host API links and answers without a GPU.
#include <hetmesh/config.hpp>
#include <nccl.h>

static_assert(HETMESH_HAS_NCCL == 1, "hetmesh::nccl defines HETMESH_HAS_NCCL=1");

int consumer_nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return -1;
  return v;
}
