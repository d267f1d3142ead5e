// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: Megatron-LM's mixture-of-experts layout. Megatron-core numbers the same ranks twice:
// a decoder mesh for the attention layers (tp, cp, dp, pp; ep has extent 1 there) and an expert mesh
// for the MoE layers (expert tensor parallel etp, ep, expert data parallel edp, pp; cp has extent 1
// there), both built from one order string by its two RankGenerators. Expert parallelism is therefore
// folded into the attention layers' dp x cp ranks: world = tp*cp*dp*pp = etp*ep*edp*pp. Treating ep as
// an ordinary fifth dim of one mesh gives other expert groups whenever cp > 1, and other pp groups
// under the order "tp-cp-ep-pp-dp"; this header builds the pair as Megatron does.
//
//   const mesh::megatron_moe_mesh m({.world = 64, .tp = 2, .cp = 2, .pp = 2, .ep = 4, .etp = 1});
//   m.decoder_groups("dp-cp");   // Megatron's DATA_PARALLEL_GROUP_WITH_CP, in its order
//   m.expert_groups("tp-ep");    // EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP
//   m.families();                // every group family initialize_model_parallel builds
//
// Shapes Megatron refuses throw invalid_argument with Megatron's reason. Checked against
// megatron-core 0.16.1 for every shape up to 128 ranks (scripts/peers/mesh_vs_megatron.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "dim.hpp"
#include "layout.hpp"

namespace hetmesh::mesh {

/// Megatron's expert tensor-parallel dim: tp of the MoE layers (Megatron's expert_tensor_parallel_size).
inline constexpr dim etp{"etp"};
/// Megatron's expert data-parallel dim: the data-parallel replicas of each expert (world / (etp*ep*pp)).
inline constexpr dim edp{"edp"};

/// The sizes Megatron-LM's initialize_model_parallel takes for a MoE model (dp and edp are derived, as
/// Megatron derives them). Aggregate; `==`; printable.
struct megatron_moe_sizes {
  std::int64_t world = 1;  ///< number of ranks
  std::int64_t tp = 1;     ///< tensor parallel (attention layers)
  std::int64_t cp = 1;     ///< context parallel
  std::int64_t pp = 1;     ///< pipeline parallel (shared by both meshes)
  std::int64_t ep = 1;     ///< expert parallel
  std::int64_t etp = 0;    ///< expert tensor parallel; 0 means tp (Megatron's default when unset)
  /// Megatron's order string, innermost first: "tp-cp-ep-dp-pp" (its default) or "tp-cp-ep-pp-dp"
  /// (--use-tp-pp-dp-mapping); any order over tp cp ep dp pp is taken as Megatron takes it.
  std::string order = std::string(megatron_order);

  friend bool operator==(const megatron_moe_sizes&, const megatron_moe_sizes&) = default;
  void hash_append(hasher& h) const { append_all(h, world, tp, cp, pp, ep, etp, order); }
};

/// One family of process groups Megatron-LM's initialize_model_parallel builds: its name there (the
/// group_desc, e.g. "MODEL_PARALLEL_GROUP"), which rank generator built it and with which token, the
/// same dims in hetmesh's names, and every group in Megatron's order.
struct megatron_group_family {
  std::string name;                      ///< Megatron's group_desc, e.g. "EXPERT_DATA_PARALLEL_GROUP"
  std::string generator;                 ///< "decoder" or "expert": the RankGenerator it comes from
  std::string token;                     ///< the RankGenerator token, e.g. "tp-dp-cp"
  std::string dims;                      ///< the same dims in this mesh's names, e.g. "tp-cp-dp"
  std::vector<std::vector<int>> groups;  ///< every group, in Megatron's order

  friend bool operator==(const megatron_group_family&, const megatron_group_family&) = default;
  void hash_append(hasher& h) const { append_all(h, name, generator, token, dims, groups); }
};

/// Megatron-LM's decoder and expert meshes over the same ranks (see the file comment). A value:
/// copyable, comparable, printable.
class megatron_moe_mesh {
 public:
  /// The decoder mesh's type: tp, cp, ep (extent 1), dp, pp, in the order string's order.
  using decoder_layout = layout<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  /// The expert mesh's type: etp, ep, edp, pp, in the order string's order (cp left out: extent 1).
  using expert_layout = layout<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

  /// Builds both meshes as initialize_model_parallel does, refusing what it refuses, in its order:
  ///  1. world not divisible by tp*cp*pp (Megatron: "world_size (W) is not divisible by M");
  ///  2. a dim of size > 1 the order does not list (RankGenerator: "... you haven't specified the order");
  ///  3. world not divisible by etp*ep*pp ("... expert_tensor_model_pipeline_parallel size (M)");
  ///  4. pp > 1, an order not ending in pp and edp != dp ("When not using pp-last rank ordering, the
  ///     data parallel size of the attention and moe layers must be the same");
  ///  5. decoder and expert pp groups that differ ("Pipeline parallel groups are expected to be the
  ///     same for Non-Expert and Expert part").
  /// Each is an invalid_argument quoting Megatron's reason; so are sizes < 1 and order strings with an
  /// unknown or repeated dim (where Megatron fails without a reason). Pure; O(world).
  explicit HETMESH_COMPILED megatron_moe_mesh(const megatron_moe_sizes& sizes);

  /// The sizes, with etp resolved (never 0).
  [[nodiscard]] const megatron_moe_sizes& sizes() const noexcept { return sizes_; }
  /// Number of ranks.
  [[nodiscard]] std::int64_t world() const noexcept { return sizes_.world; }
  /// Data-parallel size of the attention layers: world / (tp*cp*pp).
  [[nodiscard]] std::int64_t dp() const { return decoder_.extent(mesh::dp); }
  /// Expert data-parallel size: world / (etp*ep*pp).
  [[nodiscard]] std::int64_t edp() const { return expert_.extent(mesh::edp); }
  /// The attention layers' mesh (Megatron's decoder RankGenerator).
  [[nodiscard]] const decoder_layout& decoder() const noexcept { return decoder_; }
  /// The MoE layers' mesh (Megatron's expert RankGenerator).
  [[nodiscard]] const expert_layout& expert() const noexcept { return expert_; }

  /// The groups Megatron's decoder RankGenerator returns for `token` (dims of tp cp ep dp pp joined by
  /// '-', in any order: get_ranks orders a group by the mesh order, not the token's). Throws
  /// invalid_argument for an unknown or repeated dim. Pure; O(world).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::vector<int>> decoder_groups(std::string_view token) const;
  /// The groups Megatron's expert RankGenerator returns for `token`, in Megatron's names: "tp" is etp,
  /// "dp" is edp, "cp" has extent 1 (e.g. "tp-ep" is EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP). Throws
  /// invalid_argument for an unknown or repeated dim. Pure; O(world).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::vector<int>> expert_groups(std::string_view token) const;

  /// Every group family initialize_model_parallel builds (one distributed-optimizer instance, no
  /// hierarchical cp, no gloo duplicates), in the order it builds them: the decoder's dp-cp, dp, cp,
  /// tp-pp, tp, pp, embedding (first and last stage of each pp group), position embedding (first
  /// stage), tp-dp-cp, tp-dp, tp-cp; the expert's ep, tp, tp-ep, tp-ep-pp, dp, and the optimizer
  /// instance group (all tp-ep-pp groups, concatenated). Pure; O(world * families).
  [[nodiscard]] HETMESH_COMPILED std::vector<megatron_group_family> families() const;

  friend bool operator==(const megatron_moe_mesh& a, const megatron_moe_mesh& b) {
    return a.sizes_ == b.sizes_;
  }
  void hash_append(hasher& h) const { append(h, sizes_); }

  /// `megatron_moe_mesh{decoder (tp=2,...):(...), expert (etp=1,...):(...)}`.
  [[nodiscard]] HETMESH_COMPILED std::string str() const;

 private:
  [[noreturn]] static void refuse_sizes(const megatron_moe_sizes& s, const std::string& why) {
    throw_error<invalid_argument>(
        "Megatron-LM refuses the MoE mesh world={} tp={} cp={} pp={} ep={} etp={} order {}: {}", s.world,
        s.tp, s.cp, s.pp, s.ep, s.etp, s.order, why);
  }

  // a*b*c when it is at most `world`, else 0 (so that no size overflows the product).
  static HETMESH_COMPILED std::int64_t product_upto(std::int64_t world, std::int64_t a, std::int64_t b,
                                                    std::int64_t c);
  static HETMESH_COMPILED std::string product_text(std::int64_t product, std::int64_t a, std::int64_t b,
                                                   std::int64_t c);

  // Megatron's checks 1-3 (see the constructor), before any mesh exists.
  static HETMESH_COMPILED megatron_moe_sizes checked(megatron_moe_sizes s);

  static HETMESH_COMPILED decoder_layout make_decoder(const megatron_moe_sizes& s);
  // The expert generator reads the same order with tp meaning etp and dp meaning edp.
  static HETMESH_COMPILED std::string expert_order(std::string_view order);
  static HETMESH_COMPILED expert_layout make_expert(const megatron_moe_sizes& s);

  // A token's dims in this mesh's names and in mesh order (get_ranks' mask follows the order string).
  template <class L>
  static std::vector<dim> token_dims(const L& mesh, std::string_view token, bool expert) {
    std::vector<std::size_t> at;
    std::vector<dim> seen;
    detail::for_each_order_token(token, [&](const dim& d) {
      if (!is_llm_dim(d) || std::find(seen.begin(), seen.end(), d) != seen.end()) {
        throw_error<invalid_argument>(
            "megatron_moe_mesh: token \"{}\" names '{}' {}; expected distinct dims of tp, cp, ep, dp, pp",
            token, d, is_llm_dim(d) ? "twice" : "");
      }
      seen.push_back(d);
      const dim m = !expert ? d : d == tp ? etp : d == mesh::dp ? mesh::edp : d;
      if (mesh.has(m)) at.push_back(mesh.index_of(m));  // the expert mesh has no cp: extent 1
    });
    std::sort(at.begin(), at.end());
    std::vector<dim> out;
    for (std::size_t i : at) out.push_back(mesh.name(i));
    return out;
  }
  template <class L>
  static std::vector<std::vector<int>> token_groups(const L& mesh, std::string_view token, bool expert) {
    const auto dims = token_dims(mesh, token, expert);
    return mesh.groups(std::span<const dim>(dims));
  }
  [[nodiscard]] HETMESH_COMPILED std::string ours(std::string_view token, bool expert) const;

  megatron_moe_sizes sizes_;
  decoder_layout decoder_;
  expert_layout expert_;
};

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::megatron_moe_sizes> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::megatron_moe_sizes& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "megatron_moe_sizes{{world={}, tp={}, cp={}, pp={}, ep={}, etp={}, {}}}",
                              s.world, s.tp, s.cp, s.pp, s.ep, s.etp, s.order);
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::megatron_group_family> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::megatron_group_family& f, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{} ({} {}: {} groups of {})", f.name, f.generator, f.token,
                              f.groups.size(), f.groups.empty() ? 0 : f.groups.front().size());
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::megatron_moe_mesh> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::megatron_moe_mesh& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m.str());
  }
};

#if HETMESH_BODIES

namespace hetmesh::mesh {

HETMESH_COMPILED megatron_moe_mesh::megatron_moe_mesh(const megatron_moe_sizes& sizes)
    : sizes_(checked(sizes)), decoder_(make_decoder(sizes_)), expert_(make_expert(sizes_)) {
  if (sizes_.pp > 1 && !sizes_.order.ends_with("pp") && dp() != edp()) {
    refuse_sizes(sizes_,
                 hetmesh::format("with pp = {} and an order not ending in pp, dp ({}) and edp ({}) differ: "
                                 "when not using pp-last rank ordering, the data parallel size of the "
                                 "attention and moe layers must be the same; expected tp*cp == etp*ep, "
                                 "pp = 1 or an order ending in pp",
                                 sizes_.pp, dp(), edp()));
  }
  if (decoder_groups("pp") != expert_groups("pp")) {
    refuse_sizes(sizes_,
                 hetmesh::format("pipeline parallel groups are expected to be the same for the non-expert "
                                 "and expert parts, but the decoder's pp group of rank 0 is {} and the "
                                 "expert's {}; expected an order where pp has the same stride in both "
                                 "meshes",
                                 decoder_.group_of(0, pp), expert_.group_of(0, pp)));
  }
}

HETMESH_COMPILED std::vector<std::vector<int>> megatron_moe_mesh::decoder_groups(
    std::string_view token) const {
  return token_groups(decoder_, token, false);
}

HETMESH_COMPILED std::vector<std::vector<int>> megatron_moe_mesh::expert_groups(
    std::string_view token) const {
  return token_groups(expert_, token, true);
}

HETMESH_COMPILED std::vector<megatron_group_family> megatron_moe_mesh::families() const {
  std::vector<megatron_group_family> out;
  const auto add = [&](const char* name, bool expert, const char* token) {
    out.push_back({name, expert ? "expert" : "decoder", token, ours(token, expert),
                   expert ? expert_groups(token) : decoder_groups(token)});
  };
  add("DATA_PARALLEL_GROUP_WITH_CP", false, "dp-cp");
  add("DATA_PARALLEL_GROUP", false, "dp");
  add("CONTEXT_PARALLEL_GROUP", false, "cp");
  add("MODEL_PARALLEL_GROUP", false, "tp-pp");
  add("TENSOR_MODEL_PARALLEL_GROUP", false, "tp");
  add("PIPELINE_MODEL_PARALLEL_GROUP", false, "pp");
  megatron_group_family emb{"EMBEDDING_GROUP", "decoder", "pp", "pp", {}};
  megatron_group_family pos{"POSITION_EMBEDDING_GROUP", "decoder", "pp", "pp", {}};
  for (const auto& g : out.back().groups) {
    emb.groups.push_back(g.size() == 1 ? std::vector<int>{g.front()} : std::vector<int>{g.front(), g.back()});
    pos.groups.push_back({g.front()});
  }
  out.push_back(std::move(emb));
  out.push_back(std::move(pos));
  add("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", false, "tp-dp-cp");
  add("TENSOR_AND_DATA_PARALLEL_GROUP", false, "tp-dp");
  add("TENSOR_AND_CONTEXT_PARALLEL_GROUP", false, "tp-cp");
  add("EXPERT_MODEL_PARALLEL_GROUP", true, "ep");
  add("EXPERT_TENSOR_PARALLEL_GROUP", true, "tp");
  add("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", true, "tp-ep");
  add("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", true, "tp-ep-pp");
  add("EXPERT_DATA_PARALLEL_GROUP", true, "dp");
  megatron_group_family opt{
      "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "expert", "tp-ep-pp", ours("tp-ep-pp", true), {{}}};
  for (const auto& g : expert_groups("tp-ep-pp"))
    opt.groups.front().insert(opt.groups.front().end(), g.begin(), g.end());
  out.push_back(std::move(opt));
  return out;
}

HETMESH_COMPILED std::string megatron_moe_mesh::str() const {
  return hetmesh::format("megatron_moe_mesh{{decoder {}, expert {}}}", decoder_.str(), expert_.str());
}

HETMESH_COMPILED std::int64_t megatron_moe_mesh::product_upto(std::int64_t world, std::int64_t a,
                                                              std::int64_t b, std::int64_t c) {
  if (a > world || b > world || c > world || a * b > world || a * b * c > world) return 0;
  return a * b * c;
}

HETMESH_COMPILED std::string megatron_moe_mesh::product_text(std::int64_t product, std::int64_t a,
                                                             std::int64_t b, std::int64_t c) {
  return product != 0 ? hetmesh::format("{}", product) : hetmesh::format("{}*{}*{}", a, b, c);
}

HETMESH_COMPILED megatron_moe_sizes megatron_moe_mesh::checked(megatron_moe_sizes s) {
  const std::pair<const char*, std::int64_t> given[] = {{"world", s.world}, {"tp", s.tp}, {"cp", s.cp},
                                                        {"pp", s.pp},       {"ep", s.ep}, {"etp", s.etp}};
  for (const auto& [name, v] : given) {
    if (v < (std::string_view(name) == "etp" ? 0 : 1)) {
      throw_error<invalid_argument>("megatron_moe_mesh: {} = {}; expected >= 1{}", name, v,
                                    std::string_view(name) == "etp" ? " (or 0 for etp = tp)" : "");
    }
  }
  if (s.etp == 0) s.etp = s.tp;
  std::vector<dim> listed;
  detail::for_each_order_token(s.order, [&](const dim& d) {
    if (!is_llm_dim(d)) {
      throw_error<invalid_argument>(
          "megatron_moe_mesh: unknown dim '{}' in order \"{}\"; expected tp, cp, ep, dp, pp", d, s.order);
    }
    if (std::find(listed.begin(), listed.end(), d) != listed.end()) {
      throw_error<invalid_argument>(
          "megatron_moe_mesh: order \"{}\" lists '{}' twice; expected each dim once", s.order, d);
    }
    listed.push_back(d);
  });
  const auto unlisted = [&](const dim& d, std::int64_t size) {
    if (size != 1 && std::find(listed.begin(), listed.end(), d) == listed.end()) {
      refuse_sizes(s, hetmesh::format("the size of ({}) is ({}), but the order does not list it; expected "
                                      "every dim of size > 1 in the order",
                                      d, size));
    }
  };
  const std::int64_t model = product_upto(s.world, s.tp, s.pp, s.cp);
  if (model == 0 || s.world % model != 0) {
    refuse_sizes(s,
                 hetmesh::format("world_size ({}) is not divisible by tp*pp*cp = {}; expected a world that "
                                 "is a multiple of it",
                                 s.world, product_text(model, s.tp, s.pp, s.cp)));
  }
  unlisted(tp, s.tp);
  unlisted(cp, s.cp);
  unlisted(mesh::dp, s.world / model);
  unlisted(pp, s.pp);
  const std::int64_t expert_model = product_upto(s.world, s.etp, s.ep, s.pp);
  if (expert_model == 0 || s.world % expert_model != 0) {
    refuse_sizes(s,
                 hetmesh::format("world_size ({}) is not divisible by expert_tensor_model_pipeline_parallel "
                                 "size etp*ep*pp = {}; expected a world that is a multiple of it",
                                 s.world, product_text(expert_model, s.etp, s.ep, s.pp)));
  }
  unlisted(tp, s.etp);
  unlisted(ep, s.ep);
  unlisted(mesh::dp, s.world / expert_model);
  return s;
}

HETMESH_COMPILED megatron_moe_mesh::decoder_layout megatron_moe_mesh::make_decoder(
    const megatron_moe_sizes& s) {
  return make_mesh(s.order, tp(s.tp), cp(s.cp), ep(std::int64_t{1}), mesh::dp(s.world / (s.tp * s.cp * s.pp)),
                   pp(s.pp));
}

HETMESH_COMPILED std::string megatron_moe_mesh::expert_order(std::string_view order) {
  std::string out;
  detail::for_each_order_token(order, [&](const dim& d) {
    if (!out.empty()) out += '-';
    out += d == tp ? "etp" : d == mesh::dp ? "edp" : std::string(d.name());
  });
  return out;
}

HETMESH_COMPILED megatron_moe_mesh::expert_layout megatron_moe_mesh::make_expert(
    const megatron_moe_sizes& s) {
  return make_mesh(expert_order(s.order), etp(s.etp), ep(s.ep), mesh::edp(s.world / (s.etp * s.ep * s.pp)),
                   pp(s.pp));
}

HETMESH_COMPILED std::string megatron_moe_mesh::ours(std::string_view token, bool expert) const {
  std::string s;
  const auto dims = expert ? token_dims(expert_, token, true) : token_dims(decoder_, token, false);
  for (const dim& d : dims) s += hetmesh::format("{}{}", s.empty() ? "" : "-", d.name());
  return s;
}

}  // namespace hetmesh::mesh

#endif  // HETMESH_BODIES
