// SPDX-License-Identifier: Apache-2.0
// Fuzz target: hetmesh-plan's argument handling. The input is a command line after the program name, its
// arguments separated by NUL bytes; the first names the subcommand. It goes through the subcommand's
// spec (tools/hetmesh-plan/args.hpp over tools/common/hetmesh_tools/args.hpp) exactly as main does, then
// every typed getter is tried on every option. Each step must succeed or throw usage_error; an accepted
// integer must lie inside the range asked for, an accepted real must be finite and inside its range, and an
// option the command line did not give must never count as given. The planners themselves are not run here
// (their own inputs are fuzzed by the other targets).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../tools/hetmesh-plan/commands.hpp"
#include "common.hpp"

namespace {

const std::vector<hetmesh_plan::subcommand>& commands() {
  static const auto all = [] {
    std::vector<hetmesh_plan::subcommand> out;
    for (auto family : {hetmesh_plan::mesh_commands, hetmesh_plan::cp_commands,
                        hetmesh_plan::pipeline_commands, hetmesh_plan::balance_commands})
      for (auto& c : family()) out.push_back(std::move(c));
    return out;
  }();
  return all;
}

template <class F>
void refused_or(F&& f) {
  try {
    f();
  } catch (const hetmesh_plan::usage_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> args = hetmesh::fuzz::nul_separated(data, size);
  for (const auto& c : commands()) {
    if (c.spec.name() != args[0]) continue;
    hetmesh_plan::parsed p;
    try {
      p = c.spec.parse(std::span<const std::string>(args).subspan(1));
    } catch (const hetmesh_plan::usage_error&) {
      return 0;
    }
    for (const auto& kv : p.values()) {
      const std::string& name = kv.first;  // a plain name: clang 14 lambdas cannot capture bindings
      if (p.given(name)) {
        bool on_line = false;  // a given option's name is on the command line
        for (const auto& a : args)
          if (a.rfind("--" + name, 0) == 0) on_line = true;
        if (!on_line) __builtin_trap();
      }
      refused_or([&] {
        const auto v = p.integer(name, -5, 1 << 20);
        if (v < -5 || v > (1 << 20)) __builtin_trap();
      });
      refused_or([&] {
        const double v = p.real(name);
        if (!std::isfinite(v) || v < 1e-9 || v > 1e15) __builtin_trap();
      });
      refused_or([&] { (void)p.integer_list(name); });
      refused_or([&] { p.needs(name, "hidden", "fuzz"); });
    }
    return 0;
  }
  return 0;
}
