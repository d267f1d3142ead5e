// SPDX-License-Identifier: Apache-2.0
// Test helpers for the trust-boundary tests (issue 37): a FIFO and a sparse file in a test's folder, and a
// full disk injected into a child process (RLIMIT_FSIZE).
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

namespace testsupport {

/// A FIFO named `name` in folder `d` (anything with `d / name` giving a path); its path.
template <class Dir>
std::string make_fifo(const Dir& d, const std::string& name = "fifo") {
  const std::string p = d / name;
  REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
  return p;
}

/// A sparse file of `bytes` bytes named `name` in folder `d` (instant, no disk used); its path.
template <class Dir>
std::string make_sparse(const Dir& d, const std::string& name, std::int64_t bytes) {
  const std::string p = d / name;
  std::ofstream(p) << "";
  std::filesystem::resize_file(p, static_cast<std::uintmax_t>(bytes));
  return p;
}

/// Runs f() (returning an exit code) in a child process whose files may not grow past `limit` bytes
/// (RLIMIT_FSIZE, SIGXFSZ ignored): a full disk, injected. Returns the child's exit code (100 when it did
/// not exit normally).
template <class F>
int with_file_size_limit(rlim_t limit, F f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    ::_exit(f());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

}  // namespace testsupport
