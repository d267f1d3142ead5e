#include <doctest/doctest.h>

#include <hetmesh/core/assert.hpp>
#include <hetmesh/core/error.hpp>

#include <cstdint>
#include <iterator>
#include <string>

TEST_CASE("error hierarchy carries the message and added context") {
  try {
    try {
      hetmesh::throw_error<hetmesh::invalid_argument>("cp={} does not divide {}", 3, 8);
    } catch (hetmesh::error& e) {
      e.add_context("while planning step 7");
      throw;
    }
  } catch (const hetmesh::invalid_argument& e) {
    CHECK(e.message() == "cp=3 does not divide 8");
    CHECK(std::string(e.what()) == "while planning step 7: cp=3 does not divide 8");
    return;
  }
  FAIL("no exception");
}

TEST_CASE("backend_error keeps the backend's code") {
  const hetmesh::backend_error e("ncclInvalidUsage: bad", 5);
  CHECK(e.code() == 5);
  CHECK(std::string(e.what()).find("ncclInvalidUsage") != std::string::npos);
}

TEST_CASE("HETMESH_ASSERT throws assertion_error naming the expression") {
  const int x = 3;
  CHECK_NOTHROW(HETMESH_ASSERT(x == 3, "x is {}", x));
  try {
    HETMESH_ASSERT(x == 4, "expected 4, got {}", x);
    FAIL("no exception");
  } catch (const hetmesh::assertion_error& e) {
    const std::string w = e.what();
    CHECK(w.find("x == 4") != std::string::npos);
    CHECK(w.find("expected 4, got 3") != std::string::npos);
  }
}

TEST_CASE("heavy assertions are compiled out at the default level") {
  int evaluated = 0;
  HETMESH_ASSERT_AT(heavy, ++evaluated > 100, "never");
  CHECK(evaluated == 0);
  CHECK(hetmesh::assertion_enabled(hetmesh::assertion_level::normal));
  CHECK_FALSE(hetmesh::assertion_enabled(hetmesh::assertion_level::off));
}

TEST_CASE("throw_error, format and format_to take many arguments of mixed types") {
  const std::string s = "str";
  // 16 arguments: the plain (non-template) parameters; 17: the variadic overload.
  CHECK(hetmesh::format("{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 'a', s, "c", 1.5,
                        std::int64_t{-4}, true) == "0123456789astrc1.5-4true");
  CHECK(hetmesh::format("{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                        14, 15, 16) == "012345678910111213141516");
  CHECK(hetmesh::format("no arguments") == "no arguments");
  std::string out;
  hetmesh::format_to(std::back_inserter(out), "{}-{}", s, 2);
  hetmesh::format_to(std::back_inserter(out), "|{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}", 0, 1, 2, 3, 4, 5, 6, 7,
                     8, 9, 10, 11, 12, 13, 14, 15, 16);
  CHECK(out == "str-2|012345678910111213141516");
  try {
    hetmesh::throw_error<hetmesh::capacity_error>("{} of {}: {}", 3, std::string("eight"), s);
    FAIL("no exception");
  } catch (const hetmesh::capacity_error& e) {
    CHECK(std::string(e.what()) == "3 of eight: str");
  }
  try {
    hetmesh::throw_error<hetmesh::data_error>("{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}", 0, 1, 2, 3, 4, 5, 6, 7, 8,
                                              9, 10, 11, 12, 13, 14, 15, 16);
    FAIL("no exception");
  } catch (const hetmesh::data_error& e) {
    CHECK(std::string(e.what()) == "012345678910111213141516");
  }
#if !HETMESH_CHECK_FORMAT_STRINGS
  CHECK_THROWS_AS(hetmesh::format("{} {}", 1), fmt::format_error);  // too few arguments: a run-time error
#endif
  const int x = 1;
  CHECK_THROWS_WITH_AS(HETMESH_ASSERT(x == 2, "{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}", 0, 1, 2, 3, 4, 5, 6, 7, 8,
                                      9, 10, 11, 12, 13, 14, 15, 16),
                       doctest::Contains("012345678910111213141516"), hetmesh::assertion_error);
}
