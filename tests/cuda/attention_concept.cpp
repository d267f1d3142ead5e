// Compile-time check in a g++ translation unit: cuda::device_reference_attention, seen through the plain C++
// header alone, models model::attention_kernel for float and double (and not for other elements).
#include <hetmesh/cuda/attention.hpp>
#include <hetmesh/model/attention.hpp>

static_assert(hetmesh::model::attention_kernel<hetmesh::cuda::device_reference_attention, float>);
static_assert(hetmesh::model::attention_kernel<hetmesh::cuda::device_reference_attention, double>);
static_assert(!hetmesh::model::attention_kernel<hetmesh::cuda::device_reference_attention, long double>);
