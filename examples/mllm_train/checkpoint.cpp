// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's model checkpoint (checkpoint.hpp): the file operations, counted for fault
// injection, and the formats of the rank files, the manifest and `latest`.
#include "mllm_train/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <hetmesh/core/hash.hpp>

namespace mllm::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr char rank_magic[8] = {'H', 'M', 'M', 'L', 'C', 'K', 'P', 'T'};
constexpr std::int64_t rank_version = 1;
constexpr std::size_t header_bytes = sizeof rank_magic + 4 * sizeof(std::int64_t);  // version step rank count
constexpr std::size_t tensor_header_bytes = 3 * sizeof(std::int64_t);               // id size t
constexpr std::string_view manifest_magic = "hetmesh-mllm-checkpoint 1";
constexpr std::uint64_t max_manifest_bytes = std::uint64_t{1} << 20;
constexpr std::uint64_t max_latest_bytes = 256;
constexpr std::uint64_t max_file_bytes = std::uint64_t{1} << 36;  // what one rank file may claim
constexpr int max_ranks = 1 << 20;
constexpr const char* data_name = "data.ckpt";

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw std::runtime_error("checkpoint: " + fmt::format(f, std::forward<Args>(args)...));
}
[[noreturn]] void fail_errno(const char* what, const fs::path& p) {
  fail("cannot {} '{}': {}", what, p.string(), std::strerror(errno));
}

// --- fault injection -----------------------------------------------------------------------------------

struct kill_point {
  std::int64_t step = -1, op = -1;
};

kill_point kill_point_from_env() {
  const char* s = std::getenv("HETMESH_CKPT_KILL_AT");
  if (s == nullptr || *s == '\0') return {};
  kill_point k;
  const std::string_view v(s);
  const char* end = v.data() + v.size();
  const auto a = std::from_chars(v.data(), end, k.step);
  const auto b = a.ec == std::errc() && a.ptr != end && *a.ptr == ':'
                     ? std::from_chars(a.ptr + 1, end, k.op)
                     : std::from_chars_result{a.ptr, std::errc::invalid_argument};
  if (b.ec != std::errc() || b.ptr != end || k.step < 0 || k.op < 1)
    fail("HETMESH_CKPT_KILL_AT='{}': expected STEP:OP (a step >= 0 and an operation >= 1)", v);
  return k;
}

// Called right before every file operation of the save after `step`: counts it, prints it under
// HETMESH_CKPT_TRACE, and raises SIGKILL at the operation HETMESH_CKPT_KILL_AT names.
void before_op(std::int64_t step, std::string_view what, const fs::path& p) {
  static const kill_point kill = kill_point_from_env();
  static const bool trace = std::getenv("HETMESH_CKPT_TRACE") != nullptr;
  // Saves are apart (barriers): the first operation of a new step's save starts the count afresh.
  static std::atomic<std::int64_t> current{-1}, ops{0};
  if (std::int64_t seen = current.load(); seen != step && current.compare_exchange_strong(seen, step))
    ops = 0;
  const std::int64_t n = ops.fetch_add(1) + 1;
  if (trace) fmt::print(stderr, "checkpoint save after step {}: op {}: {} {}\n", step, n, what, p.string());
  if (step == kill.step && n == kill.op) ::raise(SIGKILL);
}

// --- file operations -----------------------------------------------------------------------------------

class fd_guard {
 public:
  explicit fd_guard(int fd) noexcept : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Writes `bytes` to `final` durably: a fresh temporary beside it, written, fsynced, closed and renamed
// over it. Each step is one counted operation; a failure removes the temporary and names the path.
void write_durable(const fs::path& final, std::span<const std::byte> bytes, std::int64_t step) {
  const fs::path tmp = final.string() + ".tmp";
  before_op(step, "create", tmp);
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) fail_errno("remove", tmp);
  fd_guard fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail_errno("create", tmp);
  try {
    before_op(step, "write", tmp);
    for (std::size_t done = 0; done < bytes.size();) {
      const auto n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_errno("write", tmp);
      done += static_cast<std::size_t>(n);
    }
    before_op(step, "fsync", tmp);
    if (::fsync(fd.get()) != 0) fail_errno("fsync", tmp);
    before_op(step, "close", tmp);
    if (::close(fd.release()) != 0) fail_errno("close", tmp);
    before_op(step, "rename", final);
    if (::rename(tmp.c_str(), final.c_str()) != 0) fail_errno("rename into place", tmp);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void fsync_dir(const fs::path& dir, std::int64_t step) {
  before_op(step, "fsync directory", dir);
  fd_guard fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) fail_errno("fsync the directory", dir);
}

// The whole content of `p`, which must be a regular file of at most `limit` bytes. Opened non-blocking,
// so a FIFO is refused by fstat instead of blocking the open.
std::vector<std::byte> read_regular(const fs::path& p, std::uint64_t limit) {
  fd_guard fd(::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) fail_errno("open", p);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno("stat", p);
  if (!S_ISREG(st.st_mode)) fail("'{}' is not a regular file", p.string());
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > limit) fail("'{}' has {} bytes; expected at most {}", p.string(), size, limit);
  std::vector<std::byte> out(size);
  for (std::size_t done = 0; done < out.size();) {
    const auto n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("read", p);
    if (n == 0) fail("'{}' shrank while it was read", p.string());
    done += static_cast<std::size_t>(n);
  }
  return out;
}

std::string checksum(std::span<const std::byte> bytes) {
  hetmesh::hasher h;
  h.add_bytes(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return fmt::format("{:016x}", h.digest());
}

// The step a step directory's name holds, or -1 when `name` is not one ("step-" and 1 to 18 digits).
std::int64_t step_of(std::string_view name) {
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

// --- rank files ----------------------------------------------------------------------------------------

// Appends to a buffer sized up front (resize, then memcpy: GCC 12 mistakes vector::insert of a few bytes
// for an overflow).
struct writer {
  std::vector<std::byte> out;
  std::size_t at = 0;
  void put(const void* p, std::size_t n) {
    std::memcpy(out.data() + at, p, n);
    at += n;
  }
  void put(std::int64_t x) { put(&x, sizeof x); }
};

std::int64_t get_int(std::span<const std::byte> bytes, std::size_t at) {
  std::int64_t x = 0;
  std::memcpy(&x, bytes.data() + at, sizeof x);
  return x;
}

// Throws unless the `n` floats at `at` are finite (and, for a second moment, not negative).
void check_floats(std::span<const std::byte> bytes, std::size_t at, std::size_t n, const std::string& path,
                  std::int64_t id, const char* field, bool non_negative) {
  for (std::size_t i = 0; i < n; ++i) {
    float x = 0;
    std::memcpy(&x, bytes.data() + at + i * sizeof x, sizeof x);
    if (!std::isfinite(x) || (non_negative && x < 0))
      fail("'{}': tensor {} {}[{}] = {}; expected a finite{} value", path, id, field, i, x,
           non_negative ? ", non-negative" : "");
  }
}

// --- the manifest --------------------------------------------------------------------------------------

struct manifest_entry {
  std::string name;
  std::uint64_t size = 0;
  std::string sum;
};
struct manifest {
  std::int64_t step = 0;
  int ranks = 0;
  std::vector<manifest_entry> files;
};

std::vector<std::string> expected_files(int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) out.push_back(rank_file_name(r));
  out.emplace_back(data_name);
  return out;
}

manifest parse_manifest(const std::vector<std::byte>& bytes, const fs::path& p) {
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::istringstream in(text);
  std::string line, key;
  if (!std::getline(in, line) || line != manifest_magic)
    fail("'{}' is not a checkpoint manifest (its first line is not '{}')", p.string(), manifest_magic);
  manifest m;
  auto field = [&](const char* name, auto& value, auto lo, auto hi) {
    if (!std::getline(in, line)) fail("'{}': the field '{}' is missing", p.string(), name);
    std::istringstream l(line);
    std::string rest;
    if (!(l >> key >> value) || key != name || (l >> rest) || value < lo || value > hi)
      fail("'{}': the line '{}'; expected '{} N' with N in [{}, {}]", p.string(), line, name, lo, hi);
  };
  field("step", m.step, std::int64_t{0}, std::numeric_limits<std::int64_t>::max() - 1);
  field("ranks", m.ranks, 1, max_ranks);
  for (const auto& want : expected_files(m.ranks)) {
    manifest_entry e;
    std::string rest;
    if (!std::getline(in, line)) fail("'{}': no entry for '{}'", p.string(), want);
    std::istringstream l(line);
    if (!(l >> key >> e.name >> e.size >> e.sum) || key != "file" || (l >> rest) || e.name != want ||
        e.sum.size() != 16 || e.size > max_file_bytes)
      fail("'{}': the line '{}'; expected 'file {} SIZE CHECKSUM'", p.string(), line, want);
    m.files.push_back(std::move(e));
  }
  if (std::getline(in, line)) fail("'{}': an unexpected line '{}' after the file list", p.string(), line);
  return m;
}

}  // namespace

std::string step_name(std::int64_t step) { return fmt::format("step-{:08d}", step); }

std::string rank_file_name(int rank) { return fmt::format("rank-{}.bin", rank); }

std::string latest_name(const fs::path& root) {
  const fs::path p = root / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return {};
  const auto bytes = read_regular(p, max_latest_bytes);
  std::string name(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (name.ends_with('\n')) name.pop_back();
  if (step_of(name) < 0)
    fail("'{}' holds '{}'; expected the name of a step directory (step-NNNNNNNN)", p.string(), name);
  return name;
}

void begin_save(const fs::path& root, std::int64_t step) {
  std::error_code ec;
  before_op(step, "create directories", root);
  fs::create_directories(root, ec);
  if (ec) fail("cannot create '{}': {}", root.string(), ec.message());
  const std::string name = step_name(step);
  if (latest_name(root) == name)
    fail("the save after step {} would overwrite '{}', the checkpoint 'latest' names", step,
         (root / name).string());
  const fs::path dir = root / name;
  if (fs::exists(fs::symlink_status(dir, ec))) {
    before_op(step, "remove what a killed save left", dir);
    fs::remove_all(dir, ec);
    if (ec) fail("cannot remove '{}': {}", dir.string(), ec.message());
  }
  before_op(step, "create directory", dir);
  if (!fs::create_directory(dir, ec) || ec) fail("cannot create '{}': {}", dir.string(), ec.message());
  fsync_dir(root, step);
}

void save_rank(const fs::path& root, std::int64_t step, int rank, std::span<const tensor_view> tensors) {
  std::size_t total = header_bytes;
  for (const auto& t : tensors) {
    if (t.m.size() != t.value.size() || t.v.size() != t.value.size())
      fail("tensor {}: {} values but {} and {} moments", t.id, t.value.size(), t.m.size(), t.v.size());
    total += tensor_header_bytes + 3 * t.value.size_bytes();
  }
  writer w{std::vector<std::byte>(total)};
  w.put(rank_magic, sizeof rank_magic);
  for (std::int64_t x : {rank_version, step, std::int64_t{rank}, static_cast<std::int64_t>(tensors.size())})
    w.put(x);
  for (const auto& t : tensors) {
    for (std::int64_t x : {t.id, static_cast<std::int64_t>(t.value.size()), t.t}) w.put(x);
    for (auto s : {t.value, t.m, t.v}) w.put(s.data(), s.size_bytes());
  }
  write_durable(root / step_name(step) / rank_file_name(rank), w.out, step);
}

void commit_save(const fs::path& root, std::int64_t step, int ranks,
                 const std::function<void(const fs::path&)>& write_data) {
  const fs::path dir = root / step_name(step);
  before_op(step, "write the data position", dir / data_name);
  write_data(dir / data_name);
  std::string text = fmt::format("{}\nstep {}\nranks {}\n", manifest_magic, step, ranks);
  for (const auto& name : expected_files(ranks)) {
    const auto bytes = read_regular(dir / name, max_file_bytes);
    text += fmt::format("file {} {} {}\n", name, bytes.size(), checksum(bytes));
  }
  write_durable(dir / "manifest", std::as_bytes(std::span<const char>(text)), step);
  fsync_dir(dir, step);
  const std::string previous = latest_name(root);
  const std::string latest = step_name(step) + "\n";
  write_durable(root / "latest", std::as_bytes(std::span<const char>(latest)), step);
  fsync_dir(root, step);
  // Only now may older steps go: keep the new one and the one before it.
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (step_of(name) >= 0 && name != step_name(step) && name != previous) old.push_back(e.path());
  }
  std::sort(old.begin(), old.end());
  for (const auto& p : old) {
    before_op(step, "prune", p);
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) fail("cannot remove '{}': {}", p.string(), ec.message());
  }
}

std::int64_t rank_state::restore(std::size_t i, std::int64_t id, std::span<float> value, std::span<float> m,
                                 std::span<float> v) const {
  if (i >= tensors_.size())
    fail("'{}' holds {} tensors; this rank's model has more (another model split)", path_, tensors_.size());
  const record& r = tensors_[i];
  if (r.id != id || r.size != value.size() || m.size() != value.size() || v.size() != value.size())
    fail("'{}': tensor {} is id {} of {} floats; this rank's model has id {} of {} (another model split)",
         path_, i, r.id, r.size, id, value.size());
  const std::size_t n = r.size * sizeof(float);
  std::memcpy(value.data(), bytes_.data() + r.offset, n);
  std::memcpy(m.data(), bytes_.data() + r.offset + n, n);
  std::memcpy(v.data(), bytes_.data() + r.offset + 2 * n, n);
  return r.t;
}

rank_state rank_state::parse(std::vector<std::byte> bytes, const std::string& path, std::int64_t step,
                             int rank) {
  if (bytes.size() < header_bytes || std::memcmp(bytes.data(), rank_magic, sizeof rank_magic) != 0)
    fail("'{}' is not a rank checkpoint file (no header)", path);
  auto header = [&](int i) { return get_int(bytes, sizeof rank_magic + static_cast<std::size_t>(i) * 8); };
  if (header(0) != rank_version)
    fail("'{}': version {}; this build reads version {}", path, header(0), rank_version);
  if (header(1) != step) fail("'{}': step {}; the manifest's is {}", path, header(1), step);
  if (header(2) != rank) fail("'{}': rank {}; expected {}", path, header(2), rank);
  const std::int64_t count = header(3);
  if (count < 0 || static_cast<std::uint64_t>(count) > (bytes.size() - header_bytes) / tensor_header_bytes)
    fail("'{}': tensor count {} does not fit its {} bytes", path, count, bytes.size());
  rank_state st;
  st.step_ = step;
  st.path_ = path;
  std::size_t at = header_bytes;
  for (std::int64_t k = 0; k < count; ++k) {
    if (bytes.size() - at < tensor_header_bytes) fail("'{}': tensor {} is cut off", path, k);
    record r;
    r.id = get_int(bytes, at);
    const std::int64_t size = get_int(bytes, at + 8);
    r.t = get_int(bytes, at + 16);
    at += tensor_header_bytes;
    if (size < 0 || static_cast<std::uint64_t>(size) > (bytes.size() - at) / (3 * sizeof(float)))
      fail("'{}': tensor {} (id {}) size {} does not fit the file", path, k, r.id, size);
    if (r.t < 0 || r.t > step + 1)
      fail("'{}': tensor {} Adam step {}; expected 0 to {} after step {}", path, r.id, r.t, step + 1, step);
    r.size = static_cast<std::size_t>(size);
    r.offset = at;
    const std::size_t n = r.size * sizeof(float);
    check_floats(bytes, at, r.size, path, r.id, "value", false);
    check_floats(bytes, at + n, r.size, path, r.id, "adam m", false);
    check_floats(bytes, at + 2 * n, r.size, path, r.id, "adam v", true);
    at += 3 * n;
    st.tensors_.push_back(r);
  }
  if (at != bytes.size()) fail("'{}': {} bytes after its last tensor", path, bytes.size() - at);
  st.bytes_ = std::move(bytes);
  return st;
}

resume_point load_latest(const fs::path& root, int rank, int ranks) {
  const std::string name = latest_name(root);
  if (name.empty())
    fail("'{}' holds no complete checkpoint (no 'latest': no save finished there)", root.string());
  resume_point out;
  out.dir = root / name;
  const fs::path mp = out.dir / "manifest";
  const manifest m = parse_manifest(read_regular(mp, max_manifest_bytes), mp);
  if (m.step != step_of(name)) fail("'{}': step {}; its directory is '{}'", mp.string(), m.step, name);
  if (m.ranks != ranks)
    fail("'{}' was written by {} ranks; this run has {} (resume with the same --ranks)", out.dir.string(),
         m.ranks, ranks);
  out.step = m.step;
  out.ranks = m.ranks;
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    const auto& e = m.files[f];
    const fs::path p = out.dir / e.name;
    auto bytes = read_regular(p, max_file_bytes);
    if (bytes.size() != e.size)
      fail("'{}' has {} bytes; the manifest says {} (truncated or overwritten)", p.string(), bytes.size(),
           e.size);
    if (const auto sum = checksum(bytes); sum != e.sum)
      fail("'{}': checksum {}; the manifest says {} (the file is corrupt)", p.string(), sum, e.sum);
    if (static_cast<int>(f) >= m.ranks) continue;  // the data position: the data room checks its fields
    auto st = rank_state::parse(std::move(bytes), p.string(), m.step, static_cast<int>(f));
    if (static_cast<int>(f) == rank) out.mine = std::move(st);
  }
  return out;
}

}  // namespace mllm::ckpt
