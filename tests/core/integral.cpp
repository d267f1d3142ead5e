#include <doctest/doctest.h>

#include <hetmesh/core/format.hpp>
#include <hetmesh/core/integral.hpp>

using namespace hetmesh::literals;

TEST_CASE("static integers print with an underscore and convert to their value") {
  CHECK(hetmesh::to_string(8_c) == "_8");
  CHECK(hetmesh::value_of(8_c) == 8);
  CHECK(hetmesh::value_of(5) == 5);
  CHECK(hetmesh::is_static_v<decltype(8_c)>);
  CHECK_FALSE(hetmesh::is_static_v<int>);
  CHECK(hetmesh::to_string(1'024_c) == "_1024");
}
