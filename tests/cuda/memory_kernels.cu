// The kernels of cuda::device_memory, compiled once for the test program (the one .cu file that includes
// <hetmesh/cuda/memory_kernels.cuh>); the tests themselves are plain C++ (memory.cpp).
#include <hetmesh/cuda/memory_kernels.cuh>
