// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan mesh --moe: Megatron-LM's MoE layout (mesh::megatron_moe_mesh). The decoder and expert
// meshes over the same ranks, and every group family Megatron's initialize_model_parallel builds from
// them, in its order; shapes Megatron refuses exit 2 with its reason. --shapes FILE plans many shapes
// in one run (one JSON object per line in, one per line out), for comparing with Megatron itself.
#include <cstdint>
#include <string>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/files.hpp>
#include <hetmesh/core/json_file.hpp>
#include <hetmesh/core/lines.hpp>
#include <hetmesh/mesh/megatron_moe.hpp>

#include "commands.hpp"
#include "output.hpp"

namespace hetmesh_plan {
namespace {

namespace hm = hetmesh::mesh;

constexpr output_format moe_formats[] = {output_format::json, output_format::table};

json moe_json(const hm::megatron_moe_mesh& m) {
  const auto& s = m.sizes();
  json families = json::array();
  for (const auto& f : m.families()) {
    families.push_back({{"name", f.name},
                        {"generator", f.generator},
                        {"token", f.token},
                        {"dims", f.dims},
                        {"groups", f.groups}});
  }
  return {{"world", s.world},
          {"order", s.order},
          {"sizes",
           {{"tp", s.tp},
            {"cp", s.cp},
            {"dp", m.dp()},
            {"pp", s.pp},
            {"etp", s.etp},
            {"ep", s.ep},
            {"edp", m.edp()}}},
          {"decoder", m.decoder().str()},
          {"expert", m.expert().str()},
          {"families", std::move(families)}};
}

// The largest world of one --shapes line (as --world: the output lists every rank's groups), the
// largest other size, and the most ranks a whole --shapes file may list (its output stays < 1 GiB).
constexpr std::int64_t max_shape_world = std::int64_t{1} << 20;
constexpr std::int64_t max_shape_size = std::int64_t{1} << 30;
constexpr std::int64_t max_shapes_ranks = std::int64_t{1} << 22;

// Field `key` of a --shapes line: an integer (not 16.5, not "16", not true) in [lo, hi], or `fallback`
// when absent and not required; usage error naming the file, line, field, value and range otherwise.
std::int64_t shape_int(const json& j, const char* key, std::int64_t lo, std::int64_t hi,
                       std::int64_t fallback, bool required, const std::string& path, std::int64_t line) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required)
      usage_fail("--shapes {} line {}: no \"{}\"; expected an integer in [{}, {}]", path, line, key, lo, hi);
    return fallback;
  }
  const bool integral =
      it->is_number_integer() &&
      (!it->is_number_unsigned() || it->get<std::uint64_t>() <= static_cast<std::uint64_t>(hi));
  if (!integral || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi)
    usage_fail("--shapes {} line {}: \"{}\" = {}; expected an integer in [{}, {}]", path, line, key,
               it->dump(), lo, hi);
  return it->get<std::int64_t>();
}

// One line of --shapes: {"world": 16, "tp": 2, "cp": 1, "pp": 2, "ep": 2, "etp": 1, "order": "..."}.
hm::megatron_moe_sizes sizes_of(const json& j, const std::string& path, std::int64_t line) {
  if (!j.is_object())
    usage_fail("--shapes {} line {}: {}; expected a JSON object such as {{\"world\": 16, \"tp\": 2}}", path,
               line, j.dump());
  hm::megatron_moe_sizes s;
  s.world = shape_int(j, "world", 1, max_shape_world, 0, true, path, line);
  s.tp = shape_int(j, "tp", 1, max_shape_size, 1, false, path, line);
  s.cp = shape_int(j, "cp", 1, max_shape_size, 1, false, path, line);
  s.pp = shape_int(j, "pp", 1, max_shape_size, 1, false, path, line);
  s.ep = shape_int(j, "ep", 1, max_shape_size, 1, false, path, line);
  s.etp = shape_int(j, "etp", 0, max_shape_size, 0, false, path, line);
  s.order = std::string(hm::megatron_order);
  if (const auto it = j.find("order"); it != j.end()) {
    if (!it->is_string())
      usage_fail("--shapes {} line {}: \"order\" = {}; expected a string such as \"tp-cp-ep-dp-pp\"", path,
                 line, it->dump());
    s.order = it->get<std::string>();
  }
  return s;
}

void run_shapes(const std::string& path, std::ostream& out) {
  hetmesh::regular_file_stream in(path, hetmesh::large_file_bytes, "--shapes file");
  std::string line;
  std::int64_t n = 0, ranks = 0;
  while (hetmesh::read_line_bounded(in, line, hetmesh::short_line_bytes, path,
                                    static_cast<std::size_t>(n) + 1)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json shape = hetmesh::parse_json_bounded<json>(line, path, hetmesh::json_max_depth, n);
    const auto sizes = sizes_of(shape, path, n);
    ranks += sizes.world;
    if (ranks > max_shapes_ranks)
      usage_fail(
          "--shapes {} line {}: the shapes so far list {} ranks in all; expected at most {} (the output "
          "lists every rank's groups)",
          path, n, ranks, max_shapes_ranks);
    try {
      out << moe_json(hm::megatron_moe_mesh(sizes)).dump() << '\n';
    } catch (const hetmesh::invalid_argument& e) {
      out << json{{"shape", shape}, {"refused", e.message()}}.dump() << '\n';
    }
  }
}

}  // namespace

void run_mesh_moe(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, moe_formats);
  if (args.has("shapes")) {
    if (format != output_format::json) usage_fail("--shapes prints JSON lines; expected --format json");
    run_shapes(args.str("shapes"), out);
    return;
  }
  hm::megatron_moe_sizes s;
  s.world = args.integer("world", 1, max_shape_world);  // the output lists every rank's groups
  s.tp = args.integer("tp", 1, std::int64_t{1} << 30);
  s.cp = args.integer("cp", 1, std::int64_t{1} << 30);
  s.pp = args.integer("pp", 1, std::int64_t{1} << 30);
  s.ep = args.integer("ep", 1, std::int64_t{1} << 30);
  s.etp = args.has("etp") ? args.integer("etp", 1, std::int64_t{1} << 30) : 0;
  s.order = args.str("order");
  const hm::megatron_moe_mesh m(s);
  if (args.has("dp") && args.integer("dp", 1) != m.dp()) {
    usage_fail(
        "--dp {} with --moe: Megatron-LM derives dp = world / (tp*cp*pp) = {}; expected --dp {} or none",
        args.str("dp"), m.dp(), m.dp());
  }
  const json doc = moe_json(m);
  if (format == output_format::json) {
    print_json(out, doc);
    return;
  }
  out << fmt::format(
      "Megatron-LM MoE mesh over {} ranks, order {}: tp={} cp={} dp={} pp={}, etp={} ep={} edp={}\n",
      m.world(), s.order, s.tp, s.cp, m.dp(), s.pp, m.sizes().etp, s.ep, m.edp());
  out << fmt::format("  decoder {}\n  expert  {}\n", m.decoder().str(), m.expert().str());
  table t{{"Megatron group", "generator", "token", "dims", "groups", "size", "first group"}, {}};
  for (const auto& f : m.families()) {
    t.rows.push_back({f.name, f.generator, f.token, f.dims, std::to_string(f.groups.size()),
                      std::to_string(f.groups.front().size()),
                      fmt::format("{}", fmt::join(f.groups.front(), ","))});
  }
  t.print(out);
}

}  // namespace hetmesh_plan
