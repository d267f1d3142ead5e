// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu on GPUs: one thread per GPU, each an NCCL rank with its own stream, which the
// communicator, cuda::device_memory, cuda::device_reference_attention and math's cuBLAS handle share
// (trainer.hpp).
#include <cuda_runtime.h>

#include <exception>
#include <stdexcept>
#include <thread>

#include <hetmesh/comm/nccl.hpp>
#include <hetmesh/cuda/attention.hpp>
#include <hetmesh/cuda/device_memory.hpp>

#include "mllm_train_gpu/trainer.hpp"

namespace gpu_example {

void run_cuda(const options& o, const mllm::config& mc, const mllm::data_config& dc,
              std::vector<step_record>& records, step0* first) {
  const ncclUniqueId id = comm::nccl::unique_id();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
          throw std::runtime_error("cudaStreamCreate failed");
        {
          auto c = comm::nccl::communicator::init(id, o.ranks, r, r);
          c.set_stream(stream);
          const mllm_gpu::math<float> k(mllm_gpu::backend::cuda, stream);
          with_policies(o, mc, dc, [&](auto partition, auto balancer) {
            train_rank(c, o, mc, dc, partition, balancer, cuda::device_memory(stream), k,
                       cuda::device_reference_attention(stream), records, first);
          });
        }
        cudaStreamDestroy(stream);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace gpu_example
