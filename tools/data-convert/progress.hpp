// SPDX-License-Identifier: Apache-2.0
// hetmesh-data-convert: progress of a long conversion on stderr. A watcher thread samples how far the
// conversion has read its input and reports it: a bar redrawn in place when stderr is a terminal, a plain
// line every few seconds otherwise (logs, CI). It needs no hook in the converter: on Linux it reads the
// input's file offset from /proc/self/fdinfo; elsewhere (or if the input cannot be found there) it reports
// elapsed time and output bytes only. Short conversions print nothing.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/core.h>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace hetmesh_tool {

/// Reports a conversion's progress on stderr while it lives (see the file comment). Construct it before
/// the conversion, destroy it (or call finish()) after. Thread-safe; the watcher never throws.
class convert_progress {
 public:
  /// Watches the reading of `input`; the files starting with `output_prefix` are reported as written
  /// bytes when the input's offset is unknown. Nothing shows before `quiet_for` (the environment variable
  /// HETMESH_PROGRESS_AFTER_MS overrides it: tests set 0).
  convert_progress(std::string input, std::string output_prefix,
                   std::chrono::milliseconds quiet_for = std::chrono::milliseconds(1500))
      : input_(std::move(input)), prefix_(std::move(output_prefix)), quiet_for_(quiet_for) {
    if (const char* v = std::getenv("HETMESH_PROGRESS_AFTER_MS"); v != nullptr && *v != '\0')
      quiet_for_ = std::chrono::milliseconds(std::strtoll(v, nullptr, 10));
    std::error_code ec;
    total_ = static_cast<std::int64_t>(std::filesystem::file_size(input_, ec));
    if (ec) total_ = -1;
    canonical_ = std::filesystem::weakly_canonical(input_, ec).string();
#if defined(__unix__) || defined(__APPLE__)
    tty_ = ::isatty(::fileno(stderr)) != 0;
#endif
    start_ = clock::now();
    watcher_ = std::thread([this] { run(); });
  }
  convert_progress(const convert_progress&) = delete;
  convert_progress& operator=(const convert_progress&) = delete;
  /// Stops the watcher without a last report (the conversion failed: its error follows on its own line).
  ~convert_progress() {
    if (stop() && shown_ && tty_) fmt::print(stderr, "\n");
  }

  /// The conversion succeeded: stops the watcher and, when it has shown anything, ends with a last report
  /// at 100%. Idempotent.
  void finish() {
    if (stop() && shown_) report(total_ >= 0 ? std::optional<std::int64_t>(total_) : std::nullopt, true);
  }

 private:
  // Stops and joins the watcher; false when it was stopped already.
  bool stop() {
    {
      std::lock_guard lk(m_);
      if (stop_) return false;
      stop_ = true;
    }
    cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
    return true;
  }

  using clock = std::chrono::steady_clock;

  void run() {
    const auto period = tty_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
    std::unique_lock lk(m_);
    if (cv_.wait_for(lk, quiet_for_, [this] { return stop_; })) return;
    do {
      lk.unlock();
      shown_ = true;
      report(read_offset(), false);
      lk.lock();
    } while (!cv_.wait_for(lk, period, [this] { return stop_; }));
  }

  // The input's file offset, from the open descriptor that points at it; nullopt when unknown.
  [[nodiscard]] std::optional<std::int64_t> read_offset() const {
#if defined(__linux__)
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      std::error_code ec2;
      const auto target = std::filesystem::read_symlink(e.path(), ec2);
      if (ec2 || target.string() != canonical_) continue;
      std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
      std::string key;
      std::int64_t value = 0;
      while (info >> key >> value)
        if (key == "pos:") return value;
    }
#endif
    return std::nullopt;
  }

  [[nodiscard]] std::int64_t written() const {
    std::int64_t b = 0;
    std::error_code ec;
    const std::filesystem::path p(prefix_);
    const auto dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
    const auto stem = p.filename().string();
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::error_code ec2;
      if (e.path().filename().string().rfind(stem, 0) == 0 && e.is_regular_file(ec2))
        b += static_cast<std::int64_t>(e.file_size(ec2));
    }
    return b;
  }

  static std::string mb(std::int64_t bytes) {
    return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
  }

  void report(std::optional<std::int64_t> offset, bool last) {
    const double secs = std::chrono::duration<double>(clock::now() - start_).count();
    std::string what;
    if (offset && total_ > 0) {
      const double f = std::min(1.0, static_cast<double>(*offset) / static_cast<double>(total_));
      if (tty_) {
        constexpr int width = 30;
        const int fill = static_cast<int>(f * width);
        what = fmt::format("[{}{}] {:3.0f}%  {} of {}", std::string(static_cast<std::size_t>(fill), '#'),
                           std::string(static_cast<std::size_t>(width - fill), '.'), 100 * f, mb(*offset),
                           mb(total_));
      } else {
        what = fmt::format("{:.0f}% ({} of {} read)", 100 * f, mb(*offset), mb(total_));
      }
    } else {
      what = fmt::format("{} written", mb(written()));
    }
    if (tty_)
      fmt::print(stderr, "\r{}  {:.0f} s{}", what, secs, last ? "\n" : "");
    else
      fmt::print(stderr, "hetmesh-data-convert: {} after {:.0f} s{}\n", what, secs, last ? ", done" : "");
    std::fflush(stderr);
  }

  std::string input_, prefix_, canonical_;
  std::chrono::milliseconds quiet_for_;
  std::int64_t total_ = -1;
  bool tty_ = false;
  bool shown_ = false;  // written by the watcher before it is joined, read after
  clock::time_point start_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace hetmesh_tool
