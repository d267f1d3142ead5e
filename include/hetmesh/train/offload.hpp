// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: selective activation offloading (ByteScale) as an activation store. The plan gives each
// HDP micro-batch an offload ratio r (seq::hdp_micro_batch::offload_ratio: the share of its activations
// that must leave device memory so its ring fits); the store keeps the first (1 - r) of every tensor a
// stage saves in the resident store (device memory on a GPU) and moves the rest to the offload store
// (host memory; pinned host memory on a GPU), and brings it back when the backward reads the tensor. The
// two stores are template parameters, so a user can put their own behind either side (any
// model::activation_store); on CPU both are host stores and the offload is a copy, which the stats
// count. The resident side may live in device memory (a model::memory_activation_store<T, M> of a device
// memory policy M): the offloaded part is then downloaded to the (host) offload store and uploaded back
// into a device buffer when read, through M. Resident bytes are what the plan's memory model budgets: their
// peak is the step's activation footprint.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/memory_space.hpp"
#include "../model/activation.hpp"
#include "../model/host_memory.hpp"

namespace hetmesh::train {

namespace detail {
template <class S>
struct store_memory {
  using type = model::host_memory;
};
template <class S>
requires requires { typename S::memory_type; }
struct store_memory<S> {
  using type = typename S::memory_type;
};
}  // namespace detail

/// An activation store that offloads a per-micro-batch share of each saved tensor. Resident and Offload
/// are model::activation_store types of element T; Offload holds host memory (by default in the host
/// buffers of Resident's policy, model::host_buffer_t: pinned memory for cuda::device_memory), Resident the
/// memory of its `memory_type` (host memory when it names none). Not thread-safe (one per rank, like the
/// stages).
template <class T, class Resident = model::host_activation_store<T>,
          class Offload = model::memory_activation_store<
              T, model::host_side_memory<typename detail::store_memory<Resident>::type>>>
class offload_store {
  static_assert(model::activation_store<Resident, T> && model::activation_store<Offload, T>,
                "train::offload_store: both sides must model model::activation_store<S, T>");

 public:
  /// Where resident tensors (and what read() hands out) live.
  using memory_type = typename detail::store_memory<Resident>::type;

  /// A store over default-constructed sides.
  offload_store() = default;
  /// A store whose resident side is `resident` (e.g. a device store on the stream of the step).
  explicit offload_store(Resident resident) : resident_(std::move(resident)) {}

  using is_activation_store = void;  ///< opt-in for model::activation_store
  using value_type = T;              ///< element type of the tensors

  /// The share of every tensor that (stage, micro_batch) saves from now on that goes to the offload
  /// store: 0 <= ratio <= 1 (invalid_argument otherwise). Unset pairs offload nothing.
  void set_ratio(int stage, int micro_batch, double ratio) {
    if (!(ratio >= 0.0 && ratio <= 1.0))
      throw_error<invalid_argument>(
          "offload_store: ratio {} for stage {} micro-batch {}; expected a share in [0, 1]", ratio, stage,
          micro_batch);
    ratios_[{stage, micro_batch}] = ratio;
  }

  /// Saves `data`: the first n - floor(r n) elements stay resident, the rest are offloaded. Errors: a
  /// key written twice (activation_error, from the resident store).
  void write(model::activation_key k, std::span<const T> data) {
    const auto it = ratios_.find({k.stage, k.micro_batch});
    const double r = it == ratios_.end() ? 0.0 : it->second;
    const auto n = data.size();
    const auto moved = static_cast<std::size_t>(std::floor(r * static_cast<double>(n)));
    resident_.write(k, data.first(n - moved));
    if (moved > 0) {
      if constexpr (memory_type::space == memory_space::host) {
        offload_.write(k, data.last(moved));
      } else {  // the tail leaves device memory
        staging_.resize(moved);
        memory().download(staging_.span(), data.last(moved));
        offload_.write(k, std::as_const(staging_).span());
      }
      offloaded_bytes_ += static_cast<std::int64_t>(moved * sizeof(T));
    }
    peak_ = std::max(peak_, resident_.bytes());
  }

  /// The tensor, whole: the resident part, then the offloaded part brought back (into a buffer the
  /// store owns until release). Errors: an unknown key (activation_error).
  [[nodiscard]] std::span<const T> read(model::activation_key k) const {
    const std::span<const T> head = resident_.read(k);
    if (!offload_.contains(k)) return head;
    auto& buf = fetched_[k];
    if (buf.size() == 0) {
      const std::span<const T> tail = offload_.read(k);
      buf.resize(head.size() + tail.size());
      const auto& mem = memory();
      mem.copy(buf.span().first(head.size()), head);
      mem.upload(buf.span().last(tail.size()), tail);
      fetched_bytes_ += static_cast<std::int64_t>(tail.size() * sizeof(T));
    }
    return std::as_const(buf).span();
  }

  /// Frees the tensor on both sides. Errors: an unknown key (activation_error).
  void release(model::activation_key k) {
    resident_.release(k);
    if (offload_.contains(k)) offload_.release(k);
    fetched_.erase(k);
  }

  /// Frees every tensor of (stage, micro_batch); returns how many there were (resident keys).
  int release_all(int stage, int micro_batch) {
    std::vector<model::activation_key> keys;
    for (const auto& [k, v] : fetched_)
      if (k.stage == stage && k.micro_batch == micro_batch) keys.push_back(k);
    for (const auto& k : keys) fetched_.erase(k);
    if constexpr (requires { offload_.release_all(stage, micro_batch); })
      offload_.release_all(stage, micro_batch);
    if constexpr (requires { resident_.release_all(stage, micro_batch); })
      return resident_.release_all(stage, micro_batch);
    else
      return 0;
  }

  /// Whether the tensor is held.
  [[nodiscard]] bool contains(model::activation_key k) const { return resident_.contains(k); }
  /// Resident bytes now (the activation footprint the plan budgets).
  [[nodiscard]] std::int64_t bytes() const { return resident_.bytes(); }
  /// The largest resident footprint since construction.
  [[nodiscard]] std::int64_t peak_bytes() const noexcept { return peak_; }
  /// Bytes moved to the offload store since construction.
  [[nodiscard]] std::int64_t offloaded_bytes() const noexcept { return offloaded_bytes_; }
  /// Bytes brought back from it since construction.
  [[nodiscard]] std::int64_t fetched_bytes() const noexcept { return fetched_bytes_; }
  /// Tensors held (resident keys), where the resident store counts them.
  [[nodiscard]] std::size_t slots() const {
    if constexpr (requires { resident_.slots(); })
      return resident_.slots();
    else
      return 0;
  }

 private:
  /// The resident side's memory policy (its own when it has one).
  const memory_type& memory() const {
    if constexpr (requires { resident_.memory(); })
      return resident_.memory();
    else
      return mem_;
  }

  Resident resident_{};
  Offload offload_{};
  memory_type mem_{};
  std::map<std::pair<int, int>, double> ratios_;
  mutable std::map<model::activation_key, typename memory_type::template buffer<T>> fetched_;
  model::host_buffer_t<memory_type, T> staging_;  // the offloaded tail on its way to the host store
  std::int64_t peak_ = 0, offloaded_bytes_ = 0;
  mutable std::int64_t fetched_bytes_ = 0;
};

static_assert(model::activation_store<offload_store<float>, float>);
static_assert(model::check_activation_store<offload_store<double>, double>());

}  // namespace hetmesh::train
