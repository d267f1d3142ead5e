// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the manifest of a checkpoint on disk (docs/checkpoint.md), as plain data, and its checks.
// The manifest lists the tensors by id with their full sizes, every saved piece with its global place (the
// piece_key) and where its elements sit (a shard file and a byte offset), the named counters and byte
// strings, and every shard file with its size and 64-bit checksum. Its own checksum covers everything else
// in it. index_manifest checks every field against every other before a reader hands out an element:
// sizes, offsets, ids, dtype, that the pieces of each tensor field cover its full tensor exactly once. The
// JSON form is train/checkpoint_json.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "checkpoint_piece.hpp"
#include "memory_source.hpp"  // block_elements

namespace hetmesh::train {

/// The manifest's "format" value.
inline constexpr std::string_view checkpoint_format = "hetmesh-checkpoint";
/// The format version this library writes and reads.
inline constexpr std::int64_t checkpoint_format_version = 1;
/// The manifest's file name inside a step directory.
inline constexpr std::string_view checkpoint_manifest_name = "manifest.json";
/// The bytes of a shard file's header: magic "HMCKSHRD", then the checkpoint id, the step and the rank
/// (three little-endian 64-bit integers).
inline constexpr std::int64_t checkpoint_shard_header_bytes = 32;
/// The largest element count or byte size a manifest may state (2^48): products with an element size stay
/// far inside int64, and nothing is allocated from a size before it is checked against a file.
inline constexpr std::int64_t checkpoint_max_size = std::int64_t{1} << 48;

/// The dtype name of element type T in a manifest: "float32" or "float64".
template <class T>
[[nodiscard]] constexpr std::string_view checkpoint_dtype() noexcept {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "train checkpoints hold float (\"float32\") or double (\"float64\") elements");
  return std::is_same_v<T, float> ? "float32" : "float64";
}

/// One shard file of a checkpoint: its name in the step directory, the rank that wrote it, its size and
/// the 64-bit checksum (hetmesh::hasher) of all its bytes.
struct checkpoint_file {
  std::string name;            ///< e.g. "shard-00003.bin"
  int rank = 0;                ///< the writing rank
  std::int64_t bytes = 0;      ///< the file's size
  std::uint64_t checksum = 0;  ///< hasher digest of the whole file
};

/// Where a saved piece's elements are: `key.count` elements of the manifest's dtype at byte `offset` of
/// shard file `file`.
struct checkpoint_piece_entry {
  piece_key key;            ///< which elements of which tensor field
  std::string file;         ///< the shard file's name
  std::int64_t offset = 0;  ///< byte offset in it
};

/// Where a named byte string is: `bytes` bytes at byte `offset` of shard file `file`.
struct checkpoint_blob_entry {
  std::string name;         ///< e.g. "data", "rng/trainer"
  std::string file;         ///< the shard file's name
  std::int64_t offset = 0;  ///< byte offset in it
  std::int64_t bytes = 0;   ///< its length
};

/// A tensor of the checkpoint: its id, its full element count and the fields saved.
struct manifest_tensor {
  std::int64_t id = 0;              ///< model_tensor::id
  std::int64_t full = 0;            ///< elements of the full tensor
  std::vector<std::string> fields;  ///< "value", "adam.m", ... (sorted)
};

/// A checkpoint's manifest (manifest.json), independent of the layout that wrote it.
struct checkpoint_manifest {
  std::int64_t version = checkpoint_format_version;  ///< format version
  std::string library;                               ///< the writing library's version, "0.1.0"
  std::int64_t step = 0;                             ///< the training step saved
  std::uint64_t id = 0;                              ///< this checkpoint's random id (also in every shard)
  std::string dtype;                                 ///< "float32" or "float64"
  std::string layout;                                ///< the caller's description of the layout (opaque)
  int ranks = 0;                                     ///< ranks that saved it
  std::vector<manifest_tensor> tensors;              ///< by id
  std::vector<checkpoint_file> files;                ///< by rank
  std::vector<checkpoint_piece_entry> pieces;        ///< every saved piece
  std::vector<checkpoint_blob_entry> blobs;          ///< every named byte string
  std::map<std::string, std::int64_t> counters;      ///< named counters ("step", "adam.t/<id>")
};

/// Throws E naming `where` and the field when `k` is not a well-formed key: the full size in
/// [1, checkpoint_max_size]; a whole-tensor block (rows = 0, part 0 of 1) or a block with rows, cols >= 1,
/// rows x cols = full, axis 0 or 1, 1 <= parts dividing the split dimension, 0 <= part < parts; and
/// 0 <= begin, 0 <= count, begin + count <= the block's elements. Pure; O(1).
template <class E>
void check_piece_key(const piece_key& k, std::string_view where) {
  const auto& b = k.block;
  if (k.full < 1 || k.full > checkpoint_max_size)
    throw_error<E>("{}.full = {}; expected an element count in [1, 2^48]", where, k.full);
  if (b.rows == 0) {
    if (b.part != 0 || b.parts != 1)
      throw_error<E>("{}.block: rows = 0 (the whole tensor) with part {} of {}; expected part 0 of 1", where,
                     b.part, b.parts);
  } else {
    if (b.rows < 1 || b.cols < 1 || b.rows > k.full || b.cols > k.full || b.rows * b.cols != k.full)
      throw_error<E>(
          "{}.block: rows {} x cols {}; expected positive rows and cols whose product is full ({})", where,
          b.rows, b.cols, k.full);
    if (b.axis != 0 && b.axis != 1) throw_error<E>("{}.block.axis = {}; expected 0 or 1", where, b.axis);
    const std::int64_t dim = b.axis == 0 ? b.rows : b.cols;
    if (b.parts < 1 || b.parts > dim || dim % b.parts != 0)
      throw_error<E>("{}.block.parts = {}; expected a divisor of block.{} ({})", where, b.parts,
                     b.axis == 0 ? "rows" : "cols", dim);
    if (b.part < 0 || b.part >= b.parts)
      throw_error<E>("{}.block.part = {}; expected in [0, {})", where, b.part, b.parts);
  }
  const std::int64_t n = block_elements(b, k.full);
  if (k.begin < 0 || k.count < 0 || k.begin > n || k.count > n - k.begin)
    throw_error<E>(
        "{}: begin {} + count {} ; expected 0 <= begin, 0 <= count, begin + count <= {} (the "
        "block's elements)",
        where, k.begin, k.count, n);
}

/// A 64-bit hash of a piece key (equal keys, equal hashes, on every rank and platform).
[[nodiscard]] inline std::uint64_t piece_key_hash(const piece_key& k) {
  hasher h;
  append(h, k.tensor);
  append(h, std::string_view(k.field));
  for (std::int64_t v : {k.block.rows, k.block.cols, std::int64_t{k.block.axis}, std::int64_t{k.block.part},
                         std::int64_t{k.block.parts}, k.full, k.begin, k.count})
    append(h, v);
  return h.digest();
}

/// The name of rank `rank`'s shard file in a step directory: "shard-RRRRR.bin".
[[nodiscard]] inline std::string checkpoint_shard_name(int rank) {
  return hetmesh::format("shard-{:05}.bin", rank);
}

/// The bytes of one element of dtype `dtype` ("float32": 4, "float64": 8; 0 for another name).
[[nodiscard]] constexpr std::int64_t checkpoint_dtype_bytes(std::string_view dtype) noexcept {
  return dtype == "float32" ? 4 : dtype == "float64" ? 8 : 0;
}

/// The saved pieces of one tensor field, indexed for reading: every piece of it has the same split of the
/// full tensor (`split`: rows = 0 when whole, else its rows, cols, axis and parts; `part` unused), and
/// `parts[p]` lists block p's pieces as (begin, index into checkpoint_manifest::pieces), by begin, covering
/// the block's elements exactly once.
struct checkpoint_field_index {
  tensor_shard split{};                                                  ///< the pieces' split
  std::int64_t full = 0;                                                 ///< elements of the full tensor
  std::vector<std::vector<std::pair<std::int64_t, std::size_t>>> parts;  ///< per block: (begin, piece)
};

/// Where element `g` of a full tensor of `full` elements sits under `split` (a checkpoint_field_index's):
/// in block `part`, at the block's element `local`, and how many elements from there on (`run`) follow
/// each other both in the full tensor and in the block. Pre: 0 <= g < full. O(1).
struct split_place {
  int part = 0;            ///< the block
  std::int64_t local = 0;  ///< the element among the block's
  std::int64_t run = 0;    ///< elements contiguous in both from here
  /// The place of `g`.
  [[nodiscard]] static constexpr split_place of(const tensor_shard& split, std::int64_t full,
                                                std::int64_t g) noexcept {
    if (split.rows == 0 || split.parts == 1) return {0, g, full - g};
    if (split.axis == 0) {
      const std::int64_t per = full / split.parts;
      return {static_cast<int>(g / per), g % per, per - g % per};
    }
    const std::int64_t lc = split.cols / split.parts, r = g / split.cols, c = g % split.cols;
    return {static_cast<int>(c / lc), r * lc + c % lc, lc - c % lc};
  }
};

/// Every tensor field of a manifest, indexed: key (tensor id, field).
using checkpoint_index = std::map<std::pair<std::int64_t, std::string>, checkpoint_field_index>;

namespace detail {
/// index_manifest's check of the ranks and files: the size of each file by name.
[[nodiscard]] HETMESH_COMPILED std::map<std::string, std::int64_t> ckpt_check_files(
    const checkpoint_manifest& m, std::string_view where)
#if HETMESH_BODIES
{
  if (m.ranks < 1 || m.ranks > (1 << 20))
    throw_error<data_error>("{}: ranks = {}; expected in [1, 1048576]", where, m.ranks);
  if (m.files.size() != static_cast<std::size_t>(m.ranks))
    throw_error<data_error>("{}: files has {} entries; expected one per rank ({})", where, m.files.size(),
                            m.ranks);
  std::map<std::string, std::int64_t> file_bytes;
  for (std::size_t r = 0; r < m.files.size(); ++r) {
    const auto& f = m.files[r];
    if (f.rank != static_cast<int>(r) || f.name != checkpoint_shard_name(static_cast<int>(r)))
      throw_error<data_error>("{}: files[{}] = '{}' of rank {}; expected '{}' of rank {}", where, r, f.name,
                              f.rank, checkpoint_shard_name(static_cast<int>(r)), r);
    if (f.bytes < checkpoint_shard_header_bytes || f.bytes > checkpoint_max_size)
      throw_error<data_error>("{}: files[{}].bytes = {}; expected in [{}, 2^48]", where, r, f.bytes,
                              checkpoint_shard_header_bytes);
    file_bytes[f.name] = f.bytes;
  }
  return file_bytes;
}
#else
    ;
#endif
}  // namespace detail

/// Checks the manifest's fields against each other and indexes its pieces: version this library reads;
/// dtype "float32"/"float64"; ranks in [1, 2^20]; one file per rank, named checkpoint_shard_name(rank),
/// of [header, 2^48] bytes; every piece key well-formed (check_piece_key) of a non-empty field; every
/// piece and blob inside its file past the header, no two overlapping; blob names unique; tensors unique by
/// id, with the pieces' full size and fields; the pieces of each tensor field of one split, covering every
/// block of it exactly once (no element twice, none missing). Throws data_error naming `where` (the
/// manifest's path) and the field. Pure; O(pieces log pieces).
[[nodiscard]] HETMESH_COMPILED checkpoint_index index_manifest(const checkpoint_manifest& m,
                                                               std::string_view where)
#if HETMESH_BODIES
{
  const std::int64_t elt = checkpoint_dtype_bytes(m.dtype);
  if (m.version != checkpoint_format_version)
    throw_error<data_error>("{}: version = {}; expected {} (the format this library reads)", where, m.version,
                            checkpoint_format_version);
  if (elt == 0) throw_error<data_error>("{}: dtype = '{}'; expected 'float32' or 'float64'", where, m.dtype);
  const auto file_bytes = detail::ckpt_check_files(m, where);
  // Byte ranges per file: inside it, past the header, apart from each other.
  std::map<std::string, std::vector<std::tuple<std::int64_t, std::int64_t, std::string>>> ranges;
  auto place = [&](const std::string& file, std::int64_t offset, std::int64_t bytes,
                   const std::string& what) {
    const auto it = file_bytes.find(file);
    if (it == file_bytes.end())
      throw_error<data_error>("{}: {}.file = '{}'; expected a file the manifest lists", where, what, file);
    if (offset < checkpoint_shard_header_bytes || offset > it->second || bytes > it->second - offset)
      throw_error<data_error>("{}: {}: offset {} + {} bytes; expected inside '{}' ({} bytes, {} of header)",
                              where, what, offset, bytes, file, it->second, checkpoint_shard_header_bytes);
    ranges[file].emplace_back(offset, offset + bytes, what);
  };
  std::map<std::string, int> blob_names;
  for (std::size_t i = 0; i < m.blobs.size(); ++i) {
    const auto& b = m.blobs[i];
    const std::string what = hetmesh::format("blobs[{}] ('{}')", i, b.name);
    if (b.name.empty() || !blob_names.emplace(b.name, 0).second)
      throw_error<data_error>("{}: {}.name; expected a non-empty name used once", where, what);
    if (b.bytes < 0) throw_error<data_error>("{}: {}.bytes = {}; expected >= 0", where, what, b.bytes);
    place(b.file, b.offset, b.bytes, what);
  }
  std::map<std::int64_t, const manifest_tensor*> tensors;
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& t = m.tensors[i];
    if (t.id < 0 || !tensors.emplace(t.id, &t).second)
      throw_error<data_error>("{}: tensors[{}].id = {}; expected a non-negative id listed once", where, i,
                              t.id);
    if (t.full < 1 || t.full > checkpoint_max_size)
      throw_error<data_error>("{}: tensors[{}].full = {}; expected in [1, 2^48]", where, i, t.full);
    if (t.fields.empty() || !std::is_sorted(t.fields.begin(), t.fields.end()) ||
        std::adjacent_find(t.fields.begin(), t.fields.end()) != t.fields.end())
      throw_error<data_error>("{}: tensors[{}].fields has {} names; expected at least one, sorted and unique",
                              where, i, t.fields.size());
  }
  checkpoint_index index;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    const std::string what = hetmesh::format("pieces[{}]", i);
    check_piece_key<data_error>(p.key, hetmesh::format("{}: {}", where, what));
    const auto t = tensors.find(p.key.tensor);
    if (t == tensors.end())
      throw_error<data_error>("{}: {}.tensor = {}; expected a tensor the manifest lists", where, what,
                              p.key.tensor);
    if (p.key.full != t->second->full)
      throw_error<data_error>("{}: {}.full = {}; expected tensor {}'s full size {}", where, what, p.key.full,
                              p.key.tensor, t->second->full);
    const auto& fs = t->second->fields;
    if (p.key.field.empty() || std::find(fs.begin(), fs.end(), p.key.field) == fs.end())
      throw_error<data_error>("{}: {}.field = '{}'; expected one of tensor {}'s fields", where, what,
                              p.key.field, p.key.tensor);
    place(p.file, p.offset, p.key.count * elt, what);
    tensor_shard split = p.key.block;
    split.part = 0;
    if (split.parts == 1) split = tensor_shard{};
    auto& f = index[{p.key.tensor, p.key.field}];
    if (f.parts.empty()) {
      f.split = split;
      f.full = p.key.full;
      f.parts.resize(static_cast<std::size_t>(split.parts));
    } else if (!(f.split == split)) {
      throw_error<data_error>(
          "{}: {}: tensor {} field '{}' split {} x {} axis {} in {}; expected the split of "
          "its other pieces ({} x {} axis {} in {})",
          where, what, p.key.tensor, p.key.field, split.rows, split.cols, split.axis, split.parts,
          f.split.rows, f.split.cols, f.split.axis, f.split.parts);
    }
    if (p.key.count > 0) f.parts[static_cast<std::size_t>(p.key.block.part)].emplace_back(p.key.begin, i);
  }
  for (auto& [file, rs] : ranges) {
    std::sort(rs.begin(), rs.end());
    for (std::size_t i = 1; i < rs.size(); ++i)
      if (std::get<0>(rs[i]) < std::get<1>(rs[i - 1]))
        throw_error<data_error>("{}: {} and {} overlap in '{}' (bytes {} and {}); expected apart", where,
                                std::get<2>(rs[i - 1]), std::get<2>(rs[i]), file, std::get<0>(rs[i - 1]),
                                std::get<0>(rs[i]));
  }
  for (const auto& [id, t] : tensors)
    for (const auto& field : t->fields)
      if (!index.contains({id, field}))
        throw_error<data_error>(
            "{}: tensor {} field '{}': no piece holds it; expected pieces covering its {} "
            "elements",
            where, id, field, t->full);
  for (auto& [k, f] : index) {
    const std::int64_t n = f.full / f.split.parts;
    for (std::size_t part = 0; part < f.parts.size(); ++part) {
      auto& ps = f.parts[part];
      std::sort(ps.begin(), ps.end());
      std::int64_t at = 0;
      for (const auto& [begin, i] : ps) {
        if (begin != at)
          throw_error<data_error>("{}: tensor {} field '{}' block {}: {} at element {}; expected {}", where,
                                  k.first, k.second, part,
                                  begin < at ? hetmesh::format("pieces[{}] starts again", i)
                                             : hetmesh::format("a gap before pieces[{}]", i),
                                  begin, at);
        at = begin + m.pieces[i].key.count;
      }
      if (at != n)
        throw_error<data_error>(
            "{}: tensor {} field '{}' block {}: the pieces end at element {}; expected them "
            "to cover all {} of the block",
            where, k.first, k.second, part, at, n);
    }
  }
  return index;
}
#else
    ;
#endif

}  // namespace hetmesh::train
