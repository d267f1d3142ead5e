// SPDX-License-Identifier: Apache-2.0
// Length lists: the one reader that hetmesh-plan, the benchmarks and the tests share, its errors
// (file and line named), and batches sampled from a list.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <vector>

#include <hetmesh/balance/workload.hpp>

using namespace hetmesh;

TEST_CASE("parse_length_line: lengths, skipped lines, and errors naming the file and line") {
  CHECK(balance::parse_length_line("4096", "f.txt", 1) == 4096);
  CHECK(balance::parse_length_line("  +8 \r", "f.txt", 1) == 8);
  CHECK_FALSE(balance::parse_length_line("", "f.txt", 1).has_value());
  CHECK_FALSE(balance::parse_length_line(" \t\r", "f.txt", 1).has_value());
  CHECK_FALSE(balance::parse_length_line("# lengths of ProLong", "f.txt", 1).has_value());
  CHECK_THROWS_WITH_AS((void)balance::parse_length_line(" abc ", "f.txt", 7),
                       "f.txt:7: 'abc' is not a length; expected one positive integer per line", data_error);
  CHECK_THROWS_WITH_AS((void)balance::parse_length_line("12 13", "f.txt", 2),
                       "f.txt:2: '12 13' is not a length; expected one positive integer per line",
                       data_error);
  CHECK_THROWS_WITH_AS((void)balance::parse_length_line("99999999999999999999", "f.txt", 3),
                       doctest::Contains("f.txt:3: '99999999999999999999' is not a length"), data_error);
  CHECK_THROWS_WITH_AS((void)balance::parse_length_line("0", "f.txt", 4),
                       "f.txt:4: length 0; expected a positive token count", data_error);
  CHECK_THROWS_WITH_AS((void)balance::parse_length_line("-5", "f.txt", 5),
                       "f.txt:5: length -5; expected a positive token count", data_error);
}

TEST_CASE("read_lengths: file order, comments skipped, empty and missing files refused") {
  std::istringstream in("# header\n100\n\n 200\r\n+300\n");
  CHECK(balance::read_lengths(in, "mem") == std::vector<std::int64_t>{100, 200, 300});
  std::istringstream bad("1\n2\nx\n");
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(bad, "mem"), doctest::Contains("mem:3:"), data_error);
  std::istringstream none("# nothing\n\n");
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(none, "mem"),
                       "mem: no lengths; expected one positive integer per line", data_error);
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(std::filesystem::path("/nonexistent/lengths.txt")),
                       doctest::Contains("cannot open length list '/nonexistent/lengths.txt'"), data_error);
}

TEST_CASE("sample_batch: deterministic draws from the list until the token target, ids in draw order") {
  const std::vector<std::int64_t> lens{5, 70, 900, 13, 4000};
  const auto a = balance::sample_batch(lens, 100000, 9);
  CHECK(a == balance::sample_batch(lens, 100000, 9));
  CHECK(a != balance::sample_batch(lens, 100000, 10));
  std::int64_t total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].id == static_cast<std::int64_t>(i));
    CHECK(std::find(lens.begin(), lens.end(), a[i].length) != lens.end());
    total += a[i].length;
  }
  CHECK(total >= 100000);
  CHECK(total - a.back().length < 100000);
  CHECK(balance::sample_batch(lens, 0, 1).empty());
  CHECK_THROWS_AS((void)balance::sample_batch(std::vector<std::int64_t>{}, 10, 1), invalid_argument);
}
