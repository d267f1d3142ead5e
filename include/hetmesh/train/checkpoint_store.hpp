// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: reading a checkpoint from disk (the format: docs/checkpoint.md; writing it:
// train/checkpoint_files.hpp, collectively: train/checkpoint.hpp). Opening a checkpoint_reader verifies the
// whole checkpoint before it hands out anything: the manifest's fields and checksum (checkpoint_json.hpp),
// that the step directory holds exactly the files it lists, each a regular file of the listed size, with
// the listed checksum and a header naming this checkpoint, step and rank. Then fill() reads any block and
// range of a tensor field, whatever layout wrote it (resharding by the full tensor's element indices), into
// a staging buffer first: a refusal writes nothing into the caller's memory.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "checkpoint_files.hpp"
#include "checkpoint_json.hpp"
#include "checkpoint_manifest.hpp"
#include "checkpoint_piece.hpp"

namespace hetmesh::train {

/// The step directory `root`'s `latest` names, or nullopt when there is no `latest` (no checkpoint yet).
/// Errors: data_error when `latest` is not a regular file of one line "step-N" (at most 256 bytes), or
/// names a directory that does not exist. Not collective.
[[nodiscard]] HETMESH_COMPILED std::optional<std::string> latest_checkpoint(const std::string& root);

/// The step directory `dir` means: `dir` itself when it holds manifest.json, else the one its `latest`
/// names. Errors: data_error when it is neither (naming `dir`). Not collective.
[[nodiscard]] HETMESH_COMPILED std::string checkpoint_step_dir(const std::string& dir);

/// The manifest of the step directory `dir` (checkpoint_step_dir resolves a root), parsed and checked
/// (manifest_from_json; its step against the directory's name) without reading the shard files.
/// Errors: data_error naming the file and the field. Not collective; O(manifest).
[[nodiscard]] HETMESH_COMPILED checkpoint_manifest read_checkpoint_manifest(const std::string& dir);

/// A verified checkpoint to load from; a piece_source for float (dtype "float32") or double ("float64").
/// Opening reads every file once to verify it (see the file comment); fill() reads only the bytes asked.
/// Errors (data_error) name the file, the field and what was expected. Not collective; thread-safe for
/// concurrent const calls.
class checkpoint_reader {
 public:
  /// Opens and verifies the checkpoint in `dir` (a step directory, or a root whose `latest` names one).
  HETMESH_COMPILED explicit checkpoint_reader(const std::string& dir);

  /// The verified manifest.
  [[nodiscard]] const checkpoint_manifest& manifest() const noexcept { return manifest_; }
  /// The step directory read.
  [[nodiscard]] const std::string& directory() const noexcept { return dir_; }

  /// Writes the elements `k` names into `out` (k.count of them), from the saved pieces that hold the same
  /// elements of the full tensor. Errors: invalid_argument for a malformed key (check_piece_key) or
  /// out.size() != k.count; data_error when the checkpoint's dtype is not T's, when it lacks the tensor
  /// field, when k.full differs from the saved size, or when a file changed since it was verified. On an
  /// error nothing is written into `out`. O(k.count + pieces touched x log).
  template <class T>
  void fill(const piece_key& k, std::span<T> out) const {
    if (manifest_.dtype != checkpoint_dtype<T>())
      throw_error<data_error>("checkpoint '{}': dtype = '{}'; expected '{}' (the element type loading it)",
                              dir_, manifest_.dtype, checkpoint_dtype<T>());
    fill_bytes(k, out.size(), out.data());
  }
  /// Whether the checkpoint holds field `field` of tensor `tensor`.
  [[nodiscard]] bool has(std::int64_t tensor, const std::string& field) const {
    return index_.contains({tensor, field});
  }
  /// The counter `name`, or nullopt.
  [[nodiscard]] std::optional<std::int64_t> counter(const std::string& name) const {
    const auto it = manifest_.counters.find(name);
    return it == manifest_.counters.end() ? std::nullopt : std::optional<std::int64_t>(it->second);
  }
  /// The byte string `name`, or nullopt.
  [[nodiscard]] std::optional<std::vector<std::byte>> blob(const std::string& name) const {
    const auto it = blobs_.find(name);
    return it == blobs_.end() ? std::nullopt : std::optional<std::vector<std::byte>>(it->second);
  }

 private:
  void fill_bytes(const piece_key& k, std::size_t n, void* out) const;
  void verify_file(std::size_t r);

  std::string dir_;
  checkpoint_manifest manifest_;
  checkpoint_index index_;
  std::map<std::string, std::vector<std::byte>> blobs_;
};

static_assert(piece_source<checkpoint_reader, float> && piece_source<checkpoint_reader, double>);

// --- definitions -----------------------------------------------------------------------------------------

#if HETMESH_BODIES
namespace detail {

/// Reads `n` bytes at `offset` of the open file `fd` (`path` for errors).
inline void ckpt_pread(int fd, const std::string& path, std::int64_t offset, std::size_t n, void* to) {
  auto* p = static_cast<unsigned char*>(to);
  for (std::size_t done = 0; done < n;) {
    const auto k =
        ::pread(fd, p + done, n - done, static_cast<off_t>(offset + static_cast<std::int64_t>(done)));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw_error<data_error>("checkpoint: cannot read '{}': {}", path, std::strerror(errno));
    if (k == 0)
      throw_error<data_error>("checkpoint: '{}' ended while it was read; expected a stable file", path);
    done += static_cast<std::size_t>(k);
  }
}

}  // namespace detail

HETMESH_COMPILED std::optional<std::string> latest_checkpoint(const std::string& root) {
  const std::string path = root + "/latest";
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
  std::string text = read_regular_file(path, 256, "checkpoint pointer");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (checkpoint_step_of(text) < 0)
    throw_error<data_error>("checkpoint pointer '{}' holds '{}'; expected one line 'step-N'", path,
                            text.substr(0, 64));
  const std::string dir = root + "/" + text;
  if (!std::filesystem::is_directory(dir))
    throw_error<data_error>(
        "checkpoint pointer '{}' names '{}', which is not a directory; expected the "
        "latest step's directory",
        path, dir);
  return dir;
}

HETMESH_COMPILED std::string checkpoint_step_dir(const std::string& dir) {
  if (std::filesystem::exists(dir + "/" + std::string(checkpoint_manifest_name))) return dir;
  if (auto latest = latest_checkpoint(dir)) return *latest;
  throw_error<data_error>(
      "checkpoint '{}' holds neither {} nor latest; expected a step directory or a "
      "checkpoint root",
      dir, checkpoint_manifest_name);
}

HETMESH_COMPILED checkpoint_manifest read_checkpoint_manifest(const std::string& dir) {
  const std::string step_dir = checkpoint_step_dir(dir);
  const std::string path = step_dir + "/" + std::string(checkpoint_manifest_name);
  auto m = manifest_from_json(read_json_file(path, "checkpoint manifest"), path);
  const std::int64_t named = checkpoint_step_of(std::filesystem::path(step_dir).filename().string());
  if (named >= 0 && named != m.step)
    throw_error<data_error>(
        "{}: manifest.step = {}; expected {} (the directory's name: a manifest of another "
        "checkpoint)",
        path, m.step, named);
  return m;
}

HETMESH_COMPILED checkpoint_reader::checkpoint_reader(const std::string& dir)
    : dir_(checkpoint_step_dir(dir)) {
  manifest_ = read_checkpoint_manifest(dir_);
  index_ = index_manifest(manifest_, dir_ + "/" + std::string(checkpoint_manifest_name));
  std::set<std::string> listed{std::string(checkpoint_manifest_name)};
  for (const auto& f : manifest_.files) listed.insert(f.name);
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    if (!listed.contains(e.path().filename().string()))
      throw_error<data_error>(
          "checkpoint '{}' holds '{}', which the manifest does not list; expected only {} "
          "and the shard files",
          dir_, e.path().filename().string(), checkpoint_manifest_name);
  for (std::size_t r = 0; r < manifest_.files.size(); ++r) verify_file(r);
  for (const auto& b : manifest_.blobs) {
    std::vector<std::byte> bytes(static_cast<std::size_t>(b.bytes));
    const auto f = open_regular_file(dir_ + "/" + b.file, checkpoint_max_size, "checkpoint shard");
    detail::ckpt_pread(f.fd(), f.path(), b.offset, bytes.size(), bytes.data());
    blobs_.emplace(b.name, std::move(bytes));
  }
}

HETMESH_COMPILED void checkpoint_reader::verify_file(std::size_t r) {
  const auto& e = manifest_.files[r];
  const auto f = open_regular_file(dir_ + "/" + e.name, checkpoint_max_size, "checkpoint shard");
  if (f.size() != e.bytes)
    throw_error<data_error>("checkpoint shard '{}' has {} bytes; expected {} (manifest files[{}].bytes)",
                            f.path(), f.size(), e.bytes, r);
  unsigned char head[checkpoint_shard_header_bytes];
  detail::ckpt_pread(f.fd(), f.path(), 0, sizeof head, head);
  std::int64_t hv[3] = {};
  std::memcpy(hv, head + sizeof detail::shard_magic, sizeof hv);
  if (std::memcmp(head, detail::shard_magic, sizeof detail::shard_magic) != 0 ||
      static_cast<std::uint64_t>(hv[0]) != manifest_.id || hv[1] != manifest_.step || hv[2] != e.rank)
    throw_error<data_error>(
        "checkpoint shard '{}': header of checkpoint {} step {} rank {}; expected checkpoint "
        "{} step {} rank {} (manifest id, step, files[{}].rank: a shard of another checkpoint)",
        f.path(), checksum_text(static_cast<std::uint64_t>(hv[0])), hv[1], hv[2], checksum_text(manifest_.id),
        manifest_.step, e.rank, r);
  hasher h;
  std::vector<unsigned char> buf(std::size_t{1} << 20);
  for (std::int64_t at = 0; at < e.bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::int64_t>(e.bytes - at, std::ssize(buf)));
    detail::ckpt_pread(f.fd(), f.path(), at, n, buf.data());
    h.add_bytes(buf.data(), n);
    at += static_cast<std::int64_t>(n);
  }
  if (h.digest() != e.checksum)
    throw_error<data_error>(
        "checkpoint shard '{}': checksum {}; expected {} (manifest files[{}].checksum: the "
        "file was changed or damaged)",
        f.path(), checksum_text(h.digest()), checksum_text(e.checksum), r);
}

HETMESH_COMPILED void checkpoint_reader::fill_bytes(const piece_key& k, std::size_t n, void* out) const {
  check_piece_key<invalid_argument>(
      k, hetmesh::format("checkpoint load of tensor {} field '{}': the request", k.tensor, k.field));
  if (static_cast<std::int64_t>(n) != k.count)
    throw_error<invalid_argument>(
        "checkpoint load of tensor {} field '{}': {} elements to fill; expected the "
        "key's count {}",
        k.tensor, k.field, n, k.count);
  const auto it = index_.find({k.tensor, k.field});
  if (it == index_.end())
    throw_error<data_error>(
        "checkpoint '{}': tensor {} field '{}' is not in it; expected the manifest to list it", dir_,
        k.tensor, k.field);
  const auto& f = it->second;
  if (f.full != k.full)
    throw_error<data_error>(
        "checkpoint '{}': tensor {} field '{}' has {} elements; expected {} (the loading "
        "model's size)",
        dir_, k.tensor, k.field, f.full, k.full);
  const auto elt = static_cast<std::size_t>(checkpoint_dtype_bytes(manifest_.dtype));
  std::vector<unsigned char> staging(n * elt);
  std::map<std::string, regular_file> files;
  // The request's runs: whole blocks and row splits are one run; a column split's rows are one each.
  const std::int64_t lc =
      k.block.rows == 0 || k.block.axis == 0 || k.block.parts == 1 ? 0 : k.block.cols / k.block.parts;
  for (std::int64_t i = 0; i < k.count;) {
    const std::int64_t at = k.begin + i, g = k.block.global(at);
    std::int64_t run = lc == 0 ? k.count - i : std::min(lc - at % lc, k.count - i);
    const auto sp = split_place::of(f.split, f.full, g);
    const auto& ps = f.parts[static_cast<std::size_t>(sp.part)];
    auto pi =
        std::upper_bound(ps.begin(), ps.end(), std::pair{sp.local, std::numeric_limits<std::size_t>::max()});
    const auto& p = manifest_.pieces[std::prev(pi)->second];
    run = std::min({run, sp.run, p.key.begin + p.key.count - sp.local});
    auto& file = files[p.file];
    if (file.fd() < 0) {
      file = open_regular_file(dir_ + "/" + p.file, checkpoint_max_size, "checkpoint shard");
      const auto& e = *std::find_if(manifest_.files.begin(), manifest_.files.end(),
                                    [&](const checkpoint_file& x) { return x.name == p.file; });
      if (file.size() != e.bytes)
        throw_error<data_error>(
            "checkpoint shard '{}' has {} bytes; expected {} (it changed since it was verified)", file.path(),
            file.size(), e.bytes);
    }
    detail::ckpt_pread(
        file.fd(), file.path(), p.offset + (sp.local - p.key.begin) * static_cast<std::int64_t>(elt),
        static_cast<std::size_t>(run) * elt, staging.data() + static_cast<std::size_t>(i) * elt);
    i += run;
  }
  if (n > 0) std::memcpy(out, staging.data(), staging.size());
}
#endif  // HETMESH_BODIES

}  // namespace hetmesh::train
