// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: a host attention kernel behind the emulated device (core/memory_space.hpp): the
// kernel a device path over comm::emulated_device and model::emulated_device_memory takes where a GPU
// run takes a device kernel, so a user's device model and the runtime's device path run on a CPU.
#pragma once

#include <span>

#include "../core/memory_space.hpp"
#include "attention.hpp"
#include "reference_attention.hpp"

namespace hetmesh::model {

/// Host kernel K (a model::attention_kernel over host tensors; model::reference_attention by default)
/// called with emulated device tensors: each tensor of a block (q, k, v, out, lse, dout, delta, dq, dk, dv)
/// is mapped to the host memory behind it (emulated::to_host) and K computes there; the per-token metadata
/// is host memory already (attention_kernel requirement 4). A host tensor where device memory belongs is
/// refused with invalid_argument naming the call. Deterministic when K is; results are bitwise K's.
template <class K = reference_attention>
struct emulated_attention {
  K inner{};  ///< the host kernel

  /// K's forward on the host views of the block's tensors.
  template <class T>
  void forward(const attention_block<T>& b, attention_forward_out<T> o) {
    constexpr const char* who = "model::emulated_attention::forward";
    inner.forward(host_block(b, who),
                  attention_forward_out<T>{emulated::to_host(o.out, who), emulated::to_host(o.lse, who)});
  }
  /// K's backward on the host views of the block's tensors (dq, dk, dv accumulate as K's do).
  template <class T>
  void backward(const attention_block<T>& b, attention_backward_io<T> io) {
    constexpr const char* who = "model::emulated_attention::backward";
    inner.backward(host_block(b, who),
                   attention_backward_io<T>{emulated::to_host(io.dout, who), emulated::to_host(io.lse, who),
                                            emulated::to_host(io.delta, who), emulated::to_host(io.dq, who),
                                            emulated::to_host(io.dk, who), emulated::to_host(io.dv, who)});
  }

 private:
  template <class T>
  static attention_block<T> host_block(const attention_block<T>& b, const char* who) {
    auto h = b;
    h.q = emulated::to_host(b.q, who), h.k = emulated::to_host(b.k, who), h.v = emulated::to_host(b.v, who);
    return h;
  }
};

}  // namespace hetmesh::model
