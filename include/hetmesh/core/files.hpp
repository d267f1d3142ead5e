// SPDX-License-Identifier: Apache-2.0
// hetmesh: the one safe way in and out for files that cross a trust boundary (issue 37).
//  - read_regular_file: reads a regular file only. A directory, FIFO, socket or device is refused by
//    name before it is opened (a FIFO would block forever, /dev/zero never ends, a directory reads as
//    "basic_filebuf::underflow"); the file is opened with O_NONBLOCK, checked again on its descriptor,
//    and refused above a size limit before anything is allocated. A file whose length changes while it is
//    read (a /proc or /sys file, which reports 0 bytes) is refused too.
//  - write_file_atomic: writes a temporary beside the target, fsyncs it, renames it over the target and
//    fsyncs the folder. Any failure (a read-only folder, a target that is a folder or a device, a full
//    disk) throws naming the path, removes the temporary and leaves an earlier file of that name intact.
// Errors are hetmesh::data_error naming the path, what the file was for, what it is and what was expected.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <istream>
#include <memory>
#include <streambuf>
#include <string>
#include <string_view>
#include <utility>

#include "../config.hpp"
#include "error.hpp"

namespace hetmesh {

/// The size limit of readers whose files are small by nature (configurations, mixtures, checkpoints of
/// the data plane, workloads' JSON): 64 MiB.
inline constexpr std::int64_t small_file_bytes = std::int64_t{64} << 20;

/// The size limit of readers of bulk data read whole into memory (workload lists, converter members):
/// 1 GiB.
inline constexpr std::int64_t large_file_bytes = std::int64_t{1} << 30;

/// What a file of mode `mode` is, in words ("a directory", "a FIFO (named pipe)", ...), for errors.
[[nodiscard]] HETMESH_COMPILED std::string_view file_kind_name(mode_t mode) noexcept;

/// A regular file opened for reading (move-only; closes its descriptor). Obtained from
/// open_regular_file, which has checked its kind and size.
class regular_file {
 public:
  /// No file.
  regular_file() = default;
  /// Takes ownership of `fd`, a regular file of `size` bytes at `path`.
  regular_file(int fd, std::int64_t size, std::string path) noexcept
      : fd_(fd), size_(size), path_(std::move(path)) {}
  /// Moves the descriptor out of `o`.
  regular_file(regular_file&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), size_(o.size_), path_(std::move(o.path_)) {}
  /// Closes this descriptor and moves `o`'s in.
  regular_file& operator=(regular_file&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      size_ = o.size_;
      path_ = std::move(o.path_);
    }
    return *this;
  }
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  /// Closes the descriptor.
  ~regular_file() { close(); }

  /// The descriptor (-1 when none).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// The size in bytes when opened (fstat).
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  /// The path it was opened by.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Gives up ownership: returns the descriptor, which the caller closes.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

 private:
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::string path_{};
};

namespace detail {
/// data_error "WHAT 'PATH' is KIND; expected a regular file" when `st` is not a regular file, and
/// "WHAT 'PATH' has N bytes; expected at most MAX bytes" when it is larger than `max_bytes`.
HETMESH_COMPILED void check_regular(const struct stat& st, const std::string& path, std::int64_t max_bytes,
                                    std::string_view what);
}  // namespace detail

/// Opens `path` for reading if it is a regular file of at most `max_bytes` bytes. The kind is checked by
/// stat before opening (so a FIFO is never opened), then again by fstat on the descriptor, which is
/// opened O_NONBLOCK (a FIFO swapped in between does not block either). Throws data_error naming `what`
/// (the file's role: "workload file", "mixture"), the path, its kind or size, and what was expected.
/// Not collective; O(1).
[[nodiscard]] HETMESH_COMPILED regular_file open_regular_file(const std::string& path, std::int64_t max_bytes,
                                                              std::string_view what);

/// The whole content of the regular file `path` (see open_regular_file for what is refused). The file
/// must hold exactly the bytes its size says: one that ends early or goes on past it (a /proc or /sys
/// file reports 0 bytes) is a data_error. Not collective; O(size).
[[nodiscard]] HETMESH_COMPILED std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                                                             std::string_view what);

/// An input stream over a regular file opened by open_regular_file (refusing a directory, FIFO, socket,
/// device or a file over the limit): for line-oriented readers (length lists, workloads, JSONL) that
/// stream a large file rather than read it whole. Reads in 64 KiB blocks; a read error is a data_error.
class regular_file_stream : public std::istream {
 public:
  /// Opens `path` as open_regular_file(path, max_bytes, what) does (data_error on refusal).
  regular_file_stream(const std::string& path, std::int64_t max_bytes, std::string_view what)
      : std::istream(nullptr), buf_(std::make_unique<buffer>(open_regular_file(path, max_bytes, what))) {
    rdbuf(buf_.get());
  }
  /// The file's size when opened.
  [[nodiscard]] std::int64_t size() const noexcept { return buf_->file.size(); }

 private:
  struct buffer : std::streambuf {
    explicit buffer(regular_file f) : file(std::move(f)) {}
    int_type underflow() override {
      for (;;) {
        const ssize_t n = ::read(file.fd(), block, sizeof block);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_error<data_error>("cannot read '{}': {}", file.path(), std::strerror(errno));
        if (n == 0) return traits_type::eof();
        setg(block, block, block + n);
        return traits_type::to_int_type(block[0]);
      }
    }
    regular_file file;
    char block[1 << 16]{};
  };
  std::unique_ptr<buffer> buf_;
};

namespace detail {
/// "<path>.tmp-<pid>-<n>": a temporary beside `path`, unique to this process and call.
[[nodiscard]] HETMESH_COMPILED std::string atomic_temp_name(const std::string& path);

/// The folder of `path` ("." when it names none), for the fsync after a rename.
[[nodiscard]] HETMESH_COMPILED std::string folder_of(const std::string& path);

/// Writes all of `bytes` to `fd`, retrying short writes and EINTR; returns errno (0 on success).
[[nodiscard]] HETMESH_COMPILED int write_fully(int fd, std::string_view bytes) noexcept;
}  // namespace detail

/// Fsyncs the folder holding `path`, so that a rename into it survives a crash. A folder that cannot be
/// opened (no read permission) is skipped, since the file is there all the same; a failed fsync of an
/// opened folder is a data_error naming `what` and the path. O(1).
HETMESH_COMPILED void sync_folder_of(const std::string& path, std::string_view what);

/// Refuses an output target that exists and is not a regular file (a folder, a device such as
/// /dev/full, a FIFO): data_error naming `what`, the path and its kind. A new name passes. O(1).
HETMESH_COMPILED void check_output_target(const std::string& path, std::string_view what);

/// Writes `bytes` to `path` crash-consistently: a temporary in the same folder is written, fsynced and
/// renamed over `path`, then the folder is fsynced. A reader, or a process killed at any point, sees the
/// earlier file or the new one whole. Throws data_error naming `what`, the path and the system's reason
/// on any failure (the target a folder or a device, a read-only folder, a full disk); the temporary is
/// removed and an earlier file of the same name is left as it was. Not collective; O(bytes).
HETMESH_COMPILED void write_file_atomic(const std::string& path, std::string_view bytes,
                                        std::string_view what = "output");

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED std::string_view file_kind_name(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace hetmesh

namespace hetmesh::detail {

HETMESH_COMPILED void check_regular(const struct stat& st, const std::string& path, std::int64_t max_bytes,
                                    std::string_view what) {
  if (!S_ISREG(st.st_mode))
    throw_error<data_error>("{} '{}' is {}; expected a regular file", what, path, file_kind_name(st.st_mode));
  if (static_cast<std::int64_t>(st.st_size) > max_bytes)
    throw_error<data_error>("{} '{}' has {} bytes; expected at most {} bytes (is this the right file?)", what,
                            path, static_cast<std::int64_t>(st.st_size), max_bytes);
}

}  // namespace hetmesh::detail

namespace hetmesh {

HETMESH_COMPILED regular_file open_regular_file(const std::string& path, std::int64_t max_bytes,
                                                std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw_error<data_error>("cannot open {} '{}': {}; expected a readable regular file", what, path,
                            std::strerror(errno));
  detail::check_regular(st, path, max_bytes, what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw_error<data_error>("cannot open {} '{}': {}; expected a readable regular file", what, path,
                            std::strerror(errno));
  regular_file f(fd, 0, path);
  if (::fstat(fd, &st) != 0)
    throw_error<data_error>("cannot stat {} '{}': {}", what, path, std::strerror(errno));
  detail::check_regular(st, path, max_bytes, what);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return regular_file(f.release(), static_cast<std::int64_t>(st.st_size), path);
}

HETMESH_COMPILED std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                                               std::string_view what) {
  const regular_file f = open_regular_file(path, max_bytes, what);
  std::string s(static_cast<std::size_t>(f.size()), '\0');
  std::size_t done = 0;
  char extra = 0;
  for (;;) {
    char* to = done < s.size() ? s.data() + done : &extra;
    const std::size_t want = done < s.size() ? s.size() - done : 1;
    const ssize_t n = ::read(f.fd(), to, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_error<data_error>("cannot read {} '{}': {}", what, path, std::strerror(errno));
    }
    if (n == 0) break;
    if (done >= s.size())
      throw_error<data_error>(
          "{} '{}' grew past the {} bytes its size says while it was read; expected a stable regular "
          "file (not a /proc or /sys file, not a file being written)",
          what, path, s.size());
    done += static_cast<std::size_t>(n);
  }
  if (done < s.size())
    throw_error<data_error>(
        "{} '{}' ended after {} of its {} bytes while it was read; expected a stable file", what, path, done,
        s.size());
  return s;
}

}  // namespace hetmesh

namespace hetmesh::detail {

HETMESH_COMPILED std::string atomic_temp_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

HETMESH_COMPILED std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

HETMESH_COMPILED int write_fully(int fd, std::string_view bytes) noexcept {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

}  // namespace hetmesh::detail

namespace hetmesh {

HETMESH_COMPILED void sync_folder_of(const std::string& path, std::string_view what) {
  const std::string dir = detail::folder_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  const int rc = ::fsync(dfd);
  const int e = errno;
  ::close(dfd);
  if (rc != 0 && e != EINVAL)
    throw_error<data_error>("cannot write {} '{}': syncing its folder '{}' failed: {}", what, path, dir,
                            std::strerror(e));
}

HETMESH_COMPILED void check_output_target(const std::string& path, std::string_view what) {
  struct stat st {};
  if (path.empty()) throw_error<data_error>("{}: an empty path; expected a file name", what);
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw_error<data_error>("cannot write {} '{}': it is {}; expected a regular file or a new name", what,
                            path, file_kind_name(st.st_mode));
}

HETMESH_COMPILED void write_file_atomic(const std::string& path, std::string_view bytes,
                                        std::string_view what) {
  check_output_target(path, what);
  const std::string tmp = detail::atomic_temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw_error<data_error>("cannot write {} '{}': creating '{}' failed: {}; expected a writable folder",
                            what, path, tmp, std::strerror(errno));
  const char* step = "writing";
  int err = detail::write_fully(fd, bytes);
  if (err == 0 && ::fsync(fd) != 0) {
    err = errno;
    step = "syncing";
  }
  if (::close(fd) != 0 && err == 0) {
    err = errno;
    step = "closing";
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    step = "renaming";
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw_error<data_error>(
        "cannot write {} '{}': {} {} bytes failed: {}; the earlier file, if any, is intact", what, path, step,
        bytes.size(), std::strerror(err));
  }
  sync_folder_of(path, what);
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
