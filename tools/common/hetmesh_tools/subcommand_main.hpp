// SPDX-License-Identifier: Apache-2.0
// The main() of a tool with subcommands (hetmesh-data-convert, hetmesh-ckpt): the usage on no argument
// (exit 2) and on --help / -h / help (exit 0), then `run(command, arguments)`. Its status is the exit
// status; a hetmesh::error (a usage_error too) prints its message on one line (exit 2), anything else an
// internal error (exit 1). A report that could not reach stdout (a full disk, a
// closed pipe) is an error too (exit 2): the caller would otherwise take a lost report for a good one.
#pragma once

#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/core/error.hpp>

namespace hetmesh::tools {

/// Runs `run(command, arguments)` for the program `program` as the file comment says; returns the exit
/// status.
template <class Run>
int subcommand_main(int argc, char** argv, std::string_view program, std::string_view usage, Run&& run) {
  if (argc < 2) {
    std::cerr << usage;
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << usage;
    return 0;
  }
  try {
    const int rc = run(cmd, std::vector<std::string>(argv + 2, argv + argc));
    std::cout.flush();
    if (!std::cout) {
      std::cerr << program << ": error: cannot write the report to stdout (disk full or closed?)\n";
      return 2;
    }
    return rc;
  } catch (const hetmesh::error& e) {  // usage_error included: one line, as scripts read it
    std::cerr << program << ": error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program << ": internal error: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace hetmesh::tools
