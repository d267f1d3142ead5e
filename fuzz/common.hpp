// SPDX-License-Identifier: Apache-2.0
// Shared by hetmesh's libFuzzer targets. A target feeds the input to one parser; the parser must either
// accept it or throw a hetmesh::error (a clear, typed refusal). Anything else (a crash, a sanitizer
// report, another exception type escaping, a hang) is a finding: uncaught exceptions abort, which
// libFuzzer reports with the input that caused it.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <hetmesh/data/detail/file.hpp>

namespace hetmesh::fuzz {

/// A per-process scratch path in the temporary folder (readers that take a path are fed through it).
inline std::string scratch(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/hetmesh-fuzz-" + std::to_string(::getpid()) + "-" +
         name;
}

/// Writes `size` bytes at `data` to `path` (replacing it; no fsync, which would bound the target at a few
/// hundred executions per second).
inline void put(const std::string& path, const std::uint8_t* data, std::size_t size) {
  const data::detail::unique_fd fd = data::detail::open_file(path, O_WRONLY | O_CREAT | O_TRUNC);
  data::detail::write_all(fd.get(), {reinterpret_cast<const std::byte*>(data), size}, path);
}

/// The input as a command line: arguments separated by NUL bytes; the first is argv[0] or the subcommand
/// (an input without NUL bytes is one argument; an empty input is one empty argument).
inline std::vector<std::string> nul_separated(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back().push_back(static_cast<char>(data[i]));
  }
  return args;
}

}  // namespace hetmesh::fuzz
