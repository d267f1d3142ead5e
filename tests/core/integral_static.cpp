// Compile-time checks of static integers: this file passes by compiling.
#include <hetmesh/core/integral.hpp>

#include <type_traits>

using namespace hetmesh::literals;

static_assert(std::is_same_v<decltype(8_c), hetmesh::C<8>>);
static_assert(std::is_same_v<decltype(8_c * 2_c), hetmesh::C<16>>);
static_assert(std::is_same_v<decltype(8_c + 2_c), hetmesh::C<10>>);
static_assert(hetmesh::is_static_v<const hetmesh::C<3>&>);
static_assert(!hetmesh::is_static_v<long>);
static_assert(hetmesh::integral_like<int> && hetmesh::integral_like<hetmesh::C<1>> &&
              !hetmesh::integral_like<bool>);
static_assert(8_c * 4 == 32);  // mixing with a dynamic integer yields a dynamic value
static_assert(sizeof(hetmesh::C<8>) == 1 && std::is_empty_v<hetmesh::C<8>>);
