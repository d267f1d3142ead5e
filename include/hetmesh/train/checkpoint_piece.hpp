// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: what a checkpoint holds, independent of the layout that wrote it. A rank's state is a
// set of pieces, each a run of elements of one field ("value", "adam.m", ...) of one tensor, named by the
// tensor's global id and by where the elements sit in the full tensor (the block the rank held under
// tensor or expert parallelism, and a range of the block's elements: a ZeRO-1 shard holds a range of each
// tensor's block). Named counters (Adam's update counts, the step) and named byte strings (the data
// position, the user's RNG states) go beside them. A load asks for any block and range of a tensor's field
// and gets the elements from whichever pieces hold them: resharding is by the full tensor's indices.
//
// This header is the contract between the two halves of train::checkpoint: capturing and restoring a
// model's and an optimizer's state as pieces (train/checkpoint_state.hpp), and writing, verifying and
// reading pieces on disk (train/checkpoint_store.hpp).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tensor_shard.hpp"

namespace hetmesh::train {

/// Which elements of which tensor field a piece holds: elements [begin, begin + count) of `block`'s
/// row-major elements, block being the part of the full tensor (of `full` elements) that the saving rank
/// held. The full tensor's element of the piece's element i is block.global(begin + i).
struct piece_key {
  std::int64_t tensor = 0;  ///< the tensor's global id (model_tensor::id)
  std::string field;        ///< "value", or an optimizer state's field ("adam.m", "adam.v")
  tensor_shard block{};     ///< the block of the full tensor (rows = 0: the whole tensor)
  std::int64_t full = 0;    ///< elements of the full tensor
  std::int64_t begin = 0;   ///< the piece's first element among the block's
  std::int64_t count = 0;   ///< elements in the piece
  friend bool operator==(const piece_key&, const piece_key&) = default;
};

/// A piece and its elements (key.count of them).
template <class T>
struct checkpoint_piece {
  piece_key key;        ///< which elements
  std::vector<T> data;  ///< their values, in the block's row-major order
};

/// Everything one rank contributes to a checkpoint (T: the model's element type, float or double).
/// Replicated state (a tensor every data-parallel rank holds) may come from every rank: a save keeps one
/// copy of each distinct piece key; counters of the same name must agree across ranks.
template <class T>
struct rank_snapshot {
  std::vector<checkpoint_piece<T>> pieces;              ///< tensor fields
  std::map<std::string, std::int64_t> counters;         ///< e.g. "step", "adam.t/<id>"
  std::map<std::string, std::vector<std::byte>> blobs;  ///< e.g. "data" (the data position), "rng/<name>"
};

/// Where a load reads a checkpoint from, whatever layout wrote it:
///  - `s.fill(key, out)` writes the elements `key` names (key.count == out.size()) into `out`, taking each
///    from a saved piece of the same tensor and field that holds the same element of the full tensor;
///    throws hetmesh::data_error naming the tensor and field when some element is in no piece, or when
///    key.full differs from the saved tensor's size;
///  - `s.has(tensor, field)`: whether the checkpoint holds that field of that tensor;
///  - `s.counter(name)` and `s.blob(name)`: the named values, or nullopt.
template <class S, class T>
concept piece_source = requires(const S& s, const piece_key& k, std::span<T> out, const std::string& name,
                                std::int64_t id) {
  s.fill(k, out);
  { s.has(id, name) } -> std::convertible_to<bool>;
  { s.counter(name) } -> std::convertible_to<std::optional<std::int64_t>>;
  { s.blob(name) } -> std::convertible_to<std::optional<std::vector<std::byte>>>;
};

}  // namespace hetmesh::train
