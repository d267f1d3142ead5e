// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: activation slots. What a stage saves in its forward for its backward lives in a store
// the runtime owns, keyed by (stage, micro-batch, tensor), not in the stage: a pipeline schedule runs
// several micro-batches' forwards before their backwards, the runtime knows when a slot may be freed,
// and selective offload (ByteScale) moves slots to host memory and back through a store the user can
// replace. A slot is written once and read any number of times until it is released; reading a slot
// that was never written, or writing one twice, is a bug in a stage or a schedule and throws an error
// naming the slot.
#pragma once

#include <compare>
#include <concepts>
#include <cstdint>
#include <limits>
#include <map>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "host_memory.hpp"

namespace hetmesh::model {

/// The key of an activation slot: a stage, a micro-batch, and which of the stage's saved tensors
/// (0 when it saves one).
struct activation_key {
  int stage = 0;        ///< pipeline stage (or encoder shard)
  int micro_batch = 0;  ///< micro-batch index
  int tensor = 0;       ///< which saved tensor of that (stage, micro-batch)

  friend constexpr bool operator==(const activation_key&, const activation_key&) = default;
  /// Orders keys by (stage, micro_batch, tensor).
  friend constexpr auto operator<=>(const activation_key&, const activation_key&) = default;
};

/// A slot was read before it was written (or after it was released), or written twice.
class activation_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// Opt-in for activation_store: a store declares `using is_activation_store = void;`, so that an
/// unrelated type with read/write members never matches by accident.
template <class S>
inline constexpr bool enable_activation_store = requires {
  typename S::is_activation_store;
};

/// An activation store for element type T: where stages' saved tensors live between a micro-batch's
/// forward and its backward. Requirements:
///  1. opt-in: `enable_activation_store<S>` is true;
///  2. `s.write(key, std::span<const T>)`: stores a copy of the data under `key`; throws activation_error
///     naming the key when the slot already holds data;
///  3. `s.read(key)` -> convertible to std::span<const T>: the data written under `key`, valid until the
///     slot is released or the store destroyed; throws activation_error naming the key when the slot
///     holds nothing;
///  4. `s.release(key)`: frees the slot (it may be written again); throws activation_error when empty;
///  5. `s.contains(key)` -> bool, on a const store;
///  6. `s.bytes()` -> std::int64_t, on a const store: bytes of the data it holds (wherever it holds it).
/// Optional members the runtime uses when present (train::offload_store over a resident and an offload
/// store):
///  - `typename S::memory_type`: the memory policy of its buffers (model::host_memory when absent);
///  - `s.release_all(stage, micro_batch)` -> int: frees every slot of (stage, micro_batch), returning how
///    many there were (without it, nothing is freed in bulk and 0 is reported);
///  - `s.slots()` -> std::size_t on a const store: slots held (0 reported without it);
///  - `s.memory()` -> const memory_type& on a const store: its policy, when it holds one (a stream);
///    otherwise a default-constructed policy is used.
/// model::host_activation_store is the host-memory model.
template <class S, class T>
concept activation_store = enable_activation_store<std::remove_cvref_t<S>> &&
    requires(S& s, const S& cs, activation_key k, std::span<const T> data) {
  s.write(k, data);
  { s.read(k) } -> std::convertible_to<std::span<const T>>;
  s.release(k);
  { cs.contains(k) } -> std::convertible_to<bool>;
  { cs.bytes() } -> std::convertible_to<std::int64_t>;
};

namespace detail {
template <class S, class T>
concept store_writes = requires(S& s, activation_key k, std::span<const T> data) {
  s.write(k, data);
};
template <class S, class T>
concept store_reads = requires(S& s, activation_key k) {
  { s.read(k) } -> std::convertible_to<std::span<const T>>;
};
template <class S>
concept store_releases = requires(S& s, activation_key k) {
  s.release(k);
};
template <class S>
concept store_contains = requires(const S& s, activation_key k) {
  { s.contains(k) } -> std::convertible_to<bool>;
};
template <class S>
concept store_bytes = requires(const S& s) {
  { s.bytes() } -> std::convertible_to<std::int64_t>;
};
}  // namespace detail

/// Checks `activation_store<S, T>` requirement by requirement: each one S misses fails a static_assert that
/// names it. Returns true (so `static_assert(check_activation_store<S, T>())`).
template <class S, class T>
consteval bool check_activation_store() {
  static_assert(
      enable_activation_store<std::remove_cvref_t<S>>,
      "activation_store requirement 1: the store type must opt in with `using is_activation_store = void;`");
  static_assert(detail::store_writes<S, T>,
                "activation_store requirement 2: missing `write(activation_key, std::span<const T>)`");
  static_assert(
      detail::store_reads<S, T>,
      "activation_store requirement 3: missing `read(activation_key)` returning a std::span<const T>");
  static_assert(detail::store_releases<S>,
                "activation_store requirement 4: missing `release(activation_key)`");
  static_assert(detail::store_contains<S>,
                "activation_store requirement 5: missing `bool contains(activation_key) const`");
  static_assert(detail::store_bytes<S>,
                "activation_store requirement 6: missing `std::int64_t bytes() const`");
  return true;
}

/// An activation store whose slots are buffers of memory policy M (model/memory_policy.hpp): one buffer per
/// slot, written by M's copy, so saved tensors stay where the stage's activations live (host memory for
/// host_memory, device memory for a device policy; the store never reads them on the CPU). Not thread-safe
/// (one per rank).
template <class T, memory_policy M = host_memory>
class memory_activation_store {
 public:
  /// Opt-in for activation_store.
  using is_activation_store = void;
  /// Element type of the saved tensors.
  using value_type = T;
  /// The memory policy of the slots.
  using memory_type = M;

  /// A store whose copies run through `mem` (its stream, for a device policy).
  explicit memory_activation_store(M mem = {}) : mem_(std::move(mem)) {}

  /// Copies `data` (memory of M) into the slot `k`. Pre: the slot is empty (else activation_error naming
  /// it). O(data.size() + log slots).
  void write(activation_key k, std::span<const T> data);

  /// The data of slot `k` (memory of M). Pre: written and not released (else activation_error naming it).
  /// O(log slots).
  [[nodiscard]] std::span<const T> read(activation_key k) const;

  /// Frees slot `k`. Pre: written and not released (else activation_error naming it). O(log slots).
  void release(activation_key k);

  /// Frees every slot of (stage, micro_batch), whatever its tensor index; returns how many. O(log slots + k).
  int release_all(int stage, int micro_batch);

  /// Whether slot `k` holds data. O(log slots).
  [[nodiscard]] bool contains(activation_key k) const { return slots_.contains(k); }
  /// Bytes held. O(1).
  [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_; }
  /// Slots held. O(1).
  [[nodiscard]] std::size_t slots() const noexcept { return slots_.size(); }
  /// The memory policy its copies run through.
  [[nodiscard]] const M& memory() const noexcept { return mem_; }

 private:
  M mem_;
  std::map<activation_key, typename M::template buffer<T>> slots_;
  std::int64_t bytes_ = 0;
};

template <class T, memory_policy M>
void memory_activation_store<T, M>::write(activation_key k, std::span<const T> data) {
  const auto [it, fresh] = slots_.try_emplace(k);
  if (!fresh)
    throw_error<activation_error>(
        "activation slot (stage {}, micro-batch {}, tensor {}) written twice; expected one write per "
        "forward and a release after its backward",
        k.stage, k.micro_batch, k.tensor);
  try {
    it->second.resize(data.size());
    mem_.copy(it->second.span(), data);
  } catch (...) {  // a failed write leaves the slot empty, as it was
    slots_.erase(it);
    throw;
  }
  bytes_ += static_cast<std::int64_t>(data.size() * sizeof(T));
}

template <class T, memory_policy M>
std::span<const T> memory_activation_store<T, M>::read(activation_key k) const {
  const auto it = slots_.find(k);
  if (it == slots_.end())
    throw_error<activation_error>(
        "activation slot (stage {}, micro-batch {}, tensor {}) read before it was written (or after it was "
        "released); expected the stage's forward of that micro-batch to run first",
        k.stage, k.micro_batch, k.tensor);
  return it->second.span();
}

template <class T, memory_policy M>
void memory_activation_store<T, M>::release(activation_key k) {
  const auto it = slots_.find(k);
  if (it == slots_.end())
    throw_error<activation_error>(
        "activation slot (stage {}, micro-batch {}, tensor {}) released but holds nothing", k.stage,
        k.micro_batch, k.tensor);
  bytes_ -= static_cast<std::int64_t>(it->second.size() * sizeof(T));
  slots_.erase(it);
}

template <class T, memory_policy M>
int memory_activation_store<T, M>::release_all(int stage, int micro_batch) {
  int n = 0;
  auto it = slots_.lower_bound({stage, micro_batch, std::numeric_limits<int>::min()});
  while (it != slots_.end() && it->first.stage == stage && it->first.micro_batch == micro_batch) {
    bytes_ -= static_cast<std::int64_t>(it->second.size() * sizeof(T));
    it = slots_.erase(it);
    ++n;
  }
  return n;
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the stores of float and double in host memory and on the host
// side of host memory (train::offload_store's offloaded share). HETMESH_INSTANTIATE is `extern template` in
// every translation unit but the one of <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
HETMESH_INSTANTIATE class memory_activation_store<float, host_memory>;
HETMESH_INSTANTIATE class memory_activation_store<double, host_memory>;
HETMESH_INSTANTIATE class memory_activation_store<float, host_side_memory<host_memory>>;
HETMESH_INSTANTIATE class memory_activation_store<double, host_side_memory<host_memory>>;
#endif

/// The activation store in host memory: one vector per slot.
template <class T>
using host_activation_store = memory_activation_store<T, host_memory>;

static_assert(activation_store<host_activation_store<float>, float>);
static_assert(activation_store<host_activation_store<double>, double>);
static_assert(check_activation_store<host_activation_store<double>, double>());

/// A stage's handle on its own slots for one micro-batch: the store and (stage, micro-batch) bound, so
/// a stage says `slot.save(0, x)` and `slot.load(0)`. Holds a pointer: the store outlives the handle.
template <class Store>
class activation_slot {
 public:
  /// A handle on `store`'s slots of (stage, micro_batch).
  activation_slot(Store& store, int stage, int micro_batch) noexcept
      : store_(&store), stage_(stage), micro_batch_(micro_batch) {}

  /// Saves `data` as tensor `tensor` (Store::write's contract): any contiguous, sized range whose
  /// elements the store takes (a std::vector, a std::array, a std::span, a C array), viewed as a
  /// std::span<const T> without a copy, so a stage needs no wrapper. A range of another element type
  /// than the store's is refused at compile time (the store has no write for it).
  template <std::ranges::contiguous_range R>
  requires std::ranges::sized_range<R> &&
      detail::store_writes<Store, std::remove_cv_t<std::ranges::range_value_t<R>>>
  void save(int tensor, R&& data) const {
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    store_->write(activation_key{stage_, micro_batch_, tensor},
                  std::span<const T>(std::ranges::data(data), std::ranges::size(data)));
  }
  /// The saved tensor `tensor` (Store::read's contract).
  [[nodiscard]] decltype(auto) load(int tensor) const {
    return store_->read(activation_key{stage_, micro_batch_, tensor});
  }
  /// Releases tensor `tensor` (Store::release's contract).
  void release(int tensor) const { store_->release(activation_key{stage_, micro_batch_, tensor}); }
  /// The stage the handle is bound to.
  [[nodiscard]] int stage() const noexcept { return stage_; }
  /// The micro-batch the handle is bound to.
  [[nodiscard]] int micro_batch() const noexcept { return micro_batch_; }

 private:
  Store* store_;
  int stage_;
  int micro_batch_;
};

}  // namespace hetmesh::model

template <>
struct fmt::formatter<hetmesh::model::activation_key> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::activation_key& k, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "(stage {}, micro-batch {}, tensor {})", k.stage, k.micro_batch,
                              k.tensor);
  }
};
