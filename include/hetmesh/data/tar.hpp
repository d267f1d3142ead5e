// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the POSIX ustar subset WebDataset shards use: regular files in 512-byte blocks, each
// behind a 512-byte header with an octal size and a checksum, ended by two zero blocks. Reading accepts
// ustar ("ustar\0" "00") and GNU ("ustar  \0") headers and skips pax extended headers; the checksum of
// every header is verified so a corrupt shard is rejected where it is corrupt.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"

namespace hetmesh::data::tar {

/// Size of a tar block and header, in bytes.
inline constexpr std::int64_t block = 512;

/// One member of an archive: its name, where its content starts, and its size.
struct member {
  std::string name{};       ///< path of the member in the archive
  std::int64_t offset = 0;  ///< of the content (the header is 512 bytes before it)
  std::int64_t size = 0;    ///< bytes of content
  friend bool operator==(const member&, const member&) = default;
};

namespace detail {

HETMESH_COMPILED void put_octal(char* field, std::size_t width, std::uint64_t v);

HETMESH_COMPILED std::uint64_t get_octal(const char* field, std::size_t width, bool& ok);

HETMESH_COMPILED std::uint64_t checksum(const unsigned char* h);

}  // namespace detail

/// The 512-byte ustar header of a regular file `name` of `size` bytes. Names longer than 100 bytes are
/// split into prefix/name at a '/' as ustar allows (up to 255 bytes); otherwise invalid_argument.
[[nodiscard]] HETMESH_COMPILED std::vector<std::byte> header(std::string_view name, std::int64_t size);

/// Parses the header at `offset` of `archive`. Returns false at the end-of-archive zero block. Throws
/// data_error (naming `path`) for a bad checksum, a bad size field or a member running past the end.
/// `type` receives the typeflag.
HETMESH_COMPILED bool parse_header(std::span<const std::byte> archive, std::int64_t offset,
                                   const std::string& path, member& out, char& type);

/// Lists the regular-file members of an archive in order. Cost: one pass over the headers.
[[nodiscard]] HETMESH_COMPILED std::vector<member> list(std::span<const std::byte> archive,
                                                        const std::string& path);

}  // namespace hetmesh::data::tar

#if HETMESH_BODIES

namespace hetmesh::data::tar::detail {

HETMESH_COMPILED void put_octal(char* field, std::size_t width, std::uint64_t v) {
  // width-1 octal digits, zero padded, then NUL: the ustar convention.
  for (std::size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (v & 7U));
    v >>= 3;
  }
  field[width - 1] = '\0';
}

HETMESH_COMPILED std::uint64_t get_octal(const char* field, std::size_t width, bool& ok) {
  std::uint64_t v = 0;
  std::size_t i = 0;
  while (i < width && field[i] == ' ') ++i;  // some writers right-align with spaces
  for (; i < width && field[i] != '\0' && field[i] != ' '; ++i) {
    if (field[i] < '0' || field[i] > '7') {
      ok = false;
      return 0;
    }
    v = (v << 3) | static_cast<std::uint64_t>(field[i] - '0');
  }
  return v;
}

HETMESH_COMPILED std::uint64_t checksum(const unsigned char* h) {
  std::uint64_t sum = 0;
  for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? static_cast<unsigned char>(' ') : h[i];
  return sum;
}

}  // namespace hetmesh::data::tar::detail

namespace hetmesh::data::tar {

HETMESH_COMPILED std::vector<std::byte> header(std::string_view name, std::int64_t size) {
  std::vector<std::byte> out(block, std::byte{0});
  char* h = reinterpret_cast<char*>(out.data());
  std::string_view prefix, base = name;
  if (name.size() > 100) {
    const auto cut = name.rfind('/', 155);
    if (cut == std::string_view::npos || name.size() - cut - 1 > 100 || cut == 0)
      throw_error<invalid_argument>(
          "tar: member name '{}' ({} bytes) does not fit ustar's 100-byte name + 155-byte prefix", name,
          name.size());
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  if (!base.empty()) std::memcpy(h, base.data(), base.size());  // an empty view may hold nullptr
  detail::put_octal(h + 100, 8, 0644);
  detail::put_octal(h + 108, 8, 0);
  detail::put_octal(h + 116, 8, 0);
  detail::put_octal(h + 124, 12, static_cast<std::uint64_t>(size));
  detail::put_octal(h + 136, 12, 0);  // mtime 0: shards are reproducible byte for byte
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  h[263] = '0';
  h[264] = '0';
  if (!prefix.empty()) std::memcpy(h + 345, prefix.data(), prefix.size());
  const auto sum = detail::checksum(reinterpret_cast<const unsigned char*>(h));
  detail::put_octal(h + 148, 7, sum);
  h[155] = ' ';
  return out;
}

HETMESH_COMPILED bool parse_header(std::span<const std::byte> archive, std::int64_t offset,
                                   const std::string& path, member& out, char& type) {
  const auto total = static_cast<std::int64_t>(archive.size());
  if (offset + block > total)
    throw_error<data_error>("tar '{}' is truncated: a header at byte {} needs 512 bytes, the file has {}",
                            path, offset, total);
  const auto* h = reinterpret_cast<const unsigned char*>(archive.data() + offset);
  bool zero = true;
  for (int i = 0; i < 512 && zero; ++i) zero = h[i] == 0;
  if (zero) return false;
  const char* c = reinterpret_cast<const char*>(h);
  bool ok = true;
  const auto stored = detail::get_octal(c + 148, 8, ok);
  if (!ok || stored != detail::checksum(h))
    throw_error<data_error>(
        "tar '{}': the header at byte {} has checksum {} but its bytes sum to {}: corrupt shard", path,
        offset, stored, detail::checksum(h));
  const auto size = detail::get_octal(c + 124, 12, ok);
  if (!ok)
    throw_error<data_error>("tar '{}': the header at byte {} has a malformed size field", path, offset);
  type = c[156];
  std::string name(c, strnlen(c, 100));
  if (std::memcmp(c + 257, "ustar", 5) == 0 && c[345] != '\0')
    name = std::string(c + 345, strnlen(c + 345, 155)) + "/" + name;
  out.name = std::move(name);
  out.offset = offset + block;
  out.size = static_cast<std::int64_t>(size);
  if (out.offset + out.size > total)
    throw_error<data_error>("tar '{}' is truncated: member '{}' needs bytes [{}, {}) but the file has {}",
                            path, out.name, out.offset, out.offset + out.size, total);
  return true;
}

HETMESH_COMPILED std::vector<member> list(std::span<const std::byte> archive, const std::string& path) {
  std::vector<member> out{};
  std::int64_t off = 0;
  const auto total = static_cast<std::int64_t>(archive.size());
  for (;;) {
    if (off >= total) {
      throw_error<data_error>(
          "tar '{}' is truncated: it ends at byte {} without the two zero blocks that close an archive", path,
          total);
    }
    member m;
    char type = '0';
    if (!parse_header(archive, off, path, m, type)) break;
    off = m.offset + (m.size + block - 1) / block * block;
    if (type == '0' || type == '\0') {
      out.push_back(std::move(m));
    } else if (type == '5' || type == 'x' || type == 'g') {
      continue;  // directories and pax headers carry no sample data
    } else {
      throw_error<data_error>(
          "tar '{}': member '{}' has type '{}'; expected regular files (WebDataset shards hold only files)",
          path, m.name, type);
    }
  }
  return out;
}

}  // namespace hetmesh::data::tar
#endif  // HETMESH_BODIES
