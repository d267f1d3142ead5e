// SPDX-License-Identifier: Apache-2.0
// Benchmark support: what machine a benchmark ran on, read from the system (not written by hand, so a
// result file says the truth on whatever machine produced it).
#pragma once

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace hetmesh::bench {

/// "N-core <arch> (<CPU model>, <L2> L2 per core, <L3> L3)" from /proc/cpuinfo and sysfs (Linux); what it
/// cannot read it leaves out.
[[nodiscard]] inline std::string machine_description() {
  std::string model, line;
  std::ifstream info("/proc/cpuinfo");
  while (std::getline(info, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 1);
      model.erase(0, model.find_first_not_of(" \t"));
      break;
    }
  auto cache = [](int index) {
    std::string size;
    std::ifstream(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", index)) >> size;
    if (!size.empty() && size.back() == 'K') {
      const long k = std::stol(size.substr(0, size.size() - 1));
      return k % 1024 == 0 ? fmt::format("{} MiB", k / 1024) : fmt::format("{} KiB", k);
    }
    return size;
  };
  const std::string l2 = cache(2), l3 = cache(3);
#if defined(__x86_64__)
  const char* arch = "x86_64";
#elif defined(__aarch64__)
  const char* arch = "aarch64";
#else
  const char* arch = "unknown-arch";
#endif
  std::string out = fmt::format("{}-core {}", std::thread::hardware_concurrency(), arch);
  std::string details = model;
  if (!l2.empty()) details += fmt::format("{}{} L2 per core", details.empty() ? "" : ", ", l2);
  if (!l3.empty()) details += fmt::format("{}{} L3", details.empty() ? "" : ", ", l3);
  return details.empty() ? out : fmt::format("{} ({})", out, details);
}

/// The 1-minute load average now (/proc/loadavg; -1 where it cannot be read): a result from a shared
/// machine says how busy it was.
[[nodiscard]] inline double load_average_now() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

}  // namespace hetmesh::bench
