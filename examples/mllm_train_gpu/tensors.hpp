// SPDX-License-Identifier: Apache-2.0
// The GPU example's storage, over a hetmesh memory policy M (cuda::device_memory on a GPU,
// model::host_memory on the CPU): parameter tensors by global id (uploaded from the CPU example's seeded
// stores, so both examples start from the same model) and a per-call workspace that reuses its buffers
// from call to call (device allocations synchronise the device; a step allocates nothing once warm).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/model/memory_policy.hpp>

#include "mllm_train/layers.hpp"
#include "mllm_train_gpu/math.hpp"

namespace mllm_gpu {

/// Parameter tensors and their gradients in M's memory, by global tensor id (mllm::tensor_store's ids).
template <class T, hetmesh::model::memory_policy M>
class tensor_set {
 public:
  /// Copies of `host`'s parameters (uploaded) with zero gradients. O(parameters).
  tensor_set(const mllm::tensor_store<T>& host, const M& mem, const math<T>& k) {
    for (const auto& [id, values] : host.param) {
      auto& e = by_id_[id];
      e.value.resize(values.size());
      e.grad.resize(values.size());
      mem.upload(e.value.span(), std::span<const T>(values));
      k.fill(e.grad.span().data(), T(0), static_cast<std::int64_t>(values.size()));
    }
  }
  /// Parameter `id` (invalid_argument when this rank does not hold it).
  [[nodiscard]] const T* p(int id) const { return at(id).value.span().data(); }
  /// Gradient `id`.
  [[nodiscard]] T* g(int id) { return at(id).grad.span().data(); }
  /// Every parameter tensor, in id order (train::system's optimizer hook takes these).
  [[nodiscard]] std::vector<std::span<T>> parameters() {
    std::vector<std::span<T>> out;
    for (auto& [id, e] : by_id_) out.push_back(e.value.span());
    return out;
  }
  /// Every gradient tensor, in the same order.
  [[nodiscard]] std::vector<std::span<T>> gradients() {
    std::vector<std::span<T>> out;
    for (auto& [id, e] : by_id_) out.push_back(e.grad.span());
    return out;
  }
  /// (id, value, gradient) of every tensor, in id order; the spans are in M's memory.
  [[nodiscard]] std::vector<mllm::tensor_ref<T>> refs() {
    std::vector<mllm::tensor_ref<T>> out;
    for (auto& [id, e] : by_id_) out.push_back({id, e.value.span(), e.grad.span()});
    return out;
  }

 private:
  struct entry {
    typename M::template buffer<T> value, grad;
  };
  entry& at(int id) {
    const auto it = by_id_.find(id);
    if (it == by_id_.end())
      hetmesh::throw_error<hetmesh::invalid_argument>("mllm_gpu::tensors: no tensor {} on this rank", id);
    return it->second;
  }
  const entry& at(int id) const { return const_cast<tensor_set*>(this)->at(id); }
  std::map<int, entry> by_id_;
};

/// Buffers for one stage call, handed out in order and reused by the next call (reset()): the k-th take of
/// a call gets the k-th buffer, grown when it is too small. Spans stay valid until the next reset().
template <class U, hetmesh::model::memory_policy M>
class workspace {
 public:
  /// Starts a call: every buffer is free again.
  void reset() noexcept { next_ = 0; }
  /// n elements (contents unspecified).
  std::span<U> take(std::size_t n) {
    if (next_ == bufs_.size()) bufs_.emplace_back();
    auto& b = bufs_[next_++];
    b.resize(n);
    return b.span().first(n);
  }
  /// n elements set to zero through `k`.
  template <class T>
  std::span<U> zeros(std::size_t n, const math<T>& k) {
    auto s = take(n);
    k.fill(s.data(), U(0), static_cast<std::int64_t>(n));
    return s;
  }
  /// A copy of the host values `h` in M's memory (complete on return).
  std::span<const U> upload(std::span<const U> h, const M& mem) {
    auto s = take(h.size());
    mem.upload(s, h);
    return s;
  }

 private:
  std::deque<typename M::template buffer<U>> bufs_;
  std::size_t next_ = 0;
};

}  // namespace mllm_gpu
