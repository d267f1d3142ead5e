// SPDX-License-Identifier: Apache-2.0
// train::system's device path on a GPU (CTest label gpu; the main in gather.cpp exits 77 without a device):
// one rank over NCCL with cuda::device_memory and the staged CPU or the CUDA reference attention kernel, the
// multimodal tiny_stack step behind staging adapters
// (staged_model.hpp), against the same step on one host rank. Runs the CUDA memory policy's kernels
// (memory_kernels.cu), NCCL's collectives on device buffers and every device piece of the runtime that a
// one-rank step reaches (the executor, plan agreement and stats through device buffers, the encoder
// exchange, the landing reshard, offload-capable stores).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <hetmesh/comm/nccl.hpp>
#include <hetmesh/cuda/attention.hpp>
#include <hetmesh/cuda/device_memory.hpp>

#include "cuda/staged_model.hpp"
#include "train/pipeline_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

template <class T, class Kernel>
void one_rank_step(double tol) {
  const auto batch = random_mm_batch(11, 10, 30);
  const seq::cp_thd part{.cp = 1, .pad = true};
  mm_result<T> ref;
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    ref = run_mm_step<T>(c, part, train::family_placement{}, train::pipeline_config<>{}, batch, 12);
  });

  auto world = comm::nccl::communicator::init(comm::nccl::unique_id(), 1, 0, 0);
  world.set_stream(nullptr);  // the legacy stream, shared with the memory policy's default
  using sys_t = train::system<seq::cp_thd, Kernel, comm::nccl::communicator, train::family_placement,
                              pipeline::one_f_one_b, pipeline::encoder_on_first_stage, cuda::device_memory>;
  sys_t sys(part, train::family_placement{}, {}, world);
  sys.memory() = cuda::device_memory(nullptr);
  const auto plan = sys.plan(batch);
  const auto local = sys.local_stages(plan);
  cudatest::staged_stage<tiny_stack<T>, T> lm(tiny_stack<T>(kShape, 12, kBlocks, 1, local));
  cudatest::staged_encoder<model::scale_encoder<T, model::vision_modality>, T> vision(
      model::scale_encoder<T, model::vision_modality>(kShape.width, T(0.9)));
  cudatest::staged_encoder<model::scale_encoder<T, model::audio_modality>, T> audio(
      model::scale_encoder<T, model::audio_modality>(kShape.width, T(1.1)));
  int calls = 0;
  const auto stats =
      sys.run(plan, batch, lm, mm_optimizer<T>{&calls},
              train::bind_encoder(vision, cudatest::staged_input<item_features<T>>{{kShape.width, 0}}),
              train::bind_encoder(audio, cudatest::staged_input<item_features<T>>{{kShape.width, 1}}));
  CHECK(calls == 3);
  CHECK(stats.targets == ref.stats.targets);
  CHECK(stats.tokens == ref.stats.tokens);
  CHECK(stats.encoder_items > 0);
  CHECK(std::abs(stats.loss - ref.stats.loss) <= tol * std::abs(ref.stats.loss));
  // Gradients, downloaded tensor by tensor (the stage's in tensor-id order, then the encoders').
  cuda::device_memory mem;
  auto check_tensor = [&](std::span<T> dev, const std::vector<T>& want, int id) {
    std::vector<T> got(dev.size());
    mem.download(std::span<T>(got), std::span<const T>(dev));
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      num = std::max(num, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
      den = std::max(den, std::abs(static_cast<double>(want[i])));
    }
    INFO("tensor " << id);
    CHECK(num <= tol * den);
  };
  std::size_t i = 0;
  const auto grads = lm.gradients();
  for (const auto& [id, g] : lm.inner.grad) check_tensor(grads[i++], ref.grads.at(id), id);
  check_tensor(vision.gradients()[0], ref.grads.at(-1), -1);
  check_tensor(audio.gradients()[0], ref.grads.at(-2), -2);
}

}  // namespace

TEST_CASE("train::system over NCCL and cuda::device_memory: a one-rank step equals the host step") {
  // The attention kernel: the CPU reference staged through the host, then the CUDA reference kernel.
  one_rank_step<double, cudatest::staged_reference_attention>(1e-10);
  one_rank_step<float, cudatest::staged_reference_attention>(1e-5);
  one_rank_step<double, cuda::device_reference_attention>(1e-10);
  one_rank_step<float, cuda::device_reference_attention>(1e-5);
}
