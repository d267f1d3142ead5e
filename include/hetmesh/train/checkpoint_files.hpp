// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: writing a checkpoint's files (docs/checkpoint.md). Each rank writes its shard file and
// then a small index of it into the save's temporary directory; one rank (the committer) waits for every
// index, merges them into the manifest, and commits: manifest, fsync, rename of the temporary directory to
// step-NNNNNNNN, fsync, `latest` moved (temporary, fsync, rename), old steps pruned. A kill at any point
// leaves the previous checkpoint and `latest` whole. No function here communicates: the collective front
// end (train/checkpoint.hpp) decides who writes what.
//
// Fault injection (one place): HETMESH_CKPT_KILL_AT=STEP:OP raises SIGKILL right before the OP-th file
// operation (1-based, counted per process) of the save of step STEP; HETMESH_CKPT_TRACE prints each
// operation with its number on stderr. Read at every operation, so a test may set it in a child process.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../core/json_file.hpp"
#include "checkpoint_json.hpp"
#include "checkpoint_piece.hpp"

namespace hetmesh::train {

/// The name of step `step`'s directory under a checkpoint root: "step-" and at least 8 digits.
[[nodiscard]] inline std::string checkpoint_step_name(std::int64_t step) {
  return hetmesh::format("step-{:08}", step);
}

/// The step a directory name holds ("step-" and 1 to 18 digits), or -1 when it is not a step's name. Pure.
[[nodiscard]] constexpr std::int64_t checkpoint_step_of(std::string_view name) noexcept {
  constexpr std::string_view prefix = "step-";
  if (!name.starts_with(prefix) || name.size() <= prefix.size() || name.size() > prefix.size() + 18)
    return -1;
  std::int64_t s = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    s = 10 * s + (c - '0');
  }
  return s;
}

namespace detail {

/// The fault-injection point (see the file comment): counts the operation, traces it, and raises SIGKILL
/// at the one HETMESH_CKPT_KILL_AT names. A malformed variable is an invalid_argument.
HETMESH_COMPILED void ckpt_before_op(std::int64_t step, std::string_view what, const std::string& path);

/// A file being written: created (truncated), written with its bytes hashed, then fsynced and closed by
/// finish(). Each of these is a counted operation. Errors: data_error naming the path and errno's text.
class ckpt_out {
 public:
  /// Creates `path` for the save of `step`.
  HETMESH_COMPILED ckpt_out(std::string path, std::int64_t step);
  ckpt_out(const ckpt_out&) = delete;
  ckpt_out& operator=(const ckpt_out&) = delete;
  /// Closes the file if finish() did not.
  HETMESH_COMPILED ~ckpt_out();
  /// Appends `n` bytes.
  HETMESH_COMPILED void write(const void* data, std::size_t n);
  /// fsync and close.
  HETMESH_COMPILED void finish();
  /// Bytes written so far.
  [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_; }
  /// The hasher digest of the bytes written.
  [[nodiscard]] std::uint64_t checksum() const noexcept { return hash_.digest(); }

 private:
  std::string path_;
  std::int64_t step_ = 0;
  int fd_ = -1;
  std::int64_t bytes_ = 0;
  hasher hash_{};
};

/// Writes `text` to `path` (create, write, fsync, close). Counted operations.
HETMESH_COMPILED void ckpt_write_text(const std::string& path, std::string_view text, std::int64_t step);

/// fsyncs the directory `dir` (a counted operation).
HETMESH_COMPILED void ckpt_fsync_dir(const std::string& dir, std::int64_t step);

/// Renames `from` to `to` (a counted operation); data_error naming both on failure.
HETMESH_COMPILED void ckpt_rename(const std::string& from, const std::string& to, std::int64_t step);

/// The magic of a shard file's header.
inline constexpr char shard_magic[8] = {'H', 'M', 'C', 'K', 'S', 'H', 'R', 'D'};

/// Index file of rank `rank` in a save's temporary directory.
[[nodiscard]] inline std::string ckpt_index_name(int rank) {
  return hetmesh::format("index-{:05}.json", rank);
}
/// Error marker of rank `rank` (its write failed; the text says why).
[[nodiscard]] inline std::string ckpt_error_name(int rank) {
  return hetmesh::format("error-{:05}.txt", rank);
}

}  // namespace detail

/// What one rank writes into a save's temporary directory `tmp` (created with its parents if missing): its
/// shard file (header, then the pieces and
/// blobs it owns, `own_piece[i]`/`own_blob[k]` for the i-th piece and the k-th blob in name order), then
/// its index file (the shard's size and checksum, its pieces and blobs with offsets, the rank's counters).
/// The index is written last: its presence means the shard is whole. Not collective; O(bytes).
/// Errors: data_error naming the file and the operation.
template <class T>
void write_checkpoint_part(const std::string& tmp, int rank, std::int64_t step, std::uint64_t id,
                           const rank_snapshot<T>& s, const std::vector<char>& own_piece,
                           const std::vector<char>& own_blob) {
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  if (ec) throw_error<data_error>("checkpoint: cannot create the directory '{}': {}", tmp, ec.message());
  const std::string name = checkpoint_shard_name(rank);
  detail::ckpt_out out(tmp + "/" + name, step);
  const std::int64_t header[3] = {static_cast<std::int64_t>(id), step, rank};
  out.write(detail::shard_magic, sizeof detail::shard_magic);
  out.write(header, sizeof header);
  nlohmann::json index = {{"rank", rank},
                          {"file", name},
                          {"dtype", checkpoint_dtype<T>()},
                          {"pieces", nlohmann::json::array()},
                          {"blobs", nlohmann::json::array()},
                          {"counters", nlohmann::json::object()}};
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    if (own_piece[i] == 0) continue;
    const auto& p = s.pieces[i];
    index["pieces"].push_back(piece_entry_to_json({p.key, name, out.bytes()}));
    out.write(p.data.data(), p.data.size() * sizeof(T));
  }
  std::size_t k = 0;
  for (const auto& [bname, bytes] : s.blobs) {
    if (own_blob[k++] == 0) continue;
    index["blobs"].push_back({{"name", bname},
                              {"file", name},
                              {"offset", out.bytes()},
                              {"bytes", static_cast<std::int64_t>(bytes.size())}});
    out.write(bytes.data(), bytes.size());
  }
  out.finish();
  for (const auto& [cname, v] : s.counters) index["counters"][cname] = v;
  index["bytes"] = out.bytes();
  index["checksum"] = checksum_text(out.checksum());
  // Renamed into place whole: rank 0's asynchronous commit takes the index once it exists.
  const std::string at = tmp + "/" + detail::ckpt_index_name(rank);
  detail::ckpt_write_text(at + ".part", index.dump(), step);
  detail::ckpt_rename(at + ".part", at, step);
}

/// What the committing rank needs to finish a save.
struct checkpoint_commit {
  std::string root;        ///< the checkpoint root
  std::string tmp;         ///< the save's temporary directory (under root)
  std::int64_t step = 0;   ///< the step saved
  std::uint64_t id = 0;    ///< the checkpoint's id
  int ranks = 0;           ///< ranks writing
  std::string dtype;       ///< "float32" / "float64"
  std::string layout;      ///< the caller's layout description
  int keep = 2;            ///< step directories to keep (newest first; `latest`'s always)
  double timeout_s = 600;  ///< how long to wait for the ranks' index files
};

/// Commits a save (the committing rank only, after or while the others write): waits until every rank's
/// index file is there (a rank's error marker, or `timeout_s` without it, is a data_error naming the rank),
/// merges them into the manifest, checks it (index_manifest), writes manifest.json, removes the index files,
/// fsyncs, renames the directory to step-NNNNNNNN (an existing one of that step is replaced), fsyncs the
/// root, moves `latest` (temporary, fsync, rename, fsync), and removes all but the newest `keep` step
/// directories and any other save's leftover temporary directory. Returns the step directory. Not
/// collective.
[[nodiscard]] HETMESH_COMPILED std::string commit_checkpoint(const checkpoint_commit& c);

/// Removes from `root` the step directories but the newest `keep` and the one `latest` names, and the
/// temporary directories of saves other than `except` (a killed save's). Best effort: what cannot be
/// removed is left (and tried again by the next commit). Returns the names removed. Not collective.
HETMESH_COMPILED std::vector<std::string> prune_checkpoints(const std::string& root, int keep,
                                                            const std::string& except = {});

// --- definitions -----------------------------------------------------------------------------------------

#if HETMESH_BODIES
namespace detail {

HETMESH_COMPILED void ckpt_before_op(std::int64_t step, std::string_view what, const std::string& path) {
  // Saves of one process follow each other: the first operation of another step's save starts afresh.
  static std::atomic<std::int64_t> current{-1}, ops{0};
  static std::mutex m;
  std::int64_t n = 0;
  {
    const std::lock_guard<std::mutex> lock(m);
    if (current.load() != step) {
      current = step;
      ops = 0;
    }
    n = ++ops;
  }
  if (std::getenv("HETMESH_CKPT_TRACE") != nullptr)
    fmt::print(stderr, "checkpoint save of step {}: op {}: {} {}\n", step, n, what, path);
  const char* kill = std::getenv("HETMESH_CKPT_KILL_AT");
  if (kill == nullptr || *kill == '\0') return;
  const std::string_view v(kill);
  std::int64_t ks = -1, kop = -1;
  const char* end = v.data() + v.size();
  const auto a = std::from_chars(v.data(), end, ks);
  const bool ok = a.ec == std::errc() && a.ptr != end && *a.ptr == ':' &&
                  std::from_chars(a.ptr + 1, end, kop).ptr == end && ks >= 0 && kop >= 1;
  if (!ok)
    throw_error<invalid_argument>(
        "HETMESH_CKPT_KILL_AT = '{}'; expected STEP:OP (a step >= 0, an operation >= 1)", v);
  if (ks == step && kop == n) ::raise(SIGKILL);
}

[[noreturn]] inline void ckpt_fail_errno(const char* what, const std::string& path) {
  throw_error<data_error>("checkpoint: cannot {} '{}': {}", what, path, std::strerror(errno));
}

HETMESH_COMPILED ckpt_out::ckpt_out(std::string path, std::int64_t step)
    : path_(std::move(path)), step_(step) {
  ckpt_before_op(step_, "create", path_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ckpt_fail_errno("create", path_);
}

HETMESH_COMPILED ckpt_out::~ckpt_out() {
  if (fd_ >= 0) ::close(fd_);
}

HETMESH_COMPILED void ckpt_out::write(const void* data, std::size_t n) {
  if (n == 0) return;
  ckpt_before_op(step_, "write", path_);
  const auto* p = static_cast<const unsigned char*>(data);
  hash_.add_bytes(p, n);
  for (std::size_t done = 0; done < n;) {
    const auto k = ::write(fd_, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) ckpt_fail_errno("write", path_);
    done += static_cast<std::size_t>(k);
  }
  bytes_ += static_cast<std::int64_t>(n);
}

HETMESH_COMPILED void ckpt_out::finish() {
  ckpt_before_op(step_, "fsync", path_);
  if (::fsync(fd_) != 0) ckpt_fail_errno("fsync", path_);
  ckpt_before_op(step_, "close", path_);
  if (::close(std::exchange(fd_, -1)) != 0) ckpt_fail_errno("close", path_);
}

HETMESH_COMPILED void ckpt_write_text(const std::string& path, std::string_view text, std::int64_t step) {
  ckpt_out out(path, step);
  out.write(text.data(), text.size());
  out.finish();
}

HETMESH_COMPILED void ckpt_fsync_dir(const std::string& dir, std::int64_t step) {
  ckpt_before_op(step, "fsync directory", dir);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ckpt_fail_errno("open the directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) ckpt_fail_errno("fsync the directory", dir);
}

HETMESH_COMPILED void ckpt_rename(const std::string& from, const std::string& to, std::int64_t step) {
  ckpt_before_op(step, "rename", to);
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw_error<data_error>("checkpoint: cannot rename '{}' to '{}': {}", from, to, std::strerror(errno));
}

/// Waits for every rank's index file in c.tmp and returns them parsed (see commit_checkpoint).
inline std::vector<nlohmann::json> ckpt_wait_indexes(const checkpoint_commit& c) {
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.timeout_s);
  std::vector<nlohmann::json> out(static_cast<std::size_t>(c.ranks));
  for (int r = 0; r < c.ranks; ++r) {
    const std::string index = c.tmp + "/" + ckpt_index_name(r), error = c.tmp + "/" + ckpt_error_name(r);
    std::error_code ec;
    while (!fs::exists(index, ec)) {
      if (fs::exists(error, ec))
        throw_error<data_error>("checkpoint save of step {}: rank {} failed: {}", c.step, r,
                                read_regular_file(error, 1 << 16, "checkpoint error marker"));
      if (std::chrono::steady_clock::now() > deadline)
        throw_error<timeout_error>(
            "checkpoint save of step {}: rank {}'s index '{}' did not appear within {} s; "
            "expected every rank to write its shard",
            c.step, r, index, c.timeout_s);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    out[static_cast<std::size_t>(r)] = read_json_file(index, "checkpoint rank index");
  }
  return out;
}

/// The manifest of a save from its ranks' index files (checked by index_manifest).
inline checkpoint_manifest ckpt_merge_indexes(const checkpoint_commit& c,
                                              const std::vector<nlohmann::json>& ix) {
  checkpoint_manifest m;
  m.library =
      hetmesh::format("{}.{}.{}", HETMESH_VERSION_MAJOR, HETMESH_VERSION_MINOR, HETMESH_VERSION_PATCH);
  m.step = c.step;
  m.id = c.id;
  m.dtype = c.dtype;
  m.layout = c.layout;
  m.ranks = c.ranks;
  std::map<std::int64_t, std::pair<std::int64_t, std::set<std::string>>> tensors;
  for (int r = 0; r < c.ranks; ++r) {
    const auto& j = ix[static_cast<std::size_t>(r)];
    const std::string where = c.tmp + "/" + ckpt_index_name(r);
    const ckpt_json rd{where};
    if (rd.string(j, "dtype", "index") != c.dtype)
      throw_error<data_error>("{}: dtype {}; expected {} (rank 0's)", where, j["dtype"].dump(), c.dtype);
    m.files.push_back({rd.string(j, "file", "index"), r,
                       rd.integer(j, "bytes", "index", 0, checkpoint_max_size),
                       rd.hex64(j, "checksum", "index")});
    const auto& ps = rd.array(j, "pieces", "index");
    for (std::size_t i = 0; i < ps.size(); ++i) {
      auto p = piece_entry_from_json(ps[i], where, hetmesh::format("index.pieces[{}]", i));
      auto& t = tensors[p.key.tensor];
      t.first = p.key.full;
      t.second.insert(p.key.field);
      m.pieces.push_back(std::move(p));
    }
    const auto& bs = rd.array(j, "blobs", "index");
    for (std::size_t i = 0; i < bs.size(); ++i)
      m.blobs.push_back({rd.string(bs[i], "name", "index.blobs"), rd.string(bs[i], "file", "index.blobs"),
                         rd.integer(bs[i], "offset", "index.blobs", 0, checkpoint_max_size),
                         rd.integer(bs[i], "bytes", "index.blobs", 0, checkpoint_max_size)});
    const auto& cs = rd.member(j, "counters", "index");
    for (auto it = cs.begin(); cs.is_object() && it != cs.end(); ++it)
      m.counters[it.key()] =
          rd.integer(cs, it.key().c_str(), "index.counters", std::numeric_limits<std::int64_t>::min(),
                     std::numeric_limits<std::int64_t>::max());
  }
  for (const auto& [id, t] : tensors) m.tensors.push_back({id, t.first, {t.second.begin(), t.second.end()}});
  (void)index_manifest(m, c.tmp + "/" + std::string(checkpoint_manifest_name));
  return m;
}

}  // namespace detail

HETMESH_COMPILED std::string commit_checkpoint(const checkpoint_commit& c) {
  namespace fs = std::filesystem;
  const auto m = detail::ckpt_merge_indexes(c, detail::ckpt_wait_indexes(c));
  detail::ckpt_write_text(c.tmp + "/" + std::string(checkpoint_manifest_name), manifest_to_json(m).dump(1),
                          c.step);
  for (int r = 0; r < c.ranks; ++r) {
    std::error_code ec;
    if (!fs::remove(c.tmp + "/" + detail::ckpt_index_name(r), ec) || ec)
      throw_error<data_error>("checkpoint: cannot remove '{}/{}': {}", c.tmp, detail::ckpt_index_name(r),
                              ec ? ec.message() : "it is gone");
  }
  detail::ckpt_fsync_dir(c.tmp, c.step);
  const std::string name = checkpoint_step_name(c.step), final_dir = c.root + "/" + name;
  const std::string old = c.root + "/.old-" + name + "-" + checksum_text(c.id);
  std::error_code ec;
  const bool replace = fs::exists(final_dir, ec);
  if (replace) detail::ckpt_rename(final_dir, old, c.step);
  detail::ckpt_rename(c.tmp, final_dir, c.step);
  detail::ckpt_fsync_dir(c.root, c.step);
  const std::string latest = c.root + "/latest", latest_tmp = latest + ".tmp";
  detail::ckpt_write_text(latest_tmp, name + "\n", c.step);
  detail::ckpt_rename(latest_tmp, latest, c.step);
  detail::ckpt_fsync_dir(c.root, c.step);
  std::error_code ignored;  // the step is committed: what is left to tidy is left for the next commit
  if (replace) fs::remove_all(old, ignored);
  (void)prune_checkpoints(c.root, c.keep);
  return final_dir;
}

HETMESH_COMPILED std::vector<std::string> prune_checkpoints(const std::string& root, int keep,
                                                            const std::string& except) {
  namespace fs = std::filesystem;
  std::string latest;
  {
    std::ifstream in(root + "/latest");
    std::getline(in, latest);
  }
  std::vector<std::pair<std::int64_t, std::string>> steps;
  std::vector<std::string> removed;
  std::error_code ec;  // best effort: a directory that cannot be removed now is tried again next time
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory(ec)) continue;
    if ((n.starts_with(".tmp-") || n.starts_with(".old-")) && n != except) {
      if (fs::remove_all(e.path(), ec) != static_cast<std::uintmax_t>(-1)) removed.push_back(n);
    } else if (const auto s = checkpoint_step_of(n); s >= 0) {
      steps.emplace_back(s, n);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < steps.size(); ++i)
    if (steps[i].second != latest) {
      if (fs::remove_all(root + "/" + steps[i].second, ec) != static_cast<std::uintmax_t>(-1))
        removed.push_back(steps[i].second);
    }
  return removed;
}
#endif  // HETMESH_BODIES

}  // namespace hetmesh::train
