// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: owning handles for CUDA streams and events (move-only; destroyed on destruction).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "check.hpp"

namespace hetmesh::cuda {

/// A non-blocking stream (does not synchronise with the legacy default stream) on the current device.
class stream {
 public:
  stream() {
    check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", "cuda::stream");
  }
  /// Moves the stream; `o` is left without one.
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  /// Destroys this stream and takes `o`'s; `o` is left without one.
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  /// The native stream, for kernel launches and CUDA calls.
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  /// Blocks until all work on the stream has finished (no timeout; communicators poll instead).
  void synchronize() const { check(cudaStreamSynchronize(s_), "cudaStreamSynchronize", "cuda::stream"); }

 private:
  void reset() noexcept {
    if (s_) cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// An event without timing, for completion queries.
class event {
 public:
  event() {
    check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreateWithFlags", "cuda::event");
  }
  /// No event yet (to be moved into).
  explicit event(std::nullptr_t) noexcept {}
  /// Moves the event; `o` is left without one.
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  /// Destroys this event and takes `o`'s; `o` is left without one.
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  /// The native event.
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  /// Records the event on stream `s`: ready() turns true once the work queued on `s` before it has finished.
  void record(cudaStream_t s) { check(cudaEventRecord(e_, s), "cudaEventRecord", "cuda::event"); }
  /// True when the work before the last record has completed; throws on a device error.
  [[nodiscard]] bool ready() const {
    const cudaError_t st = cudaEventQuery(e_);
    if (st == cudaErrorNotReady) return false;
    check(st, "cudaEventQuery", "cuda::event");
    return true;
  }

 private:
  void reset() noexcept {
    if (e_) cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

}  // namespace hetmesh::cuda
