// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: layout search, MegaScale-Omni's communication-efficient layout. Given the extents of
// a mesh, the bytes each rank sends per step along each dim, and the topology, it tries every order of
// the dims, estimates each order's communication time on the slowest link each dim's groups use, ranks
// the orders and explains the winner against Megatron-LM's default "tp-cp-ep-dp-pp".
//
// Model (modelled, not measured): a dim's groups either all fit inside one node or some span several.
// Its time is the topology's alpha-beta link (mesh::link::transfer): bytes / bandwidth + (extent - 1) *
// latency, with the inter-node link as soon as any of its groups crosses a node boundary (the slowest link
// bounds a ring or an all-to-all). A step's time is the sum over dims (collectives of different dims
// serialised; the default) or the maximum (perfectly overlapped). Admissible orders: every permutation of the
// dims of extent > 1 (at most 8 dims), or those a caller's predicate accepts; extent-1 dims do not move any
// rank and are left out.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "dim.hpp"
#include "topology.hpp"
#include "view.hpp"

namespace hetmesh::mesh {

/// Bytes one rank sends per step along each dim's groups (e.g. tp: all-reduces of activations; dp:
/// the gradient reduce-scatter/all-gather; ep: token all-to-alls). `other` covers user-defined dims.
struct traffic {
  ///@{
  /// Bytes per step over each of the five LLM dims.
  double tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
  ///@}
  std::vector<std::pair<dim, double>> other{};  ///< bytes over other dims, by name

  /// The bytes of dim d (0 when not given).
  [[nodiscard]] double of(const dim& d) const noexcept {
    if (d == mesh::tp) return tp;
    if (d == mesh::cp) return cp;
    if (d == mesh::ep) return ep;
    if (d == mesh::dp) return dp;
    if (d == mesh::pp) return pp;
    for (const auto& [name, bytes] : other) {
      if (name == d) return bytes;
    }
    return 0;
  }
  friend bool operator==(const traffic&, const traffic&) = default;
  void hash_append(hasher& h) const { append_all(h, tp, cp, ep, dp, pp, other); }
};

/// How per-dim times combine into a step's time.
enum class combine { sum, max };

/// How a layout search scores candidates.
struct search_options {
  combine total = combine::sum;  ///< how per-dim times combine into one score
  /// The order to compare with; dims it omits go outermost (by name), names it has beyond the mesh are
  /// ignored.
  std::string baseline = std::string(megatron_order);
  /// Restricts the orders considered (e.g. pp outermost, or tp innermost); it sees each order's dims
  /// innermost first. Empty: every order is admissible. The baseline is always ranked, admissible or
  /// not, because it is the reference the result is compared with.
  std::function<bool(std::span<const dim>)> admissible{};
};

/// One dim under one order.
struct dim_cost {
  dim name;                  ///< the dim
  std::int64_t extent = 1;   ///< its extent
  std::int64_t stride = 1;   ///< its stride in the candidate layout
  double bytes = 0;          ///< bytes per step over it
  int nodes_spanned = 1;     ///< the most nodes any one of its groups occupies
  std::int64_t time_ns = 0;  ///< modelled; fixed point so that ranking is exact on every platform
  /// Whether the dim's groups stay within one node.
  [[nodiscard]] bool in_node() const noexcept { return nodes_spanned <= 1; }
  friend bool operator==(const dim_cost&, const dim_cost&) = default;
  void hash_append(hasher& h) const { append_all(h, name, extent, stride, bytes, nodes_spanned, time_ns); }
};

/// One order and its modelled time.
struct candidate {
  std::string order;           ///< innermost first, e.g. "tp-ep-cp-dp"
  std::vector<dim_cost> dims;  ///< in that order
  std::int64_t time_ns = 0;    ///< modelled communication time, ns
  bool admissible = true;      ///< false only for a baseline that search_options::admissible rejects
  friend bool operator==(const candidate&, const candidate&) = default;
  void hash_append(hasher& h) const { append_all(h, order, dims, time_ns, admissible); }
};

/// The result: every admissible order, best first, with the baseline's place and an explanation.
struct layout_choice {
  std::vector<std::pair<dim, std::int64_t>> shape;  ///< dims of extent > 1, in the baseline's order
  topology topo;                                    ///< the cluster searched over
  traffic load;                                     ///< the traffic priced
  combine total = combine::sum;                     ///< how per-dim times were combined
  std::vector<candidate> ranking;  ///< best first; ties broken by closeness to the baseline order
  std::size_t baseline_index = 0;  ///< where the baseline order sits in `ranking`
  std::size_t best_index = 0;      ///< the first admissible order in `ranking` (0 unless the baseline is not)

  /// The best candidate.
  [[nodiscard]] const candidate& best() const { return ranking.at(best_index); }
  /// The baseline candidate (Megatron's order), for comparison.
  [[nodiscard]] const candidate& baseline() const { return ranking.at(baseline_index); }
  /// baseline time / best time (1 when both are zero).
  [[nodiscard]] double speedup() const {
    if (best().time_ns == 0) return 1.0;
    return static_cast<double>(baseline().time_ns) / static_cast<double>(best().time_ns);
  }
  /// Which groups stay inside a node under the best order, and why it beats (or equals) the baseline.
  [[nodiscard]] std::string explain() const;

  friend bool operator==(const layout_choice&, const layout_choice&) = default;
  void hash_append(hasher& h) const {
    append_all(h, shape, topo, load, static_cast<int>(total), ranking, baseline_index, best_index);
  }
};

namespace detail {

HETMESH_COMPILED std::string format_bytes(double b)
#if HETMESH_BODIES
{
  if (b >= 1e9) return hetmesh::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return hetmesh::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return hetmesh::format("{:.2f} kB", b / 1e3);
  return hetmesh::format("{:.0f} B", b);
}
#else
    ;
#endif
HETMESH_COMPILED std::string format_ns(std::int64_t ns)
#if HETMESH_BODIES
{
  return hetmesh::format("{:.3f} ms", static_cast<double>(ns) / 1e6);
}
#else
    ;
#endif

// The most nodes any group of a compact dim (extent e, stride s) occupies in a world of w ranks.
HETMESH_COMPILED int max_nodes_spanned(std::int64_t e, std::int64_t s, std::int64_t w, const topology& t)
#if HETMESH_BODIES
{
  int worst = 1;
  std::vector<std::int64_t> nodes(static_cast<std::size_t>(e));
  for (std::int64_t base = 0; base < w; ++base) {
    if ((base / s) % e != 0) continue;  // one representative (coordinate 0) per group
    for (std::int64_t i = 0; i < e; ++i)
      nodes[static_cast<std::size_t>(i)] = (base + i * s) / t.devices_per_node;
    std::sort(nodes.begin(), nodes.end());
    worst = std::max(worst, static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin()));
  }
  return worst;
}
#else
    ;
#endif

HETMESH_COMPILED candidate evaluate_order(const std::vector<std::pair<dim, std::int64_t>>& dims,
                                          const traffic& load, const topology& t, combine total)
#if HETMESH_BODIES
{
  candidate c;
  std::int64_t stride = 1, w = 1;
  for (const auto& d : dims) w *= d.second;
  for (const auto& [name, e] : dims) {
    dim_cost dc{name, e, stride, load.of(name), 1, 0};
    dc.nodes_spanned = max_nodes_spanned(e, stride, w, t);
    if (dc.bytes > 0) {
      // The topology's alpha-beta link (ms): the dim's bytes once, one latency per hop of its groups.
      const link l = dc.in_node() ? t.intra() : t.inter();
      const double ns = l.transfer(dc.bytes, static_cast<double>(e - 1)) * 1e6;
      // Fixed point must hold the time (and the sum of five of them): past 10^18 ns (30 years) the
      // inputs are not a cluster, and llround of a larger value is a negative time.
      if (!(ns <= 1e18))
        throw_error<invalid_argument>(
            "layout search: dim '{}' moves {} bytes at {} GB/s: {} ns exceeds the model's bound of 1e18 ns; "
            "expected less traffic or more bandwidth",
            name.name(), dc.bytes, 1e-6 / l.beta, ns);
      dc.time_ns = std::llround(ns);
    }
    c.time_ns = total == combine::sum ? c.time_ns + dc.time_ns : std::max(c.time_ns, dc.time_ns);
    // Appended in place: `"-" + std::string(...)` trips a g++ 12 -O3 -Wrestrict false positive.
    if (!c.order.empty()) c.order += '-';
    c.order += name.name();
    c.dims.push_back(dc);
    stride *= e;
  }
  return c;
}
#else
    ;
#endif

}  // namespace detail

/// Ranks every admissible order of `shape` (dims with extents, any order; extent-1 dims ignored) for `load`
/// on `topo`. Pre: the extents' product equals topo.world(), distinct dims, non-negative traffic, at most 8
/// dims of extent > 1; each violation throws invalid_argument naming it. Pure and deterministic: ties
/// in modelled time (integer nanoseconds) go to the order closest to the baseline (lexicographic on
/// each position's index in the baseline). Cost: O(n! * n * world).
[[nodiscard]] HETMESH_COMPILED layout_choice search_layout(std::vector<std::pair<dim, std::int64_t>> shape,
                                                           const traffic& load, const topology& topo,
                                                           const search_options& options = {})
#if HETMESH_BODIES
{
  topo.validate();
  std::int64_t world = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (shape[i].first == shape[j].first) {
        throw_error<invalid_argument>("layout search got dim '{}' twice: expected distinct dims",
                                      shape[i].first);
      }
    }
    if (shape[i].second < 1) {
      throw_error<invalid_argument>("layout search got dim '{}' with extent {}: expected a positive extent",
                                    shape[i].first, shape[i].second);
    }
    if (!(load.of(shape[i].first) >= 0)) {
      throw_error<invalid_argument>("traffic of dim '{}' is {} bytes: expected a non-negative amount",
                                    shape[i].first, load.of(shape[i].first));
    }
    world *= shape[i].second;
    if (world > INT_MAX) {
      throw_error<invalid_argument>("layout search: the mesh has more than {} ranks: expected an int rank",
                                    INT_MAX);
    }
  }
  if (world != topo.world()) {
    throw_error<invalid_argument>(
        "layout search: the mesh has {} ranks but the topology has {} devices ({} nodes x {}): expected "
        "equal",
        world, topo.world(), topo.nodes, topo.devices_per_node);
  }
  std::erase_if(shape, [](const auto& d) { return d.second == 1; });
  if (shape.size() > 8) {
    throw_error<invalid_argument>("layout search over {} dims of extent > 1: expected at most 8 ({} orders)",
                                  shape.size(), 40320);
  }

  // Baseline order: the baseline string's dims that the mesh has, then the rest (below).
  std::vector<std::pair<dim, std::int64_t>> base;
  detail::for_each_order_token(options.baseline, [&](const dim& d) {
    for (const auto& s : shape) {
      if (s.first == d && std::find(base.begin(), base.end(), s) == base.end()) base.push_back(s);
    }
  });
  // Dims the baseline does not name follow by name, so the input's order never reaches the plan.
  std::vector<std::pair<dim, std::int64_t>> rest;
  for (const auto& s : shape) {
    if (std::find(base.begin(), base.end(), s) == base.end()) rest.push_back(s);
  }
  hetmesh::indirect_sort(rest.begin(), rest.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
  base.insert(base.end(), rest.begin(), rest.end());

  layout_choice out{base, topo, load, options.total, {}, 0, 0};
  std::vector<std::size_t> perm(base.size());
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::vector<std::pair<candidate, std::vector<std::size_t>>> all;
  do {
    std::vector<std::pair<dim, std::int64_t>> dims;
    for (std::size_t k : perm) dims.push_back(base[k]);
    std::vector<dim> names;
    for (const auto& d : dims) names.push_back(d.first);
    const bool is_baseline = std::is_sorted(perm.begin(), perm.end());
    const bool ok = !options.admissible || options.admissible(names);
    if (is_baseline || ok) {
      all.emplace_back(detail::evaluate_order(dims, load, topo, options.total), perm);
      all.back().first.admissible = ok;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  hetmesh::indirect_sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    if (a.first.time_ns != b.first.time_ns) return a.first.time_ns < b.first.time_ns;
    return a.second < b.second;
  });
  bool found = false;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (std::is_sorted(all[i].second.begin(), all[i].second.end())) out.baseline_index = i;
    if (!found && all[i].first.admissible) {
      out.best_index = i;
      found = true;
    }
    out.ranking.push_back(std::move(all[i].first));
  }
  if (!found) {
    throw_error<invalid_argument>(
        "layout search: no order of ({}) is admissible: expected the admissible "
        "predicate to accept at least one order",
        out.ranking.front().order);
  }
  return out;
}
#else
    ;
#endif

/// The same search for the dims and extents of a mesh (its own order is ignored).
template <mesh_like Mesh>
[[nodiscard]] layout_choice search_layout(const Mesh& m, const traffic& load, const topology& topo,
                                          const search_options& options = {}) {
  std::vector<std::pair<dim, std::int64_t>> shape;
  for (std::size_t i = 0; i < m.dims_count(); ++i) shape.emplace_back(m.name(i), m.extent(i));
  return search_layout(std::move(shape), load, topo, options);
}

#if HETMESH_BODIES
HETMESH_COMPILED std::string layout_choice::explain() const {
  const candidate& b = best();
  const candidate& m = baseline();
  auto list = [](const candidate& c, bool inside) {
    std::string s;
    for (const auto& d : c.dims) {
      if (d.in_node() != inside) continue;
      if (!s.empty()) s += ", ";
      s += inside ? hetmesh::format("{} ({})", d.name, d.extent)
                  : hetmesh::format("{} ({} nodes)", d.name, d.nodes_spanned);
    }
    return s.empty() ? std::string("none") : s;
  };
  std::string out =
      hetmesh::format("best order {} ({} per step, modelled); baseline {} ({}); {:.2f}x.\n", b.order,
                      detail::format_ns(b.time_ns), m.order, detail::format_ns(m.time_ns), speedup());
  out += hetmesh::format("  inside one node: {}\n  across nodes:    {}\n", list(b, true), list(b, false));
  if (b.order == m.order || b.time_ns == m.time_ns) {
    out += "  the baseline order is already as fast as any for this traffic";
    return out;
  }
  std::string why;
  for (const auto& d : b.dims) {
    const auto it =
        std::find_if(m.dims.begin(), m.dims.end(), [&](const dim_cost& x) { return x.name == d.name; });
    if (it == m.dims.end() || it->in_node() == d.in_node() || d.bytes == 0) continue;
    why += hetmesh::format("    {} ({}/rank/step) {}: {} -> {}\n", d.name, detail::format_bytes(d.bytes),
                           d.in_node() ? "moves inside a node" : "moves across nodes",
                           detail::format_ns(it->time_ns), detail::format_ns(d.time_ns));
  }
  if (why.empty()) {
    why = "    the same dims stay inside a node; the best order spans fewer nodes with the heavier groups\n";
  }
  out += "  why, against the baseline:\n" + why;
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}
#endif

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::traffic> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::traffic& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    namespace hd = hetmesh::mesh::detail;
    auto out = hetmesh::format_to(ctx.out(), "traffic per rank per step: tp {}, cp {}, ep {}, dp {}, pp {}",
                                  hd::format_bytes(t.tp), hd::format_bytes(t.cp), hd::format_bytes(t.ep),
                                  hd::format_bytes(t.dp), hd::format_bytes(t.pp));
    for (const auto& [d, b] : t.other) out = hetmesh::format_to(out, ", {} {}", d, hd::format_bytes(b));
    return out;
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::combine> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::mesh::combine c, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", c == hetmesh::mesh::combine::sum ? "sum" : "max");
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::search_options> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::search_options& o, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{{total={}, baseline={}, admissible={}}}", o.total, o.baseline,
                              o.admissible ? "restricted" : "all orders");
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::dim_cost> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::dim_cost& d, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "{}={}:{} {} {}", d.name, d.extent, d.stride,
        d.in_node() ? std::string("in-node") : hetmesh::format("{}-nodes", d.nodes_spanned),
        hetmesh::mesh::detail::format_ns(d.time_ns));
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::candidate> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::candidate& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "{:<16} {:>10}  [", c.order,
                                  hetmesh::mesh::detail::format_ns(c.time_ns));
    for (std::size_t i = 0; i < c.dims.size(); ++i)
      out = hetmesh::format_to(out, "{}{}", i ? ", " : "", c.dims[i]);
    return hetmesh::format_to(out, "]");
  }
};

/// Prints the search: header, the five best orders and the baseline, then the explanation.
template <>
struct fmt::formatter<hetmesh::mesh::layout_choice> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::layout_choice& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::string shape;
    for (const auto& [d, e] : c.shape) shape += hetmesh::format("{}{}={}", shape.empty() ? "" : ",", d, e);
    auto out = hetmesh::format_to(ctx.out(),
                                  "layout search over {} orders of ({}) on {}; step time = {} over dims\n",
                                  c.ranking.size(), shape, c.topo, c.total);
    for (std::size_t i = 0; i < c.ranking.size(); ++i) {
      if (i >= 5 && i != c.baseline_index) continue;
      out = hetmesh::format_to(out, "  #{:<3} {}{}\n", i + 1, c.ranking[i],
                               i == c.baseline_index ? "  <- baseline" : "");
    }
    return hetmesh::format_to(out, "{}", c.explain());
  }
};
