// SPDX-License-Identifier: Apache-2.0
// example_mllm_train_gpu on the host: the GPU stages' kernel bodies as loops over host memory, loopback
// ranks (trainer.hpp); and the CPU example's model under the same systems, the reference of
// --check-reference.
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>

#include "mllm_train_gpu/trainer.hpp"

namespace gpu_example {

void run_host(const options& o, const mllm::config& mc, const mllm::data_config& dc,
              std::vector<step_record>& records, step0* first) {
  const mllm_gpu::math<float> k(mllm_gpu::backend::host);
  with_policies(o, mc, dc, [&](auto partition, auto balancer) {
    comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
      train_rank(c, o, mc, dc, partition, balancer, model::host_memory{}, k, model::reference_attention{},
                 records, first);
    });
  });
}

/// Step 0 of the CPU example's model under the same system configuration on loopback host ranks.
void reference_step0(const options& o, const mllm::config& mc, const mllm::data_config& dc, step0& out) {
  with_policies(o, mc, dc, [&](auto partition, auto balancer) {
    comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
      auto sys = make_system<decltype(partition), decltype(balancer), model::reference_attention,
                             comm::loopback::communicator, model::host_memory>(c, o, mc, partition, balancer,
                                                                               model::reference_attention{});
      mllm::step_source src(o.data_dir, dc);
      const auto batch = src.next();
      const auto plan = sys.plan(batch);
      mllm::multimodal_model<float> m(mc, model_seed, plan.pipeline.num_stages, sys.local_stages(plan));
      train::adam<float> opt{.lr = static_cast<float>(o.lr)};
      const auto stats =
          sys.run(plan, batch, m.llm, opt, train::bind_encoder(m.vision, src.input(mllm::vision_index)),
                  train::bind_encoder(m.audio, src.input(mllm::audio_index)));
      out.add(m.tensors(), model::host_memory{}, stats.loss);
    });
  });
}

}  // namespace gpu_example
