// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the memory policy concept: where the runtime's buffers live and the memory operations it
// runs on them (models in model/host_memory.hpp and cuda/device_memory.hpp). Memory only: the attention
// arithmetic some runtime pieces also run through a policy is model::attention_memory
// (model/attention_memory.hpp). A header of its own, free of fmt, so that nvcc translation units check
// cuda::device_memory against it.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../core/memory_space.hpp"

namespace hetmesh::model {

/// A memory policy M. Requirements (for T = float and double, the activations' element types):
///  1. `M::space` is the memory_space of its buffers (equal to the communicator's `memory`);
///  2. `typename M::template buffer<T>`: an owning buffer, default-constructible and movable, with
///     `b.resize(n)` (n elements; earlier contents are unspecified after a resize that grows),
///     `b.size()` and `b.span()` -> std::span<T> (pointers of M::space; valid until the next resize);
///  3. `m.copy(dst, src)`: dst = src (spans of M::space, equal sizes); `m.copy_2d(dst, dst_pitch, src,
///     src_pitch, width, height)`: for r < height and c < width, dst[r * dst_pitch + c] = src[r * src_pitch
///     + c] (a strided copy, as cudaMemcpy2D; pitches and width in elements; packing heads for Ulysses);
///  4. `m.fill(dst, value)`: every element of dst = value;
///  5. `m.add(dst, src)`: dst += src element by element (equal sizes; also for std::int64_t, the step's
///     counts);
///  6. `m.upload(dst, host_src)` and `m.download(host_dst, src)`: copies between host memory and M::space,
///     complete when they return (the host span may be reused at once);
///  7. `m.synchronize()`: returns when every operation issued through `m` so far has completed.
/// Operations 3-7 are const (a policy is a handle: a stream, or nothing). Operations 3-5 may be
/// asynchronous (ordered on the policy's stream), so a device policy and a device communicator must share
/// one stream (or the caller orders them). Sizes that differ are a precondition violation
/// (invalid_argument from the models here).
/// Optional members the runtime uses when present (and does without otherwise):
///  - `typename M::template host_buffer<T>`: host buffers the device copies to and from directly (pinned
///    memory), the host side of activation offload (model::host_buffer_t; a std::vector otherwise);
///  - a constructor `M(stream)` from the communicator's `stream()`: train::system starts such a policy
///    on the world communicator's stream (default-constructed otherwise).
/// Ring, Ulysses and long-short attention also merge attention partials through the policy: they need
/// the refinement model::attention_memory<M, T>.
template <class M>
concept memory_policy = std::same_as<std::remove_cvref_t<decltype(M::space)>, memory_space> &&
    std::default_initializable<typename M::template buffer<float>> &&
    std::movable<typename M::template buffer<double>> &&
    requires(const M& m, typename M::template buffer<float>& bf, typename M::template buffer<double>& bd,
             std::span<float> f, std::span<const float> cf, std::span<double> d, std::span<const double> cd,
             std::span<std::int64_t> i, std::span<const std::int64_t> ci, std::size_t n) {
  bf.resize(n);
  { bf.size() } -> std::convertible_to<std::size_t>;
  { bf.span() } -> std::same_as<std::span<float>>;
  { bd.span() } -> std::same_as<std::span<double>>;
  m.copy(f, cf);
  m.copy(d, cd);
  m.fill(f, 0.0f);
  m.fill(d, 0.0);
  m.add(f, cf);
  m.add(d, cd);
  m.upload(f, cf);
  m.download(d, cd);
  m.copy_2d(f, n, cf, n, n, n);
  m.copy_2d(d, n, cd, n, n, n);
  m.synchronize();
};

}  // namespace hetmesh::model
