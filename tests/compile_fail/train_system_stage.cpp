// SPDX-License-Identifier: Apache-2.0
// train::system runs the user's backbone stage: a stage without backward is refused at compile time with
// model::check_backbone_stage's message for the requirement it misses.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using stage = hetmesh::model::scale_stage<double>;
#else
struct stage {  // forward only
  using is_backbone_stage = void;
  std::vector<double> w{1.0}, g{0.0};
  explicit stage(int) {}
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb) const {
    return mb.size();
  }
  template <class Ctx>
  void forward(const Ctx&, const hetmesh::model::micro_batch_view&, std::span<const double>,
               std::span<double>) {}
  [[nodiscard]] std::vector<std::span<double>> parameters() { return {std::span<double>(w)}; }
  [[nodiscard]] std::vector<std::span<double>> gradients() { return {std::span<double>(g)}; }
};
#endif

int main() { compile_fail::run_step<stage, hetmesh::model::reference_attention>(); }
