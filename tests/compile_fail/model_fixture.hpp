// SPDX-License-Identifier: Apache-2.0
// Conforming models of every model/ concept, each member removable by a HETMESH_TEST_OMIT_* macro, for the
// compile-fail tests: a test defines one macro (unless HETMESH_COMPILE_FAIL_CONTROL), includes this file and
// calls the concept's check_* function, which must fail with the message naming the missing requirement.
// A test names the one family it needs (HETMESH_TEST_FIXTURE_STAGES, _KERNEL, _STORE, _MEMORY or _CONTEXT),
// so that it parses only that family's header.
// Each family is guarded on its own (no #pragma once), so that the shared control build of the compile-fail
// tests (tests/support/compile_fail_control.cmake), which defines the macros of several sources in one
// translation unit, gets every family it names.

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#if !defined(HETMESH_TEST_FIXTURE_STAGES) && !defined(HETMESH_TEST_FIXTURE_KERNEL) && \
    !defined(HETMESH_TEST_FIXTURE_STORE) && !defined(HETMESH_TEST_FIXTURE_MEMORY) &&  \
    !defined(HETMESH_TEST_FIXTURE_CONTEXT)
#error \
    "define HETMESH_TEST_FIXTURE_STAGES, _KERNEL, _STORE, _MEMORY or _CONTEXT before including model_fixture.hpp"
#endif

// A control build omits nothing. The shared control build reads the leading lines of many sources before
// their bodies, and a family is defined at its first inclusion, so a source that defined an omission
// under HETMESH_COMPILE_FAIL_CONTROL would go unnoticed there: every inclusion checks it (list every
// HETMESH_TEST_OMIT_* macro of this file here).
#if defined(HETMESH_COMPILE_FAIL_CONTROL) &&                                                              \
    (defined(HETMESH_TEST_OMIT_ATTENTION_BACKWARD) || defined(HETMESH_TEST_OMIT_ATTENTION_FORWARD) ||     \
     defined(HETMESH_TEST_OMIT_BACKBONE_BACKWARD) || defined(HETMESH_TEST_OMIT_BACKBONE_FORWARD) ||       \
     defined(HETMESH_TEST_OMIT_BACKBONE_OUTPUT_SIZE) || defined(HETMESH_TEST_OMIT_BACKBONE_PARAMETERS) || \
     defined(HETMESH_TEST_OMIT_BACKBONE_TAG) || defined(HETMESH_TEST_OMIT_BACKWARD_INPUT) ||              \
     defined(HETMESH_TEST_OMIT_BACKWARD_WEIGHT) || defined(HETMESH_TEST_OMIT_ENCODER_BACKWARD) ||         \
     defined(HETMESH_TEST_OMIT_ENCODER_FORWARD) || defined(HETMESH_TEST_OMIT_ENCODER_INPUT_SIZE) ||       \
     defined(HETMESH_TEST_OMIT_ENCODER_MODALITY) || defined(HETMESH_TEST_OMIT_ENCODER_OUTPUT_SIZE) ||     \
     defined(HETMESH_TEST_OMIT_ENCODER_PARAMETERS) || defined(HETMESH_TEST_OMIT_ENCODER_TAG) ||           \
     defined(HETMESH_TEST_OMIT_STORE_BYTES) || defined(HETMESH_TEST_OMIT_STORE_CONTAINS) ||               \
     defined(HETMESH_TEST_OMIT_STORE_READ) || defined(HETMESH_TEST_OMIT_STORE_RELEASE) ||                 \
     defined(HETMESH_TEST_OMIT_STORE_TAG) || defined(HETMESH_TEST_OMIT_STORE_WRITE) ||                    \
     defined(HETMESH_TEST_OMIT_MEMORY_MERGE) || defined(HETMESH_TEST_OMIT_MEMORY_DELTA) ||                \
     defined(HETMESH_TEST_OMIT_CONTEXT_FORWARD) || defined(HETMESH_TEST_OMIT_CONTEXT_BACKWARD) ||         \
     defined(HETMESH_TEST_OMIT_CONTEXT_SLOTS) || defined(HETMESH_TEST_OMIT_ENCODER_CONTEXT_FORWARD) ||    \
     defined(HETMESH_TEST_OMIT_ENCODER_CONTEXT_BACKWARD) ||                                               \
     defined(HETMESH_TEST_OMIT_ENCODER_CONTEXT_SLOTS))
#error "a control build (HETMESH_COMPILE_FAIL_CONTROL) must not define a HETMESH_TEST_OMIT_* macro"
#endif

#if defined(HETMESH_TEST_FIXTURE_STAGES) && !defined(HETMESH_TEST_FIXTURE_STAGES_DONE)
#define HETMESH_TEST_FIXTURE_STAGES_DONE
#include <hetmesh/model/stage.hpp>

namespace fixture {
using namespace hetmesh::model;

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
#ifndef HETMESH_TEST_OMIT_ENCODER_HEADS
  int attention_heads() const { return 2; }
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

}  // namespace fixture
#endif

#if defined(HETMESH_TEST_FIXTURE_KERNEL) && !defined(HETMESH_TEST_FIXTURE_KERNEL_DONE)
#define HETMESH_TEST_FIXTURE_KERNEL_DONE
#include <hetmesh/model/attention_check.hpp>

namespace fixture {
using namespace hetmesh::model;

struct kernel {
#ifndef HETMESH_TEST_OMIT_ATTENTION_FORWARD
  void forward(const attention_block<float>&, attention_forward_out<float>) {}
#endif
#ifndef HETMESH_TEST_OMIT_ATTENTION_BACKWARD
  void backward(const attention_block<float>&, attention_backward_io<float>) {}
#endif
};

}  // namespace fixture
#endif

#if defined(HETMESH_TEST_FIXTURE_STORE) && !defined(HETMESH_TEST_FIXTURE_STORE_DONE)
#define HETMESH_TEST_FIXTURE_STORE_DONE
#include <hetmesh/model/activation.hpp>

namespace fixture {
using namespace hetmesh::model;

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

}  // namespace fixture
#endif

#if defined(HETMESH_TEST_FIXTURE_MEMORY) && !defined(HETMESH_TEST_FIXTURE_MEMORY_DONE)
#define HETMESH_TEST_FIXTURE_MEMORY_DONE
#include <hetmesh/model/attention_memory.hpp>

namespace fixture {
using namespace hetmesh::model;

/// A host memory policy (operations that do nothing) with the attention operations of attention_memory.
struct memory {
  static constexpr hetmesh::memory_space space = hetmesh::memory_space::host;
  template <class T>
  struct buffer {
    void resize(std::size_t) {}
    std::size_t size() const { return 0; }
    std::span<T> span() { return {}; }
  };
  template <class T>
  void copy(std::span<T>, std::span<const T>) const {}
  template <class T>
  void copy_2d(std::span<T>, std::size_t, std::span<const T>, std::size_t, std::size_t, std::size_t) const {}
  template <class T>
  void fill(std::span<T>, T) const {}
  template <class T>
  void add(std::span<T>, std::span<const T>) const {}
  template <class T>
  void upload(std::span<T>, std::span<const T>) const {}
  template <class T>
  void download(std::span<T>, std::span<const T>) const {}
  void synchronize() const {}
#ifndef HETMESH_TEST_OMIT_MEMORY_MERGE
  void merge_attention(std::span<float>, std::span<float>, std::span<const float>, std::span<const float>,
                       std::size_t) const {}
#endif
#ifndef HETMESH_TEST_OMIT_MEMORY_DELTA
  void attention_delta(std::span<const float>, std::span<const float>, std::span<float>, std::size_t) const {}
#endif
};

}  // namespace fixture
#endif

#if defined(HETMESH_TEST_FIXTURE_CONTEXT) && !defined(HETMESH_TEST_FIXTURE_CONTEXT_DONE)
#define HETMESH_TEST_FIXTURE_CONTEXT_DONE
#include <hetmesh/model/attention_context.hpp>

namespace fixture {
using namespace hetmesh::model;

/// A backbone stage's context with the attention entry (attention_context).
struct context {
#ifndef HETMESH_TEST_OMIT_CONTEXT_FORWARD
  void attention_forward(attention_shape, float, std::span<const float>, std::span<const float>,
                         std::span<const float>, std::span<float>, std::span<float>) const {}
#endif
#ifndef HETMESH_TEST_OMIT_CONTEXT_BACKWARD
  void attention_backward(attention_shape, float, std::span<const float>, std::span<const float>,
                          std::span<const float>, std::span<const float>, std::span<const float>,
                          std::span<const float>, std::span<float>, std::span<float>,
                          std::span<float>) const {}
#endif
#ifndef HETMESH_TEST_OMIT_CONTEXT_SLOTS
  int slots() const { return 0; }
#endif
};

/// An encoder's context with the attention entry inside items (encoder_attention_context).
struct encoder_context {
#ifndef HETMESH_TEST_OMIT_ENCODER_CONTEXT_FORWARD
  void attention_forward(const encoder_batch_view&, attention_shape, float, std::span<const float>,
                         std::span<const float>, std::span<const float>, std::span<float>,
                         std::span<float>) const {}
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_CONTEXT_BACKWARD
  void attention_backward(const encoder_batch_view&, attention_shape, float, std::span<const float>,
                          std::span<const float>, std::span<const float>, std::span<const float>,
                          std::span<const float>, std::span<const float>, std::span<float>, std::span<float>,
                          std::span<float>) const {}
#endif
#ifndef HETMESH_TEST_OMIT_ENCODER_CONTEXT_SLOTS
  int slots() const { return 0; }
#endif
};

}  // namespace fixture
#endif
