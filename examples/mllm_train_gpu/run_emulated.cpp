// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu on the emulated device: the GPU stages over comm::emulated_device and
// model::emulated_device_memory on loopback ranks, math's emulated backend checking that every kernel
// pointer is device memory (trainer.hpp).
#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/emulated_attention.hpp>
#include <hetmesh/model/host_memory.hpp>

#include "mllm_train_gpu/trainer.hpp"

namespace gpu_example {

void run_emulated(const options& o, const mllm::config& mc, const mllm::data_config& dc,
                  std::vector<step_record>& records, step0* first) {
  const mllm_gpu::math<float> k(mllm_gpu::backend::emulated);
  with_policies(o, mc, dc, [&](auto partition, auto balancer) {
    comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
      comm::emulated_device<comm::loopback::communicator> dev(comm::split(c, 0, c.rank()));
      train_rank(dev, o, mc, dc, partition, balancer, model::emulated_device_memory{}, k,
                 model::emulated_attention<>{}, records, first);
    });
  });
}

}  // namespace gpu_example
