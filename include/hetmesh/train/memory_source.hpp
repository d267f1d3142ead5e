// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: memory_source, a train::piece_source over rank snapshots held in memory (what
// train::capture returns on each rank), so that a checkpoint's state can be restored under another layout
// without files: in tests, or by a user who moves snapshots over their own channel. Each tensor field is
// assembled whole from its pieces; a read takes any block and range of it by the full tensor's indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "checkpoint_piece.hpp"

namespace hetmesh::train {

/// Elements of block `b` of a tensor of `full` elements, or -1 when `b` is no block of such a tensor (a
/// split that does not divide its axis, a part out of range, a shape of another size). O(1).
[[nodiscard]] constexpr std::int64_t block_elements(const tensor_shard& b, std::int64_t full) noexcept {
  if (full < 0) return -1;
  if (b.rows == 0) return full;
  if (b.rows < 0 || b.cols < 1 || b.parts < 1 || b.part < 0 || b.part >= b.parts ||
      (b.axis != 0 && b.axis != 1))
    return -1;
  if (b.rows > full / b.cols || b.full_size() != full || (b.axis == 0 ? b.rows : b.cols) % b.parts != 0)
    return -1;
  return full / b.parts;
}

/// A piece_source over rank snapshots held in memory (the ranks' capture() results): each tensor field is
/// assembled whole from every piece of it, and fill() reads any block and range of it. For tests, and for
/// a user who moves snapshots without files. Memory: every saved field whole.
template <class T>
class memory_source {
 public:
  /// The union of `ranks`' snapshots. Errors (data_error naming the tensor and field, or the counter or
  /// blob): a piece whose key is no block and range of its tensor, or whose size is not its count; pieces
  /// of one field with different full sizes; two pieces that hold one element with different bits (ranks
  /// that disagree); a counter or blob with two values. O(elements saved).
  explicit memory_source(std::span<const rank_snapshot<T>> ranks) {
    for (const auto& r : ranks) {
      for (const auto& p : r.pieces) add(p);
      merge(counters_, r.counters, "counter");
      merge(blobs_, r.blobs, "blob");
    }
  }

  /// Writes the elements `k` names into `out` (piece_source). Errors: data_error naming the tensor and
  /// field when it is not saved, when k.full differs from the saved tensor's, or when an element is in no
  /// piece; invalid_argument when `k` is no block and range of its tensor or out.size() != k.count.
  void fill(const piece_key& k, std::span<T> out) const {
    const auto it = fields_.find({k.tensor, k.field});
    if (it == fields_.end())
      throw_error<data_error>("train::memory_source: tensor {} field {}: not in the checkpoint", k.tensor,
                              k.field);
    const field& f = it->second;
    if (k.full != f.full)
      throw_error<data_error>(
          "train::memory_source: tensor {} field {}: a tensor of {} elements asked; the checkpoint's has {}",
          k.tensor, k.field, k.full, f.full);
    const auto n = block_elements(k.block, k.full);
    if (n < 0 || k.begin < 0 || k.count < 0 || k.begin > n - k.count ||
        out.size() != static_cast<std::size_t>(k.count))
      throw_error<invalid_argument>(
          "train::memory_source: tensor {} field {}: elements [{}, +{}) into {} of a block of {}; expected a "
          "range of the block",
          k.tensor, k.field, k.begin, k.count, out.size(), n);
    for (std::int64_t i = 0; i < k.count; ++i) {
      const auto g = static_cast<std::size_t>(k.block.global(k.begin + i));
      if (!f.held[g])
        throw_error<data_error>(
            "train::memory_source: tensor {} field {}: element {} of the full tensor is in no saved piece",
            k.tensor, k.field, g);
      out[static_cast<std::size_t>(i)] = f.values[g];
    }
  }
  /// Whether field `field` of tensor `tensor` is saved (piece_source).
  [[nodiscard]] bool has(std::int64_t tensor, const std::string& field) const {
    return fields_.contains({tensor, field});
  }
  /// The counter `name`, or nullopt (piece_source).
  [[nodiscard]] std::optional<std::int64_t> counter(const std::string& name) const {
    return find(counters_, name);
  }
  /// The blob `name`, or nullopt (piece_source).
  [[nodiscard]] std::optional<std::vector<std::byte>> blob(const std::string& name) const {
    return find(blobs_, name);
  }

 private:
  struct field {
    std::int64_t full = 0;
    std::vector<T> values;
    std::vector<char> held;
  };

  void add(const checkpoint_piece<T>& p) {
    const piece_key& k = p.key;
    const auto n = block_elements(k.block, k.full);
    if (n < 0 || k.begin < 0 || k.count < 0 || k.begin > n - k.count ||
        p.data.size() != static_cast<std::size_t>(k.count))
      throw_error<data_error>(
          "train::memory_source: tensor {} field {}: a piece of {} elements as [{}, +{}) of a block of {} of "
          "a tensor of {}; expected a range of a block",
          k.tensor, k.field, p.data.size(), k.begin, k.count, n, k.full);
    auto [it, fresh] = fields_.try_emplace({k.tensor, k.field});
    field& f = it->second;
    if (fresh) {
      f.full = k.full;
      f.values.resize(static_cast<std::size_t>(k.full));
      f.held.resize(static_cast<std::size_t>(k.full), 0);
    } else if (f.full != k.full) {
      throw_error<data_error>(
          "train::memory_source: tensor {} field {}: pieces of a tensor of {} and of {} elements; expected "
          "one size",
          k.tensor, k.field, f.full, k.full);
    }
    for (std::int64_t i = 0; i < k.count; ++i) {
      const auto g = static_cast<std::size_t>(k.block.global(k.begin + i));
      const T& x = p.data[static_cast<std::size_t>(i)];
      if (f.held[g] && std::memcmp(&f.values[g], &x, sizeof(T)) != 0)
        throw_error<data_error>(
            "train::memory_source: tensor {} field {}: element {} of the full tensor saved as {} and as {}; "
            "expected ranks to agree",
            k.tensor, k.field, g, f.values[g], x);
      f.values[g] = x;
      f.held[g] = 1;
    }
  }
  template <class V>
  static void merge(std::map<std::string, V>& into, const std::map<std::string, V>& from, const char* what) {
    for (const auto& [name, v] : from)
      if (const auto [it, fresh] = into.try_emplace(name, v); !fresh && it->second != v)
        throw_error<data_error>("train::memory_source: {} '{}' has two values across ranks; expected one",
                                what, name);
  }
  template <class V>
  static std::optional<V> find(const std::map<std::string, V>& m, const std::string& name) {
    const auto it = m.find(name);
    return it == m.end() ? std::nullopt : std::optional<V>(it->second);
  }

  std::map<std::pair<std::int64_t, std::string>, field> fields_;
  std::map<std::string, std::int64_t> counters_;
  std::map<std::string, std::vector<std::byte>> blobs_;
};

}  // namespace hetmesh::train
