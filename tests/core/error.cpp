#include <doctest/doctest.h>

#include <hetmesh/core/assert.hpp>
#include <hetmesh/core/error.hpp>

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
