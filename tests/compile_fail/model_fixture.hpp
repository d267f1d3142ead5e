// SPDX-License-Identifier: Apache-2.0
// Conforming models of every model/ concept, each member removable by a HETMESH_TEST_OMIT_* macro, for the
// compile-fail tests: a test defines one macro (unless HETMESH_COMPILE_FAIL_CONTROL), includes this file and
// calls the concept's check_* function, which must fail with the message naming the missing requirement.
// A test names the one family it needs (HETMESH_TEST_FIXTURE_STAGES, _KERNEL or _STORE), so that it parses
// only that family's header.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#if defined(HETMESH_TEST_FIXTURE_STAGES)
#include <hetmesh/model/stage.hpp>
#elif defined(HETMESH_TEST_FIXTURE_KERNEL)
#include <hetmesh/model/attention_check.hpp>
#elif defined(HETMESH_TEST_FIXTURE_STORE)
#include <hetmesh/model/activation.hpp>
#else
#error "define HETMESH_TEST_FIXTURE_STAGES, _KERNEL or _STORE before including model_fixture.hpp"
#endif

namespace fixture {
using namespace hetmesh::model;

#if defined(HETMESH_TEST_FIXTURE_STAGES)
struct encoder {
#ifndef HETMESH_TEST_OMIT_ENCODER_TAG
  using is_encoder_stage = void;
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_MODALITY
  static constexpr std::string_view modality = "vision";
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_INPUT_SIZE
  std::int64_t input_size(const encoder_batch_view& v) const { return v.size(); }
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_OUTPUT_SIZE
  std::int64_t output_size(const encoder_batch_view& v) const { return v.size(); }
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_FORWARD
  template <class Ctx>
  void forward(Ctx&, const encoder_batch_view&, std::span<const float>, std::span<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_BACKWARD
  template <class Ctx>
  void backward(Ctx&, const encoder_batch_view&, std::span<const float>, std::span<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_PARAMETERS
  std::array<std::span<float>, 1> parameters() { return {}; }
  std::array<std::span<float>, 1> gradients() { return {}; }
#endif
};

struct backbone {
#ifndef HETMESH_TEST_OMIT_BACKBONE_TAG
  using is_backbone_stage = void;
#endif
#ifndef HETMESH_TEST_OMIT_BACKBONE_OUTPUT_SIZE
  std::int64_t output_size(const micro_batch_view& v) const { return v.size(); }
#endif
#ifndef HETMESH_TEST_OMIT_BACKBONE_FORWARD
  template <class Ctx>
  void forward(Ctx&, const micro_batch_view&, std::span<const float>, std::span<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_BACKBONE_BACKWARD
  template <class Ctx>
  void backward(Ctx&, const micro_batch_view&, std::span<const float>, std::span<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_BACKWARD_INPUT
  template <class Ctx>
  void backward_input(Ctx&, const micro_batch_view&, std::span<const float>, std::span<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_BACKWARD_WEIGHT
  template <class Ctx>
  void backward_weight(Ctx&, const micro_batch_view&) {}
#endif
#ifndef HETMESH_TEST_OMIT_BACKBONE_PARAMETERS
  std::array<std::span<float>, 1> parameters() { return {}; }
  std::array<std::span<float>, 1> gradients() { return {}; }
#endif
};

#endif

#if defined(HETMESH_TEST_FIXTURE_KERNEL)
struct kernel {
#ifndef HETMESH_TEST_OMIT_ATTENTION_FORWARD
  void forward(const attention_block<float>&, attention_forward_out<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_ATTENTION_BACKWARD
  void backward(const attention_block<float>&, attention_backward_io<float>) {}
#endif
};

#endif

#if defined(HETMESH_TEST_FIXTURE_STORE)
struct store {
#ifndef HETMESH_TEST_OMIT_STORE_TAG
  using is_activation_store = void;
#endif
#ifndef HETMESH_TEST_OMIT_STORE_WRITE
  void write(activation_key, std::span<const float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_STORE_READ
  std::span<const float> read(activation_key) const { return {}; }
#endif
#ifndef HETMESH_TEST_OMIT_STORE_RELEASE
  void release(activation_key) {}
#endif
#ifndef HETMESH_TEST_OMIT_STORE_CONTAINS
  bool contains(activation_key) const { return false; }
#endif
#ifndef HETMESH_TEST_OMIT_STORE_BYTES
  std::int64_t bytes() const { return 0; }
#endif
};

#endif

}  // namespace fixture
