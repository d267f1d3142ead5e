// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: Megatron-LM indexed datasets (`prefix.bin` + `prefix.idx`, the "MMapIndexedDataset"
// format), read by mmap and written byte for byte as Megatron's _IndexWriter does, so files made by
// Megatron's preprocessing open here unchanged and files written here open in Megatron.
//
// .idx layout (little endian, no padding):
//   offset 0   9 bytes   magic "MMIDIDX\0\0"
//          9   u64       version, always 1
//         17   u8        dtype code of the .bin elements (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8
//         u16) 18   u64       sequence count S 26   u64       document count D (number of documents + 1:
//         document_indices starts with 0) 34   i32[S]    sequence lengths, in elements
//              i64[S]    sequence pointers, byte offsets into .bin (prefix sums of length * itemsize)
//              i64[D]    document indices: sequence index where each document ends, after a leading 0
//             (i8[S])    sequence modes, only in Megatron's multimodal variant
// .bin: the sequences' elements back to back.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "detail/file.hpp"

namespace hetmesh::data {

static_assert(
    std::endian::native == std::endian::little,
    "hetmesh::data reads Megatron's little-endian files by mapping them; big-endian hosts are not supported");

/// Element types are hetmesh's one `dtype` (core/dtype.hpp); Megatron's DType enum numbers them
/// differently on disk (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16), so the files go through
/// these two mappings.
using ::hetmesh::dtype;

/// Megatron's on-disk code of `t`, or 0 for a dtype Megatron has no code for (uint32, uint64, float16,
/// bfloat16). Pure; O(1).
[[nodiscard]] constexpr std::uint8_t megatron_code(dtype t) noexcept {
  switch (t) {
    case dtype::uint8:
      return 1;
    case dtype::int8:
      return 2;
    case dtype::int16:
      return 3;
    case dtype::int32:
      return 4;
    case dtype::int64:
      return 5;
    case dtype::float64:
      return 6;
    case dtype::float32:
      return 7;
    case dtype::uint16:
      return 8;
    case dtype::uint32:
    case dtype::uint64:
    case dtype::float16:
    case dtype::bfloat16:
      break;
  }
  return 0;
}

/// The dtype of Megatron's on-disk code `code`; throws data_error for a code outside Megatron's table
/// 1..8. Pure; O(1).
[[nodiscard]] HETMESH_COMPILED dtype dtype_from_megatron_code(int code);

/// The dtype Megatron picks for a vocabulary (uint16 below 65500 tokens, else int32).
[[nodiscard]] constexpr dtype optimal_dtype(std::int64_t vocab_size) noexcept {
  return vocab_size < 65500 ? dtype::uint16 : dtype::int32;
}

/// Magic bytes at the start of a Megatron .idx file.
inline constexpr char indexed_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
/// Size of the .idx header, in bytes.
inline constexpr std::int64_t indexed_header_bytes = 34;

/// A read-only Megatron indexed dataset. Opening maps both files and validates the whole index against
/// the data file once (O(S)): magic, version, dtype, exact .idx size, contiguous pointers, document
/// indices, and that the last sequence ends exactly at the end of .bin. Any mismatch is a data_error
/// naming the file, the field and what was expected. After that, reads are bounds-safe by construction.
/// Thread-safe for concurrent reads (immutable after construction). Move-only.
class indexed_dataset {
 public:
  /// Opens `prefix.idx` and `prefix.bin`. Cost: two mmaps plus an O(S + D) scan of the index.
  explicit indexed_dataset(const std::string& prefix)
      : prefix_(prefix),
        idx_(prefix + ".idx", "indexed dataset index"),
        bin_(prefix + ".bin", "indexed dataset data") {
    validate();
  }

  /// The dataset prefix (`p` of `p.bin`/`p.idx`).
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  /// Element type of the token ids.
  [[nodiscard]] dtype type() const noexcept { return type_; }
  /// Number of sequences (Megatron's len(IndexedDataset)).
  [[nodiscard]] std::int64_t size() const noexcept { return sequences_; }
  /// Number of documents (document_count - 1).
  [[nodiscard]] std::int64_t documents() const noexcept { return doc_entries_ - 1; }
  /// Elements of sequence i. Pre: 0 <= i < size().
  [[nodiscard]] std::int64_t length(std::int64_t i) const noexcept {
    return detail::load_le<std::int32_t>(lengths_ + 4 * i);
  }
  /// Byte offset of sequence i in .bin.
  [[nodiscard]] std::int64_t pointer(std::int64_t i) const noexcept {
    return detail::load_le<std::int64_t>(pointers_ + 8 * i);
  }
  /// Sequence range [begin, end) of document d. Pre: 0 <= d < documents().
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> document(std::int64_t d) const noexcept {
    return {detail::load_le<std::int64_t>(docs_ + 8 * d), detail::load_le<std::int64_t>(docs_ + 8 * (d + 1))};
  }
  /// Whether the index carries Megatron's multimodal per-sequence modes.
  [[nodiscard]] bool multimodal() const noexcept { return modes_ != nullptr; }
  /// Megatron's multimodal mode of sequence i; 0 when the index has none.
  [[nodiscard]] std::int8_t mode(std::int64_t i) const noexcept {
    return modes_ == nullptr ? std::int8_t{0} : static_cast<std::int8_t>(modes_[i]);
  }
  /// The raw bytes of sequence i inside the mapped .bin (no copy).
  [[nodiscard]] std::span<const std::byte> raw(std::int64_t i) const noexcept {
    return bin_.bytes().subspan(static_cast<std::size_t>(pointer(i)),
                                static_cast<std::size_t>(length(i) * elem_));
  }
  /// Appends sequence i's elements, converted to int32 token ids, to `out`. Cost O(length); no
  /// zero-fill pass (the elements are appended, not assigned into a resized vector).
  HETMESH_COMPILED void read_tokens(std::int64_t i, std::vector<std::int32_t>& out) const;
  /// Bytes of the mapped index (all of it is touched by validation, so it is resident) and of .bin.
  [[nodiscard]] std::int64_t index_bytes() const noexcept { return idx_.size(); }
  /// Size of the .bin file in bytes.
  [[nodiscard]] std::int64_t data_bytes() const noexcept { return bin_.size(); }

 private:
  HETMESH_COMPILED void validate();

  std::string prefix_{};
  detail::mapped_file idx_, bin_;
  dtype type_ = dtype::int32;
  std::int64_t elem_ = 4;
  std::int64_t sequences_ = 0, doc_entries_ = 1;
  const std::byte* lengths_ = nullptr;
  const std::byte* pointers_ = nullptr;
  const std::byte* docs_ = nullptr;
  const std::byte* modes_ = nullptr;
};

/// Writes a Megatron indexed dataset: sequences stream into a temporary beside `prefix.bin` as they are
/// added; `finish()` writes the index and renames both into place, so a writer destroyed before finish()
/// (a bad token, a full disk) leaves no partial dataset and the previous one, if any, unharmed. Mirrors
/// Megatron's builder: add_sequence() per sequence, end_document() after the last sequence of each
/// document. Not thread-safe. Cost O(total bytes).
class indexed_dataset_writer {
 public:
  /// Pre: Megatron has a code for `type` (megatron_code(type) != 0), else invalid_argument.
  indexed_dataset_writer(std::string prefix, dtype type)
      : prefix_(std::move(prefix)),
        type_(checked(type, prefix_)),
        elem_(static_cast<std::int64_t>(dtype_size(type))),
        bin_(prefix_ + ".bin") {}

  /// Appends one sequence. Pre: every value fits the dtype (else invalid_argument naming the value).
  template <class T>
  void add_sequence(std::span<const T> tokens) {
    buf_.resize(tokens.size() * static_cast<std::size_t>(elem_));
    std::byte* out = buf_.data();
    for (std::size_t k = 0; k < tokens.size(); ++k) {
      const auto v = static_cast<std::int64_t>(tokens[k]);
      switch (type_) {
        case dtype::uint8:
          store<std::uint8_t>(out, k, v);
          break;
        case dtype::int8:
          store<std::int8_t>(out, k, v);
          break;
        case dtype::int16:
          store<std::int16_t>(out, k, v);
          break;
        case dtype::uint16:
          store<std::uint16_t>(out, k, v);
          break;
        case dtype::int32:
          store<std::int32_t>(out, k, v);
          break;
        case dtype::int64:
          store<std::int64_t>(out, k, v);
          break;
        default:
          throw_error<invalid_argument>("indexed_dataset_writer: dtype code {} is not an integer type",
                                        megatron_code(type_));
      }
    }
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      throw_error<invalid_argument>(
          "indexed_dataset_writer: a sequence of {} elements exceeds Megatron's int32 length field",
          tokens.size());
    bin_.write(buf_);
    lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  }
  /// Closes the current document (Megatron's end_document).
  void end_document() { docs_.push_back(static_cast<std::int64_t>(lengths_.size())); }
  /// Writes the index. Sequences added since the last end_document() form one final document.
  HETMESH_COMPILED void finish();

 private:
  HETMESH_COMPILED static dtype checked(dtype type, const std::string& prefix);
  template <class U>
  void store(std::byte* out, std::size_t k, std::int64_t v) {
    if (v < static_cast<std::int64_t>(std::numeric_limits<U>::min()) ||
        v > static_cast<std::int64_t>(std::numeric_limits<U>::max()))
      throw_error<invalid_argument>("indexed_dataset_writer: token {} does not fit dtype code {} of '{}'", v,
                                    megatron_code(type_), prefix_);
    const U u = static_cast<U>(v);
    std::memcpy(out + k * sizeof(U), &u, sizeof(U));
  }

  std::string prefix_{};
  dtype type_;
  std::int64_t elem_;
  detail::atomic_file bin_;
  std::vector<std::byte> buf_{};
  std::vector<std::int32_t> lengths_{};
  std::vector<std::int64_t> docs_{0};
};

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::indexed_dataset> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::indexed_dataset& d, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "indexed_dataset({}, {}, {} sequences, {} documents)", d.prefix(),
                              d.type(), d.size(), d.documents());
  }
};

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED dtype dtype_from_megatron_code(int code) {
  static constexpr dtype table[] = {dtype::uint8, dtype::int8,    dtype::int16,   dtype::int32,
                                    dtype::int64, dtype::float64, dtype::float32, dtype::uint16};
  if (code < 1 || code > 8)
    throw_error<data_error>("dtype code {} is not one of Megatron's codes 1..8", code);
  return table[code - 1];
}

HETMESH_COMPILED void indexed_dataset::read_tokens(std::int64_t i, std::vector<std::int32_t>& out) const {
  const std::byte* src = raw(i).data();
  const auto n = static_cast<std::size_t>(length(i));
  out.reserve(out.size() + n);
  auto append = [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t k = 0; k < n; ++k)
      out.push_back(static_cast<std::int32_t>(detail::load_le<T>(src + k * sizeof(T))));
  };
  switch (type_) {
    case dtype::uint8:
      append(std::uint8_t{});
      break;
    case dtype::int8:
      append(std::int8_t{});
      break;
    case dtype::int16:
      append(std::int16_t{});
      break;
    case dtype::uint16:
      append(std::uint16_t{});
      break;
    case dtype::int32:
      // Sequence pointers are multiples of 4 and the mapping is page aligned, so this is an aligned copy.
      out.insert(out.end(), reinterpret_cast<const std::int32_t*>(src),
                 reinterpret_cast<const std::int32_t*>(src) + n);
      break;
    default:
      throw_error<invalid_argument>(
          "'{}.bin' holds dtype code {}, which is not a token type; expected an integer type of at most 32 "
          "bits",
          prefix_, megatron_code(type_));
  }
}

HETMESH_COMPILED void indexed_dataset::validate() {
  const auto idx = idx_.bytes();
  const std::string& ip = idx_.path();
  if (idx_.size() < indexed_header_bytes)
    throw_error<data_error>("'{}' is truncated: {} bytes, expected at least the {}-byte header", ip,
                            idx_.size(), indexed_header_bytes);
  if (std::memcmp(idx.data(), indexed_magic, sizeof indexed_magic) != 0)
    throw_error<data_error>(
        "'{}' does not start with Megatron's magic \"MMIDIDX\\0\\0\"; not an MMapIndexedDataset index", ip);
  const auto version = detail::load_le<std::uint64_t>(idx.data() + 9);
  if (version != 1) throw_error<data_error>("'{}' has index version {}; expected version 1", ip, version);
  const auto code = detail::load_le<std::uint8_t>(idx.data() + 17);
  if (code < 1 || code > 8)
    throw_error<data_error>("'{}' has dtype code {}; expected one of Megatron's codes 1..8", ip, code);
  type_ = dtype_from_megatron_code(code);
  elem_ = static_cast<std::int64_t>(dtype_size(type_));
  const auto s = detail::load_le<std::uint64_t>(idx.data() + 18);
  const auto d = detail::load_le<std::uint64_t>(idx.data() + 26);
  const std::uint64_t limit = static_cast<std::uint64_t>(idx_.size());
  if (s > limit / 12 || d > limit / 8 || d < 1)
    throw_error<data_error>(
        "'{}' declares {} sequences and {} document entries, which cannot fit in its {} bytes", ip, s, d,
        limit);
  sequences_ = static_cast<std::int64_t>(s);
  doc_entries_ = static_cast<std::int64_t>(d);
  const std::int64_t plain = indexed_header_bytes + 12 * sequences_ + 8 * doc_entries_;
  if (idx_.size() != plain && idx_.size() != plain + sequences_)
    throw_error<data_error>(
        "'{}' is {} bytes; for {} sequences and {} document entries expected {} (or {} with modes): "
        "truncated or corrupt",
        ip, idx_.size(), sequences_, doc_entries_, plain, plain + sequences_);
  lengths_ = idx.data() + indexed_header_bytes;
  pointers_ = lengths_ + 4 * sequences_;
  docs_ = pointers_ + 8 * sequences_;
  modes_ = idx_.size() == plain ? nullptr : docs_ + 8 * doc_entries_;
  std::int64_t expect = 0;
  for (std::int64_t i = 0; i < sequences_; ++i) {
    const std::int64_t len = length(i);
    if (len < 0) throw_error<data_error>("'{}': sequence {} has negative length {}", ip, i, len);
    if (pointer(i) != expect)
      throw_error<data_error>(
          "'{}': sequence {} starts at byte {}; expected {} (sum of the previous lengths x {} bytes): "
          "index and data do not match",
          ip, i, pointer(i), expect, elem_);
    expect += len * elem_;
  }
  if (expect != bin_.size())
    throw_error<data_error>(
        "'{}' is {} bytes but its index '{}' describes {} bytes: the index does not match its data "
        "(truncated .bin?)",
        bin_.path(), bin_.size(), ip, expect);
  std::int64_t prev = 0;
  for (std::int64_t k = 0; k < doc_entries_; ++k) {
    const auto v = detail::load_le<std::int64_t>(docs_ + 8 * k);
    if ((k == 0 && v != 0) || v < prev || v > sequences_)
      throw_error<data_error>(
          "'{}': document index entry {} is {}; expected a non-decreasing list starting at 0 and ending at "
          "{}",
          ip, k, v, sequences_);
    prev = v;
  }
  if (prev != sequences_)
    throw_error<data_error>("'{}': the last document ends at sequence {}; expected {} (all sequences)", ip,
                            prev, sequences_);
}

HETMESH_COMPILED void indexed_dataset_writer::finish() {
  if (docs_.back() != static_cast<std::int64_t>(lengths_.size())) end_document();
  std::vector<std::byte> idx;
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    idx.insert(idx.end(), b, b + n);
  };
  const std::uint64_t version = 1, s = lengths_.size(), d = docs_.size();
  const std::uint8_t code = megatron_code(type_);
  put(indexed_magic, sizeof indexed_magic);
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  put(lengths_.data(), lengths_.size() * 4);
  std::int64_t ptr = 0;
  for (std::int32_t len : lengths_) {
    put(&ptr, 8);
    ptr += len * elem_;
  }
  put(docs_.data(), docs_.size() * 8);
  // Both files go under temporary names first; the .bin is renamed, then the .idx: a failure before
  // the renames leaves the previous dataset (or none), never a partial one.
  detail::atomic_file idx_file(prefix_ + ".idx");
  idx_file.write(idx);
  idx_file.close();
  bin_.commit();
  idx_file.commit();
}

HETMESH_COMPILED dtype indexed_dataset_writer::checked(dtype type, const std::string& prefix) {
  if (megatron_code(type) == 0)
    throw_error<invalid_argument>(
        "indexed_dataset_writer: '{}' as {}, which Megatron's indexed format has no code for; expected "
        "one of uint8, int8, int16, uint16, int32, int64, float32, float64",
        prefix, type);
  return type;
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
