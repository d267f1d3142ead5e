// SPDX-License-Identifier: Apache-2.0
// Test support: runs hetmesh-plan as a child process and captures its stdout, stderr and exit code,
// so the tests see exactly what a user sees.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tools_test {

struct result {
  int code = -1;
  std::string out;
  std::string err;

  [[nodiscard]] nlohmann::json json() const { return nlohmann::json::parse(out); }
  /// True when stderr is exactly one line "hetmesh-plan: error: ..." (the contract for bad input).
  [[nodiscard]] bool one_line_error() const {
    return err.rfind("hetmesh-plan: error: ", 0) == 0 && !err.empty() && err.back() == '\n' &&
           err.find('\n') == err.size() - 1;
  }
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Single quotes make the shell pass every argument verbatim.
inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// A scratch directory, removed on destruction.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           fmt::format("hetmesh_plan_test_{}_{}", static_cast<long>(::getpid()), counter++);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  [[nodiscard]] std::string write(const std::string& name, const std::string& text) const {
    const auto p = path / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

/// Runs `exe` with `args` (and `env`, "NAME=value ..." prefixed to the command line, when not empty).
inline result run_exe(const std::string& exe, const std::vector<std::string>& args,
                      const std::string& env = "") {
  const scratch_dir dir;
  std::string cmd = env.empty() ? std::string() : env + " ";
  cmd += quote(exe);
  // Appended piecewise: `" " + quote(a)` trips a g++ 12 -O3 -Wrestrict false positive.
  for (const auto& a : args) {
    cmd += ' ';
    cmd += quote(a);
  }
  cmd += " >";
  cmd += quote((dir.path / "out").string());
  cmd += " 2>";
  cmd += quote((dir.path / "err").string());
  const int status = std::system(cmd.c_str());
  result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = slurp(dir.path / "out");
  r.err = slurp(dir.path / "err");
  return r;
}

/// Runs hetmesh-plan with `args`.
inline result run(const std::vector<std::string>& args) { return run_exe(HETMESH_PLAN_EXE, args); }

}  // namespace tools_test
