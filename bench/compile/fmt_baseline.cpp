// SPDX-License-Identifier: Apache-2.0
// The compile-time benchmark's yardstick (bench/compile/run.py): fmt plus the standard headers a trainer
// translation unit uses, with a little code over them (formatting, vector and algorithm work, a timer), so
// that both its parse and its -O2 build do real work. run.py compiles it in the same run as
// one_system.cpp and hetmesh.hpp and records their times as ratios to this one's, so machine speed and load
// cancel (issue 32: one_system.cpp <= 4x its -O2 build, hetmesh.hpp <= 2x its parse). Never linked.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace bench_compile {

/// A record with a few fields of the kinds a trainer prints.
struct row {
  std::string name;             ///< what was measured
  std::int64_t tokens = 0;      ///< how many tokens
  double seconds = 0.0;         ///< how long
  std::optional<int> rank{};    ///< on which rank, if any
  std::array<float, 4> loss{};  ///< a few losses
};

/// Sorts, filters and sums rows, and formats a line per row and a total: fmt::format over strings,
/// integers, floats and an optional, with std::vector, std::span, <algorithm> and a std::function.
std::vector<std::string> report(std::span<const row> rows, const std::function<bool(const row&)>& keep) {
  std::vector<row> kept;
  std::copy_if(rows.begin(), rows.end(), std::back_inserter(kept), keep);
  std::sort(kept.begin(), kept.end(), [](const row& a, const row& b) { return a.seconds > b.seconds; });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> out;
  out.reserve(kept.size() + 1);
  std::int64_t tokens = 0;
  for (const row& r : kept) {
    tokens += r.tokens;
    float mean = 0.0F;
    for (float x : r.loss) mean += x / static_cast<float>(r.loss.size());
    out.push_back(fmt::format("{:<24} {:>10} tokens {:>8.3f} s loss {:.4f} rank {}", r.name, r.tokens,
                              r.seconds, mean, r.rank ? fmt::format("{}", *r.rank) : std::string("-")));
  }
  auto unique = std::make_unique<std::vector<std::int64_t>>();
  for (const row& r : kept) unique->push_back(r.tokens);
  std::stable_sort(unique->begin(), unique->end());
  unique->erase(std::unique(unique->begin(), unique->end()), unique->end());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.push_back(fmt::format(
      "{} rows, {} tokens, {} distinct counts, {:.2e} s, max {}", kept.size(), tokens, unique->size(), took,
      kept.empty() ? 0.0 : std::max_element(kept.begin(), kept.end(), [](auto& a, auto& b) {
                             return a.seconds < b.seconds;
                           })->seconds));
  static_assert(std::is_same_v<decltype(std::pair{tokens, took}), std::pair<std::int64_t, double>>);
  return out;
}

}  // namespace bench_compile
