// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: a checkpoint's manifest as JSON (docs/checkpoint.md) and back. Reading checks every
// field's presence and type before its value is used, and names the field's JSON path in the error; the
// manifest's "checksum" (64-bit, over the canonical dump of the rest) catches a changed byte that still
// parses. JSON lives here, out of the umbrellas (pipeline/trace_json.hpp says why).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "checkpoint_manifest.hpp"

namespace hetmesh::train {

/// A 64-bit checksum as its manifest text: 16 lowercase hex digits.
[[nodiscard]] inline std::string checksum_text(std::uint64_t v) { return hetmesh::format("{:016x}", v); }

/// The hasher digest of `text` (the manifest's checksum is this over the canonical dump of the rest).
[[nodiscard]] inline std::uint64_t text_checksum(std::string_view text) noexcept {
  hasher h;
  h.add_bytes(reinterpret_cast<const unsigned char*>(text.data()), text.size());
  return h.digest();
}

namespace detail {

/// Typed access to the members of JSON read from `where`: each throws data_error
/// "WHERE: PATH = VALUE; expected ..." for a missing member or a value of the wrong type or range.
struct ckpt_json {
  std::string_view where;  ///< the file, for errors

  /// Member `key` of object `o` (at JSON path `path`).
  [[nodiscard]] const nlohmann::json& member(const nlohmann::json& o, const char* key,
                                             const std::string& path) const {
    if (!o.is_object()) throw_error<data_error>("{}: {} is not an object; expected one", where, path);
    const auto it = o.find(key);
    if (it == o.end()) throw_error<data_error>("{}: {}.{} is missing; expected it", where, path, key);
    return *it;
  }
  /// An integer in [lo, hi].
  [[nodiscard]] std::int64_t integer(const nlohmann::json& o, const char* key, const std::string& path,
                                     std::int64_t lo, std::int64_t hi) const {
    const auto& v = member(o, key, path);
    const bool fits = v.is_number_integer() &&
                      (v.is_number_unsigned() ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi)
                                              : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi);
    if (!fits || v.get<std::int64_t>() < lo)
      throw_error<data_error>("{}: {}.{} = {}; expected an integer in [{}, {}]", where, path, key, shown(v),
                              lo, hi);
    return v.get<std::int64_t>();
  }
  /// A string of at most `max_bytes` bytes.
  [[nodiscard]] std::string string(const nlohmann::json& o, const char* key, const std::string& path,
                                   std::size_t max_bytes = 4096) const {
    const auto& v = member(o, key, path);
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_bytes)
      throw_error<data_error>("{}: {}.{} = {}; expected a string of at most {} bytes", where, path, key,
                              shown(v), max_bytes);
    return v.get<std::string>();
  }
  /// A 64-bit value written as 16 hex digits.
  [[nodiscard]] std::uint64_t hex64(const nlohmann::json& o, const char* key, const std::string& path) const {
    const auto& v = member(o, key, path);
    std::uint64_t x = 0;
    bool ok = v.is_string() && v.get_ref<const std::string&>().size() == 16;
    for (char c : ok ? v.get_ref<const std::string&>() : std::string()) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      ok = ok && d >= 0;
      x = (x << 4) | static_cast<std::uint64_t>(d < 0 ? 0 : d);
    }
    if (!ok)
      throw_error<data_error>("{}: {}.{} = {}; expected 16 lowercase hex digits", where, path, key, shown(v));
    return x;
  }
  /// An array of at most `max_size` entries.
  [[nodiscard]] const nlohmann::json& array(const nlohmann::json& o, const char* key, const std::string& path,
                                            std::size_t max_size = std::size_t{1} << 24) const {
    const auto& v = member(o, key, path);
    if (!v.is_array() || v.size() > max_size)
      throw_error<data_error>("{}: {}.{} = {}; expected an array of at most {} entries", where, path, key,
                              shown(v), max_size);
    return v;
  }
  /// A value for an error message: its JSON, cut at 60 characters.
  [[nodiscard]] static std::string shown(const nlohmann::json& v) {
    std::string s = v.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  }
};

}  // namespace detail

/// A piece entry as JSON (the manifest's and the rank index files' form). Pure.
[[nodiscard]] HETMESH_COMPILED nlohmann::json piece_entry_to_json(const checkpoint_piece_entry& p)
#if HETMESH_BODIES
{
  const auto& b = p.key.block;
  return {
      {"tensor", p.key.tensor},
      {"field", p.key.field},
      {"block", {{"rows", b.rows}, {"cols", b.cols}, {"axis", b.axis}, {"part", b.part}, {"parts", b.parts}}},
      {"full", p.key.full},
      {"begin", p.key.begin},
      {"count", p.key.count},
      {"file", p.file},
      {"offset", p.offset}};
}
#else
    ;
#endif

/// The piece entry in `j` (at JSON path `path` of the file `where`): every field present and an integer
/// or string as docs/checkpoint.md says (sizes in [-2^48, 2^48], so that check_piece_key names a negative
/// one); data_error naming `where`, the path and the field otherwise. Pure.
[[nodiscard]] HETMESH_COMPILED checkpoint_piece_entry piece_entry_from_json(const nlohmann::json& j,
                                                                            std::string_view where,
                                                                            const std::string& path)
#if HETMESH_BODIES
{
  const detail::ckpt_json r{where};
  constexpr std::int64_t big = checkpoint_max_size, small = std::numeric_limits<int>::max();
  checkpoint_piece_entry p;
  p.key.tensor = r.integer(j, "tensor", path, 0, big);
  p.key.field = r.string(j, "field", path, 256);
  const auto& b = r.member(j, "block", path);
  const std::string bp = path + ".block";
  p.key.block.rows = r.integer(b, "rows", bp, -big, big);
  p.key.block.cols = r.integer(b, "cols", bp, -big, big);
  p.key.block.axis = static_cast<int>(r.integer(b, "axis", bp, -small, small));
  p.key.block.part = static_cast<int>(r.integer(b, "part", bp, -small, small));
  p.key.block.parts = static_cast<int>(r.integer(b, "parts", bp, -small, small));
  p.key.full = r.integer(j, "full", path, -big, big);
  p.key.begin = r.integer(j, "begin", path, -big, big);
  p.key.count = r.integer(j, "count", path, -big, big);
  p.file = r.string(j, "file", path, 256);
  p.offset = r.integer(j, "offset", path, 0, big);
  return p;
}
#else
    ;
#endif

/// The manifest as JSON (docs/checkpoint.md), with its "checksum": text_checksum of the dump of the rest
/// (nlohmann::json orders members by name, so the dump is canonical). Pure.
[[nodiscard]] HETMESH_COMPILED nlohmann::json manifest_to_json(const checkpoint_manifest& m)
#if HETMESH_BODIES
{
  nlohmann::json j = {{"format", checkpoint_format},
                      {"version", m.version},
                      {"library", m.library},
                      {"step", m.step},
                      {"id", checksum_text(m.id)},
                      {"dtype", m.dtype},
                      {"layout", m.layout},
                      {"ranks", m.ranks},
                      {"tensors", nlohmann::json::array()},
                      {"files", nlohmann::json::array()},
                      {"pieces", nlohmann::json::array()},
                      {"blobs", nlohmann::json::array()},
                      {"counters", nlohmann::json::object()}};
  for (const auto& t : m.tensors)
    j["tensors"].push_back({{"id", t.id}, {"full", t.full}, {"fields", t.fields}});
  for (const auto& f : m.files)
    j["files"].push_back(
        {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"checksum", checksum_text(f.checksum)}});
  for (const auto& p : m.pieces) j["pieces"].push_back(piece_entry_to_json(p));
  for (const auto& b : m.blobs)
    j["blobs"].push_back({{"name", b.name}, {"file", b.file}, {"offset", b.offset}, {"bytes", b.bytes}});
  for (const auto& [k, v] : m.counters) j["counters"][k] = v;
  j["checksum"] = checksum_text(text_checksum(j.dump()));
  return j;
}
#else
    ;
#endif

/// The manifest in `j` (read from `where`, named in errors): every field present and of its type, the
/// format and version this library reads, the checksum equal to the rest's, then index_manifest's checks.
/// Throws data_error naming `where`, the field's JSON path and what was expected. Pure.
[[nodiscard]] HETMESH_COMPILED checkpoint_manifest manifest_from_json(const nlohmann::json& j,
                                                                      std::string_view where)
#if HETMESH_BODIES
{
  const detail::ckpt_json r{where};
  constexpr std::int64_t big = checkpoint_max_size;
  if (r.string(j, "format", "manifest") != checkpoint_format)
    throw_error<data_error>("{}: manifest.format = {}; expected \"{}\"", where, j["format"].dump(),
                            checkpoint_format);
  const std::uint64_t sum = r.hex64(j, "checksum", "manifest");
  nlohmann::json rest = j;
  rest.erase("checksum");
  if (text_checksum(rest.dump()) != sum)
    throw_error<data_error>(
        "{}: manifest.checksum = {}; the manifest's content hashes to {} (a changed byte)", where,
        checksum_text(sum), checksum_text(text_checksum(rest.dump())));
  checkpoint_manifest m;
  m.version = r.integer(j, "version", "manifest", 0, big);
  m.library = r.string(j, "library", "manifest", 64);
  m.step = r.integer(j, "step", "manifest", 0, std::int64_t{1} << 62);
  m.id = r.hex64(j, "id", "manifest");
  m.dtype = r.string(j, "dtype", "manifest", 16);
  m.layout = r.string(j, "layout", "manifest", std::size_t{1} << 20);
  m.ranks = static_cast<int>(r.integer(j, "ranks", "manifest", 1, 1 << 20));
  const auto& ts = r.array(j, "tensors", "manifest");
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string p = hetmesh::format("manifest.tensors[{}]", i);
    manifest_tensor t{r.integer(ts[i], "id", p, 0, big), r.integer(ts[i], "full", p, -big, big), {}};
    const auto& fs = r.array(ts[i], "fields", p, 64);
    for (std::size_t k = 0; k < fs.size(); ++k) {
      if (!fs[k].is_string())
        throw_error<data_error>("{}: {}.fields[{}] = {}; expected a string", where, p, k, r.shown(fs[k]));
      t.fields.push_back(fs[k].get<std::string>());
    }
    m.tensors.push_back(std::move(t));
  }
  const auto& files = r.array(j, "files", "manifest", std::size_t{1} << 20);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string p = hetmesh::format("manifest.files[{}]", i);
    m.files.push_back({r.string(files[i], "name", p, 256),
                       static_cast<int>(r.integer(files[i], "rank", p, 0, 1 << 20)),
                       r.integer(files[i], "bytes", p, -big, big), r.hex64(files[i], "checksum", p)});
  }
  const auto& pieces = r.array(j, "pieces", "manifest");
  for (std::size_t i = 0; i < pieces.size(); ++i)
    m.pieces.push_back(piece_entry_from_json(pieces[i], where, hetmesh::format("manifest.pieces[{}]", i)));
  const auto& blobs = r.array(j, "blobs", "manifest");
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    const std::string p = hetmesh::format("manifest.blobs[{}]", i);
    m.blobs.push_back({r.string(blobs[i], "name", p, 256), r.string(blobs[i], "file", p, 256),
                       r.integer(blobs[i], "offset", p, 0, big), r.integer(blobs[i], "bytes", p, -big, big)});
  }
  const auto& cs = r.member(j, "counters", "manifest");
  if (!cs.is_object())
    throw_error<data_error>("{}: manifest.counters = {}; expected an object", where, r.shown(cs));
  for (auto it = cs.begin(); it != cs.end(); ++it)
    m.counters[it.key()] =
        r.integer(cs, it.key().c_str(), "manifest.counters", std::numeric_limits<std::int64_t>::min(),
                  std::numeric_limits<std::int64_t>::max());
  (void)index_manifest(m, where);
  return m;
}
#else
    ;
#endif

}  // namespace hetmesh::train
