// SPDX-License-Identifier: Apache-2.0
// train::system with a zero-bubble schedule family (its backward runs as I and W actions) and a backbone
// stage without split backward is refused at compile time, naming what the stage must provide.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using schedule = hetmesh::pipeline::one_f_one_b;  // whole backward: any backbone stage will do
#else
using schedule = hetmesh::pipeline::zero_bubble;  // I and W: needs backward_input and backward_weight
#endif

/// A backbone stage with a whole backward only.
struct whole_stage {
  using is_backbone_stage = void;
  hetmesh::model::scale_stage<double> s;
  explicit whole_stage(int width) : s(width) {}
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb) const {
    return s.output_size(mb);
  }
  template <class Ctx>
  void forward(const Ctx& c, const hetmesh::model::micro_batch_view& mb, std::span<const double> in,
               std::span<double> out) {
    s.forward(c, mb, in, out);
  }
  template <class Ctx>
  void backward(const Ctx& c, const hetmesh::model::micro_batch_view& mb, std::span<const double> gout,
                std::span<double> gin) {
    s.backward(c, mb, gout, gin);
  }
  [[nodiscard]] std::vector<std::span<double>> parameters() { return s.parameters(); }
  [[nodiscard]] std::vector<std::span<double>> gradients() { return s.gradients(); }
};

int main() { compile_fail::run_pipelined_step<whole_stage, schedule>(); }
