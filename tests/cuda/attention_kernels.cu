// The one .cu file of test_cuda that includes attention_kernels.cuh: it defines the launchers of
// cuda::device_reference_attention (cuda::kernels::attention_forward / attention_backward), which the g++
// translation units (attention.cpp) reach through cuda/attention.hpp.
#include <hetmesh/cuda/attention_kernels.cuh>
