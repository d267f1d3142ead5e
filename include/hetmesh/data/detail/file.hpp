// SPDX-License-Identifier: Apache-2.0
// hetmesh::data::detail: POSIX file primitives the formats share: an owning descriptor, a read-only
// memory mapping, and whole-buffer writes. Every failure becomes a hetmesh::data_error that names the
// path and the system's reason, so a bad shard is reported where it is opened, not later as garbage.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "../../core/error.hpp"
#include "../../core/files.hpp"

namespace hetmesh::data::detail {

/// An owning POSIX file descriptor (move-only).
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

/// Opens `path` with `flags`; throws data_error naming the path and errno text on failure.
inline unique_fd open_file(const std::string& path, int flags, mode_t mode = 0644) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw_error<data_error>("cannot open '{}': {}", path, std::strerror(errno));
  return unique_fd(fd);
}

/// Size of an open file in bytes.
inline std::int64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_error<data_error>("cannot stat '{}': {}", path, std::strerror(errno));
  return static_cast<std::int64_t>(st.st_size);
}

/// Size of `path` in bytes, or -1 when it does not exist.
inline std::int64_t file_size_or_missing(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<std::int64_t>(st.st_size);
}

/// A read-only shared mapping of a whole file (move-only). An empty file maps to an empty span, since
/// mmap of length 0 is an error on Linux and an empty .bin is a legal (empty) dataset.
class mapped_file {
 public:
  mapped_file() = default;
  /// Maps `path`, which must be a regular file (a directory, FIFO or device is a data_error naming it:
  /// /dev/zero would map as an empty file, a FIFO would block).
  explicit mapped_file(const std::string& path, std::string_view what = "file") : path_(path) {
    regular_file file = open_regular_file(path, std::numeric_limits<std::int64_t>::max(), what);
    unique_fd fd(file.release());
    size_ = file.size();
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED)
        throw_error<data_error>("cannot mmap '{}' ({} bytes): {}", path, size_, std::strerror(errno));
      data_ = static_cast<const std::byte*>(p);
    }
  }
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return {data_, static_cast<std::size_t>(size_)};
  }
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_));
    data_ = nullptr;
    size_ = 0;
  }
  std::string path_;
  const std::byte* data_ = nullptr;
  std::int64_t size_ = 0;
};

/// Writes all of `bytes` to fd (retrying short writes and EINTR).
inline void write_all(int fd, std::span<const std::byte> bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_error<data_error>("cannot write '{}': {}", path, std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

/// Reads exactly bytes.size() bytes at `offset`; throws data_error when the file is shorter.
inline void pread_all(int fd, std::span<std::byte> bytes, std::int64_t offset, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done,
                              static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_error<data_error>("cannot read '{}' at offset {}: {}", path, offset, std::strerror(errno));
    }
    if (n == 0) {
      throw_error<data_error>("'{}' is truncated: wanted {} bytes at offset {}, the file ends after {}", path,
                              bytes.size(), offset, offset + static_cast<std::int64_t>(done));
    }
    done += static_cast<std::size_t>(n);
  }
}

/// A temporary name beside `path`, unique to this process and call ("<path>.tmp-<pid>-<n>"), so writers
/// racing on the same file (loaders building one shard index) never share a temporary.
[[nodiscard]] inline std::string temp_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

/// An output file written under a temporary name beside its final one (temp_name: same folder, so the
/// rename stays on one file system) and renamed over `path` only by commit(), after an fsync. Until
/// then a reader, or a process killed mid-write, sees the previous file or none, never half of the new
/// one; destroyed without commit() (an exception on the way), it removes the temporary. Move-only.
class atomic_file {
 public:
  atomic_file() = default;
  /// Creates the temporary for `path`; data_error naming it when that fails.
  explicit atomic_file(std::string path)
      : path_((check_output_target(path, "output"), std::move(path))),
        tmp_(temp_name(path_)),
        fd_(open_file(tmp_, O_WRONLY | O_CREAT | O_EXCL)) {}
  atomic_file(atomic_file&& o) noexcept
      : path_(std::move(o.path_)),
        tmp_(std::move(o.tmp_)),
        fd_(std::move(o.fd_)),
        done_(std::exchange(o.done_, true)) {}
  atomic_file& operator=(atomic_file&& o) noexcept {
    if (this != &o) {
      discard();
      path_ = std::move(o.path_);
      tmp_ = std::move(o.tmp_);
      fd_ = std::move(o.fd_);
      done_ = std::exchange(o.done_, true);
    }
    return *this;
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { discard(); }

  /// The descriptor of the temporary (-1 once closed).
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  /// The final path.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The temporary's path, where the bytes are until commit().
  [[nodiscard]] const std::string& temp_path() const noexcept { return tmp_; }
  /// Appends `bytes` to the temporary.
  void write(std::span<const std::byte> bytes) { write_all(fd_.get(), bytes, tmp_); }
  /// Flushes and closes the temporary (it stays under its temporary name): what a caller does before
  /// reading the file back, or before committing several files together.
  void close() {
    if (fd_.get() < 0) return;
    if (::fsync(fd_.get()) != 0) throw_error<data_error>("cannot fsync '{}': {}", tmp_, std::strerror(errno));
    fd_.reset();
  }
  /// Closes the temporary, renames it over the final path and fsyncs the folder (so the rename
  /// survives a crash).
  void commit() {
    close();
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw_error<data_error>("cannot rename '{}' to '{}': {}", tmp_, path_, std::strerror(errno));
    done_ = true;
    sync_folder_of(path_, "output");
  }

 private:
  void discard() noexcept {
    fd_.reset();
    if (!done_ && !tmp_.empty()) ::unlink(tmp_.c_str());
    done_ = true;
  }
  std::string path_{};
  std::string tmp_{};
  unique_fd fd_{};
  bool done_ = false;
};

/// Writes `bytes` to `path` atomically (atomic_file): a reader, or a process killed mid-write, never sees
/// half a file, and a failure leaves the previous file as it was.
inline void write_file_atomic(const std::string& path, std::span<const std::byte> bytes) {
  hetmesh::write_file_atomic(path,
                             std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

/// The whole content of the regular file `path` (hetmesh::read_regular_file: a directory, FIFO or
/// device, a file over `max_bytes` or one whose length changes while read is a data_error naming `what`).
inline std::string read_text(const std::string& path, std::int64_t max_bytes = large_file_bytes,
                             std::string_view what = "file") {
  return read_regular_file(path, max_bytes, what);
}

/// Little-endian loads from possibly unaligned bytes (the .idx header is 9+8+1+8+8 = 34 bytes, so its
/// arrays are not naturally aligned).
template <class T>
[[nodiscard]] inline T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace hetmesh::data::detail
