// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan mesh --moe: Megatron-LM's MoE layout (mesh::megatron_moe_mesh). The decoder and expert
// meshes over the same ranks, and every group family Megatron's initialize_model_parallel builds from
// them, in its order; shapes Megatron refuses exit 2 with its reason. --shapes FILE plans many shapes
// in one run (one JSON object per line in, one per line out), for comparing with Megatron itself.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <hetmesh/core/error.hpp>
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

// One line of --shapes: {"world": 16, "tp": 2, "cp": 1, "pp": 2, "ep": 2, "etp": 1, "order": "..."}.
hm::megatron_moe_sizes sizes_of(const json& j) {
  hm::megatron_moe_sizes s;
  s.world = j.at("world").get<std::int64_t>();
  s.tp = j.value("tp", std::int64_t{1});
  s.cp = j.value("cp", std::int64_t{1});
  s.pp = j.value("pp", std::int64_t{1});
  s.ep = j.value("ep", std::int64_t{1});
  s.etp = j.value("etp", std::int64_t{0});
  s.order = j.value("order", std::string(hm::megatron_order));
  return s;
}

void run_shapes(const std::string& path, std::ostream& out) {
  std::ifstream in(path);
  if (!in) usage_fail("--shapes {}: cannot open the file; expected one JSON object per line", path);
  std::string line;
  std::int64_t n = 0;
  while (hetmesh::read_line_bounded(in, line, hetmesh::short_line_bytes, path,
                                    static_cast<std::size_t>(n) + 1)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json shape;
    try {
      shape = json::parse(line);
    } catch (const json::exception& e) {
      usage_fail("--shapes {} line {}: {}; expected a JSON object such as {{\"world\": 16, \"tp\": 2}}", path,
                 n, e.what());
    }
    const auto sizes = sizes_of(shape);
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
  s.world = args.integer("world", 1, std::int64_t{1} << 20);  // the output lists every rank's groups
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
