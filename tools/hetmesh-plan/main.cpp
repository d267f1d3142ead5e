// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: see a plan before spending a cluster on it. Dispatches to the subcommands and turns
// every failure into one line on stderr: exit 2 for bad input (any hetmesh::error, including a
// command line the tool cannot accept), exit 1 for anything else, which would be a bug in the tool.
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/core/error.hpp>

#include "commands.hpp"

namespace {

constexpr const char* program = "hetmesh-plan";

std::vector<hetmesh_plan::subcommand> all_commands() {
  std::vector<hetmesh_plan::subcommand> out;
  for (auto family : {hetmesh_plan::mesh_commands, hetmesh_plan::cp_commands, hetmesh_plan::pipeline_commands,
                      hetmesh_plan::balance_commands}) {
    for (auto& c : family()) out.push_back(std::move(c));
  }
  return out;
}

std::string top_help(const std::vector<hetmesh_plan::subcommand>& cmds) {
  std::string s = fmt::format(
      "usage: {} <command> [options]\n\n"
      "Prints hetmesh's plans (mesh layouts, context-parallel partitions, pipeline schedules, balance\n"
      "plans) without a cluster. Output is JSON unless --format says otherwise. Exit status: 0 on\n"
      "success, 2 with one line on stderr for bad input.\n\ncommands:\n",
      program);
  std::size_t width = 0;
  for (const auto& c : cmds) width = std::max(width, c.spec.name().size());
  for (const auto& c : cmds) s += fmt::format("  {:<{}}  {}\n", c.spec.name(), width, c.spec.summary());
  s += fmt::format("\n'{} <command> --help' describes a command's options and output.\n", program);
  return s;
}

// One line: a message with newlines (a planner may format a table into it) is folded with "; ".
std::string one_line(std::string s) {
  for (std::size_t p; (p = s.find('\n')) != std::string::npos;) s.replace(p, 1, "; ");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const auto cmds = all_commands();
    if (args.empty()) {
      std::cerr << top_help(cmds);
      return 2;
    }
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      if (args.size() >= 2) {
        for (const auto& c : cmds) {
          if (c.spec.name() == args[1]) {
            std::cout << c.spec.help(program);
            return 0;
          }
        }
        hetmesh_plan::usage_fail("unknown command '{}'; see '{} --help'", args[1], program);
      }
      std::cout << top_help(cmds);
      return 0;
    }
    for (const auto& c : cmds) {
      if (c.spec.name() != args[0]) continue;
      const auto parsed = c.spec.parse(std::span<const std::string>(args).subspan(1));
      if (parsed.flag("help")) {
        std::cout << c.spec.help(program);
        return 0;
      }
      std::ostringstream out;
      c.run(parsed, out);
      std::cout << out.str() << std::flush;
      if (!std::cout) {  // stdout onto /dev/full or a closed pipe: say so, never exit 0 with nothing written
        std::cerr << program << ": error: cannot write the output to stdout (disk full or closed?)\n";
        return 2;
      }
      return 0;
    }
    std::vector<std::string> names;
    for (const auto& c : cmds) names.push_back(c.spec.name());
    hetmesh_plan::usage_fail("unknown command '{}'; expected one of: {}", args[0], fmt::join(names, ", "));
  } catch (const hetmesh::error& e) {
    std::cerr << program << ": error: " << one_line(e.what()) << '\n';
    return 2;
  } catch (const nlohmann::json::exception& e) {
    std::cerr << program << ": error: " << one_line(e.what()) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program << ": internal error: " << one_line(e.what()) << '\n';
    return 1;
  }
}
