// SPDX-License-Identifier: Apache-2.0
// Test helpers of the runtime's device path on CPUs (ulysses.cpp, long_short_attention.cpp): an attention
// kernel that takes emulated device tensors (core/memory_space.hpp), maps them back to host memory and runs
// model::reference_attention, counting what it was given; uploads and downloads through
// model::emulated_device_memory; a bitwise comparison of results.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>

namespace runtest {

/// model::reference_attention behind emulated device pointers: every tensor of a call (q, k, v, out, lse,
/// dout, delta, dq, dk, dv) must be an emulated device pointer (emulated::to_host throws otherwise) and
/// every per-token metadata span (documents, positions) host memory. Counts the tensors and metadata spans
/// it saw on each side, so a test asserts the runtime handed it device memory. One per rank (not
/// thread-safe).
struct emulated_reference_kernel {
  std::int64_t calls = 0;            ///< forward and backward calls
  std::int64_t device_tensors = 0;   ///< non-empty tensors that were emulated device pointers
  std::int64_t host_tensors = 0;     ///< non-empty tensors that were host pointers (expected none)
  std::int64_t device_metadata = 0;  ///< non-empty document/position spans on the device (expected none)

  template <std::floating_point T>
  void forward(const hetmesh::model::attention_block<T>& b, hetmesh::model::attention_forward_out<T> out) {
    const auto hb = host_block(b);
    hetmesh::model::reference_attention{}.forward(
        hb, hetmesh::model::attention_forward_out<T>{tensor(out.out), tensor(out.lse)});
  }

  template <std::floating_point T>
  void backward(const hetmesh::model::attention_block<T>& b, hetmesh::model::attention_backward_io<T> io) {
    const auto hb = host_block(b);
    hetmesh::model::reference_attention{}.backward(
        hb, hetmesh::model::attention_backward_io<T>{tensor(io.dout), tensor(io.lse), tensor(io.delta),
                                                     tensor(io.dq), tensor(io.dk), tensor(io.dv)});
  }

 private:
  template <class T>
  std::span<T> tensor(std::span<T> s) {
    if (!s.empty()) ++(hetmesh::emulated::is_device_pointer(s.data()) ? device_tensors : host_tensors);
    return hetmesh::emulated::to_host(s, "emulated_reference_kernel");
  }
  void metadata(std::span<const std::int64_t> s) {
    if (!s.empty() && hetmesh::emulated::is_device_pointer(s.data())) ++device_metadata;
  }
  template <class T>
  hetmesh::model::attention_block<T> host_block(const hetmesh::model::attention_block<T>& b) {
    ++calls;
    metadata(b.q_doc), metadata(b.q_pos), metadata(b.k_doc), metadata(b.k_pos);
    auto hb = b;
    hb.q = tensor(b.q), hb.k = tensor(b.k), hb.v = tensor(b.v);
    return hb;
  }
};

/// A buffer of emulated device memory holding `host` (uploaded).
template <class T>
hetmesh::model::emulated_device_memory::buffer<T> upload(hetmesh::model::emulated_device_memory& mem,
                                                         const std::vector<T>& host) {
  hetmesh::model::emulated_device_memory::buffer<T> b;
  b.resize(host.size());
  mem.upload(b.span(), std::span<const T>(host));
  return b;
}

/// The contents of emulated device span `s`, downloaded.
template <class T>
std::vector<T> download(hetmesh::model::emulated_device_memory& mem, std::span<const T> s) {
  std::vector<T> out(s.size());
  mem.download(std::span<T>(out), s);
  return out;
}

/// Whether a and b hold the same elements bit for bit (-0.0 differs from 0.0, NaNs compare by payload).
template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace runtest
