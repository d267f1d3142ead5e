// SPDX-License-Identifier: Apache-2.0
// Compile-time checks of static meshes: this file passes by compiling.
#include <hetmesh/mesh/layout.hpp>

#include <type_traits>

using namespace hetmesh::literals;
namespace hm = hetmesh::mesh;

namespace {

// 64 ranks, Megatron order tp-cp-dp: rank = tp + 8*cp + 16*dp.
constexpr auto llm = hm::make_mesh(hm::tp(8_c), hm::cp(2_c), hm::dp(4_c));

static_assert(std::is_same_v<std::remove_const_t<decltype(llm.size())>, hetmesh::C<64>>,
              "a fully static mesh has a static size");
static_assert(llm.stride(hm::tp) == 1 && llm.stride(hm::cp) == 8 && llm.stride(hm::dp) == 16);
static_assert(llm.rank_of({3, 1, 2}) == 3 + 8 + 32);
static_assert(llm.coord_of(43) == decltype(llm)::coord_type{3, 1, 2});
static_assert(llm.coord_of(43, hm::dp) == 2 && llm.coord_of(43, hm::cp) == 1 &&
              llm.coord_of(43, hm::tp) == 3);
static_assert(llm.index_of(hm::dp) == 2 && !llm.has(hm::ep));
static_assert(llm.static_extent(0) && llm.static_stride(2));

// Every rank round-trips, evaluated by the compiler.
constexpr bool round_trips(const auto& m) {
  for (std::int64_t r = 0; r < hetmesh::value_of(m.size()); ++r) {
    if (m.rank_of(m.coord_of(r)) != r) return false;
  }
  return true;
}
static_assert(round_trips(llm));

// A Megatron order string and PyTorch's outermost-first construction give the same mesh.
constexpr auto from_string =
    hm::make_mesh("tp-cp-ep-dp-pp", hm::pp(2_c), hm::dp(2_c), hm::tp(4_c), hm::cp(2_c));
constexpr auto from_torch = hm::make_mesh_outermost(hm::pp(2_c), hm::dp(2_c), hm::cp(2_c), hm::tp(4_c));
static_assert(from_string == from_torch);
static_assert(from_string.stride(hm::pp) == 16 && from_torch.stride(hm::cp) == 4);
static_assert(from_string.rank_of({1, 1, 1, 1}) == 1 + 4 + 8 + 16);
static_assert(round_trips(from_string));

// User-defined dims (an encoder mesh) are as static as the LLM's.
constexpr auto encoder = hm::make_mesh(hm::dim("esp")(4_c), hm::dim("edp")(16_c));
static_assert(std::is_same_v<std::remove_const_t<decltype(encoder.size())>, hetmesh::C<64>>);
static_assert(encoder.coord_of(37, "edp") == 9 && encoder.coord_of(37, "esp") == 1);

// A mesh with a dynamic extent still evaluates in constant expressions; only its size type is dynamic.
constexpr auto mixed = hm::make_mesh(hm::tp(8_c), hm::dp(4));
static_assert(std::is_same_v<std::remove_const_t<decltype(mixed.size())>, std::int64_t>);
static_assert(mixed.rank_of({7, 3}) == 31 && !mixed.static_extent(1) && mixed.static_stride(1));

// A static mesh occupies no storage for its extents.
static_assert(std::is_empty_v<std::tuple<hetmesh::C<8>, hetmesh::C<2>>>);

}  // namespace
