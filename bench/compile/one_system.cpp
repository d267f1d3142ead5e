// SPDX-License-Identifier: Apache-2.0
// The compile-time benchmark's smallest trainer (bench/compile/run.py): one train::system type, with the
// mllm_train example's model, planning one step, running it and gathering the report. No data plane, no
// JSON, no reports beyond the step's: what a user's training translation unit costs when the data plane, the
// reports and the model's own code live in translation units of their own. The model's code is compiled
// once in the example's model_instances.cpp (mllm_train/model_instances.hpp declares it extern), as a
// user compiles their layers once rather than in every trainer file; what remains here is the library's
// share: the system's members, the step over the model's types and the header parse. Built as an object
// library, so CI compiles it; never run.
#include <span>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/model_instances.hpp"

namespace bench_compile {

using system_t = hetmesh::train::system<hetmesh::seq::hdp<hetmesh::seq::selective_offload>,
                                        hetmesh::model::reference_attention,
                                        hetmesh::comm::loopback::communicator, hetmesh::balance::bytescale,
                                        hetmesh::pipeline::one_f_one_b, hetmesh::pipeline::colocated_encoder>;
using encoder_input = void (*)(const hetmesh::model::encoder_batch_view&, std::span<float>);

/// One step of the example's model under system_t on `world`: plan, run (Adam), gathered report.
hetmesh::train::step_report train_step(hetmesh::comm::loopback::communicator& world,
                                       const hetmesh::model::step_batch& batch, const mllm::config& mc,
                                       encoder_input vision, encoder_input audio) {
  using namespace hetmesh;
  system_t sys(seq::hdp<seq::selective_offload>{.capacity = 192}, balance::bytescale{},
               {2, pipeline::one_f_one_b{}, pipeline::colocated_encoder{}}, world, {},
               {.reproducible = true});
  const auto plan = sys.plan(batch);
  mllm::multimodal_model<float> model(mc, 7, plan.pipeline.num_stages, sys.local_stages(plan));
  train::adam<float> opt{.lr = 1e-3F};
  const auto stats = sys.run(plan, batch, model.llm, opt, train::bind_encoder(model.vision, vision),
                             train::bind_encoder(model.audio, audio));
  return train::gather_report(world, stats);
}

}  // namespace bench_compile
