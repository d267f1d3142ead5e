// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the safe way in and out for files (core/files.hpp, core/json_file.hpp read_json_file).
// The file layer is a real scratch folder on tmpfs, driven by the input as a script of at most 32
// operations, each an op byte and its arguments:
//   0 slot len bytes...      a regular file of `len` bytes      4 path limit          read_regular_file
//   1 slot                   a FIFO                            5 path limit          regular_file_stream
//   2 slot                   a folder                          6 path len fsize b..  write_file_atomic
//   3 slot target            a symbolic link to another slot,  7 path limit          read_json_file
//                            /dev/null, /dev/zero, /dev/full, /proc/self/stat or a missing name
// Paths are the four slots, a name under slot a, the scratch folder itself, the empty path, and (to
// read only) /dev/null, /dev/zero, /dev/full and /proc/self/stat. Writes stay inside the scratch folder
// (a link to a device is replaced, never the device). `fsize` > 0 runs the write under RLIMIT_FSIZE of
// that many bytes: a full disk, injected, which fails the write part-way.
// The contract checked against the kernel's own view (stat, and the bytes read back with std::ifstream):
//  - a read returns exactly the file's bytes when it is a regular file within the limit (a /proc file
//    may be refused), and otherwise throws data_error naming the path; it never blocks (libFuzzer's
//    -timeout catches a FIFO that was opened);
//  - write_file_atomic succeeds onto a missing name or a regular file in a folder (the new bytes are
//    there whole), fails onto anything else or past the size limit with data_error naming the path, in
//    which case the target is as before (kind and bytes); no temporary is ever left behind.
// Any other exception, a crash or a sanitizer report is a finding.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <hetmesh/core/files.hpp>
#include <hetmesh/core/json_file.hpp>

#include "common.hpp"

namespace {

namespace fs = std::filesystem;

/// The input, read a byte at a time (0 past its end).
struct script {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  [[nodiscard]] bool done() const { return pos >= size; }
  std::uint8_t next() { return pos < size ? data[pos++] : 0; }
  std::string bytes(std::size_t n) {
    n = std::min(n, size - std::min(pos, size));
    std::string s(reinterpret_cast<const char*>(data) + pos, n);
    pos += n;
    return s;
  }
};

const std::string& root() {
  static const std::string dir = hetmesh::fuzz::scratch("files");
  return dir;
}

constexpr std::array<const char*, 4> slots{"a", "b", "c", "d"};

/// A path to act on: byte % (write ? 7 : 11).
std::string pick_path(std::uint8_t b, bool write) {
  const unsigned k = b % (write ? 7u : 11u);
  if (k < 4) return root() + "/" + slots[k];
  switch (k) {
    case 4:
      return root() + "/a/x";
    case 5:
      return root();
    case 6:
      return "";
    case 7:
      return "/dev/null";
    case 8:
      return "/dev/zero";
    case 9:
      return "/dev/full";
    default:
      return "/proc/self/stat";
  }
}

std::optional<std::string> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// What `p` is now, as the kernel says: missing, the kind (st_mode's type bits) and a regular file's bytes.
struct state {
  bool exists = false;
  bool proc = false;  // on /proc, whose files say 0 bytes and change as they are read
  mode_t kind = 0;
  std::int64_t size = 0;
  std::string bytes{};
  bool operator==(const state&) const = default;
};

state state_of(const std::string& p) {
  state s;
  struct stat st {};
  if (p.empty() || ::stat(p.c_str(), &st) != 0) return s;
  static const dev_t proc_dev = [] {
    struct stat ps {};
    return ::stat("/proc/self/stat", &ps) == 0 ? ps.st_dev : dev_t{0};
  }();
  s.exists = true;
  s.proc = st.st_dev == proc_dev;
  s.kind = st.st_mode & S_IFMT;
  s.size = static_cast<std::int64_t>(st.st_size);
  if (S_ISREG(st.st_mode) && !s.proc) s.bytes = slurp(p).value_or("<unreadable>");
  return s;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

/// A data_error must name the path (the empty path: say so).
void check_names(const hetmesh::data_error& e, const std::string& p) {
  const std::string_view msg = e.what();
  check(p.empty()
            ? msg.find("''") != std::string_view::npos || msg.find("empty path") != std::string_view::npos
            : msg.find("'" + p + "'") != std::string_view::npos || msg.find(p + ":") == 0);
}

/// No temporary of write_file_atomic left anywhere under the scratch folder.
void check_no_temporaries() {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root(), ec), end; !ec && it != end; it.increment(ec))
    check(it->path().filename().string().find(".tmp-") == std::string::npos);
}

void make(const std::string& p, std::uint8_t kind, script& in) {
  std::error_code ec;
  fs::remove_all(p, ec);
  switch (kind) {
    case 0: {
      const std::string bytes = in.bytes(in.next());
      std::ofstream(p, std::ios::binary) << bytes;
      break;
    }
    case 1:
      (void)::mkfifo(p.c_str(), 0600);
      break;
    case 2:
      (void)::mkdir(p.c_str(), 0700);
      break;
    default: {
      static constexpr std::array<const char*, 9> targets{
          "a", "b", "c", "d", "/dev/null", "/dev/zero", "/dev/full", "/proc/self/stat", "missing"};
      (void)::symlink(targets[in.next() % targets.size()], p.c_str());
    }
  }
}

std::int64_t pick_limit(std::uint8_t b) { return b == 255 ? hetmesh::small_file_bytes : b; }

void read_one(std::uint8_t op, script& in) {
  const std::string p = pick_path(in.next(), false);
  const std::int64_t limit = pick_limit(in.next());
  const state before = state_of(p);
  const bool proc = before.proc;
  const bool readable = before.exists && S_ISREG(before.kind) && before.size <= limit;
  try {
    if (op == 4) {
      const std::string got = hetmesh::read_regular_file(p, limit, "fuzz input");
      check(readable && (proc || got == before.bytes));
    } else if (op == 5) {
      hetmesh::regular_file_stream s(p, limit, "fuzz input");
      std::ostringstream got;
      if (s.size() > 0) got << s.rdbuf();
      check(readable && (proc || got.str() == before.bytes));
    } else {
      (void)hetmesh::read_json_file(p, "fuzz json", limit);
      check(readable);
    }
  } catch (const hetmesh::data_error& e) {
    check_names(e, p);
    // A readable regular file may only be refused as JSON, or when it is a /proc file.
    check(!readable || proc || op == 7);
  }
}

/// RLIMIT_FSIZE of `bytes` (0: none) for its lifetime, with SIGXFSZ ignored so that a write past it
/// fails with EFBIG (libFuzzer's own handler, which reports "file size exceeded", is put back after).
struct file_size_limit {
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved);
    if (bytes == 0) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGXFSZ, &ignore, &saved_action);
    const rlimit r{bytes, saved.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &r);
    set = true;
  }
  ~file_size_limit() {
    if (!set) return;
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::sigaction(SIGXFSZ, &saved_action, nullptr);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;
  rlimit saved{};
  struct sigaction saved_action {};
  bool set = false;
};

void write_one(script& in) {
  const std::string p = pick_path(in.next(), true);
  const std::size_t len = std::size_t{in.next()} * 3;
  const rlim_t fsize = in.next();
  const std::string bytes = in.bytes(len);
  const state before = state_of(p);
  const state parent = state_of(p.empty() ? std::string() : hetmesh::detail::folder_of(p));
  const bool writable_target = !p.empty() && (!before.exists || S_ISREG(before.kind)) && S_ISDIR(parent.kind);
  const bool fits = fsize == 0 || bytes.size() <= fsize;
  bool wrote = false;
  try {
    const file_size_limit limit(fsize);
    hetmesh::write_file_atomic(p, bytes, "fuzz output");
    wrote = true;
  } catch (const hetmesh::data_error& e) {
    check_names(e, p);
  }
  check(wrote == (writable_target && fits));
  const state after = state_of(p);
  if (wrote)
    check(after.exists && S_ISREG(after.kind) && after.bytes == bytes);
  else
    check(after == before);
  check_no_temporaries();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::error_code ec;
  fs::create_directories(root(), ec);
  std::atexit([] {
    std::error_code e;
    fs::remove_all(root(), e);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root(), ec)) fs::remove_all(e.path(), ec);
  script in{data, size};
  for (int ops = 0; ops < 32 && !in.done(); ++ops) {
    const std::uint8_t op = in.next() % 8;
    if (op < 4)
      make(root() + "/" + slots[in.next() % 4], op, in);
    else if (op == 6)
      write_one(in);
    else
      read_one(op, in);
  }
  return 0;
}
