// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan mesh: the LLM mesh of a job (tp, cp, ep, dp, pp over the world in an explicit order),
// the groups along each dim and whether they stay inside a node. With --moe, Megatron-LM's MoE layout
// (decoder and expert meshes over the same ranks): cmd_mesh_moe.cpp.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/mesh/layout.hpp>
#include <hetmesh/mesh/search.hpp>
#include <hetmesh/mesh/topology.hpp>

#include "commands.hpp"
#include "output.hpp"

namespace hetmesh_plan {
namespace {

namespace hm = hetmesh::mesh;

constexpr output_format mesh_formats[] = {output_format::json, output_format::table};
constexpr std::string_view dim_names[] = {"tp", "cp", "ep", "dp", "pp"};

// The nodes a group touches (ranks r live on node r / devices_per_node, as launchers number them).
std::int64_t nodes_spanned(const std::vector<int>& group, std::int64_t devices_per_node) {
  std::vector<std::int64_t> nodes;
  for (const int r : group) nodes.push_back(r / devices_per_node);
  std::sort(nodes.begin(), nodes.end());
  return std::unique(nodes.begin(), nodes.end()) - nodes.begin();
}

// The largest world `mesh` plans: its output lists every rank of every group (about 5 x world numbers of
// JSON, ~100 bytes of memory each), so a 2^30-rank world would need ~500 GiB; 2^20 ranks stay under 1 GiB.
constexpr std::int64_t max_world = std::int64_t{1} << 20;
// The layout search evaluates every order of the dims of extent > 1 over every rank: n! x n x world
// placements, ~100 ns each here; 2^25 of them take a few seconds (5 dims over 2^20 ranks would be ~60 s).
constexpr std::int64_t max_search_work = std::int64_t{1} << 25;
// Bytes per rank per step along one dim: 1e14 (100 TB) at the slowest bandwidth accepted keeps every
// modelled time finite and positive.
constexpr double max_traffic_bytes = 1e14;

// --traffic tp=8e9,cp=2e9,...: bytes per rank per step along each dim's groups; each dim at most once.
hm::traffic traffic_of(const std::string& text) {
  hm::traffic t;
  std::vector<std::string_view> seen;
  for (const auto field : split_commas(text)) {
    const auto eq = field.find('=');
    if (eq == std::string_view::npos) {
      usage_fail(
          "option --traffic '{}': '{}' is not DIM=BYTES; expected e.g. tp=8e9,cp=2e9,ep=4e9,dp=1e9,pp=2.5e8",
          text, field);
    }
    const auto name = field.substr(0, eq);
    if (std::find(seen.begin(), seen.end(), name) != seen.end())
      usage_fail("option --traffic '{}': dim {} given twice; expected each dim at most once", text, name);
    seen.push_back(name);
    const double bytes = parse_real(field.substr(eq + 1), fmt::format("option --traffic {}", name));
    if (bytes < 0 || bytes > max_traffic_bytes)
      usage_fail("option --traffic {}={}: expected bytes in [0, {:g}]", name, field.substr(eq + 1),
                 max_traffic_bytes);
    if (name == "tp") {
      t.tp = bytes;
    } else if (name == "cp") {
      t.cp = bytes;
    } else if (name == "ep") {
      t.ep = bytes;
    } else if (name == "dp") {
      t.dp = bytes;
    } else if (name == "pp") {
      t.pp = bytes;
    } else {
      usage_fail("option --traffic: unknown dim '{}'; expected tp, cp, ep, dp or pp", name);
    }
  }
  return t;
}

json candidate_json(const hm::candidate& c) {
  json dims = json::array();
  for (const auto& d : c.dims) {
    dims.push_back({{"name", std::string(d.name.name())},
                    {"extent", d.extent},
                    {"stride", d.stride},
                    {"bytes", d.bytes},
                    {"nodes_spanned", d.nodes_spanned},
                    {"in_node", d.in_node()},
                    {"time_model_ms", static_cast<double>(d.time_ns) * 1e-6}});
  }
  return {{"order", c.order},
          {"time_model_ms", static_cast<double>(c.time_ns) * 1e-6},
          {"dims", std::move(dims)}};
}

void run_mesh(const parsed& args, std::ostream& out) {
  if (args.flag("moe")) {
    run_mesh_moe(args, out);
    return;
  }
  if (args.has("etp") || args.has("shapes"))
    usage_fail("--etp and --shapes describe a MoE mesh; expected --moe");
  const auto format = format_of(args, mesh_formats);
  const std::int64_t world = args.integer("world", 1, std::int64_t{1} << 40);
  if (world > max_world) {
    usage_fail(
        "option --world {}: the mesh lists every rank of every group, about {:.0f} GiB for this world; "
        "expected at most {} ranks",
        world, static_cast<double>(world) * 5 * 100 / (1 << 30), max_world);
  }
  const std::int64_t dpn = args.integer("devices-per-node", 1, std::int64_t{1} << 20);
  std::int64_t ext[5] = {1, 1, 1, 1, 1};
  std::int64_t others = 1;
  for (std::size_t i = 0; i < 5; ++i) {
    const std::string name(dim_names[i]);
    if (name == "dp" && !args.has("dp")) continue;
    ext[i] = args.integer(name, 1, max_world);
    if (name != "dp") others *= ext[i];  // <= 2^20 x 2^20: others stays <= world below
    if (others > world)
      usage_fail(
          "option --{} {}: tp*cp*ep*pp = {} so far exceeds --world {}; expected a product that divides it",
          name, ext[i], others, world);
  }
  if (!args.has("dp")) {
    // dp absorbs the rest of the world, as Megatron-LM derives it.
    if (world % others != 0) {
      usage_fail(
          "--world {} is not divisible by tp*cp*ep*pp = {}; expected a world size that is a multiple of it",
          world, others);
    }
    ext[3] = world / others;
  }
  const auto mesh = hm::make_mesh(args.str("order"), hm::tp(ext[0]), hm::cp(ext[1]), hm::ep(ext[2]),
                                  hm::dp(ext[3]), hm::pp(ext[4]));
  mesh.check_world(world);

  json doc;
  doc["world"] = world;
  doc["order"] = mesh.order_string();
  doc["mesh"] = mesh.str();
  doc["devices_per_node"] = dpn;
  doc["nodes"] = (world + dpn - 1) / dpn;
  json dims = json::array();
  table t{{"dim", "extent", "stride", "groups", "nodes/group", "intra-node", "group of rank 0"}, {}};
  for (std::size_t i = 0; i < mesh.dims_count(); ++i) {
    const hm::dim d = mesh.name(i);
    if (mesh.extent(i) == 1) continue;  // an extent-1 dim has one-rank groups: noise, and "mesh" shows it
    const std::vector<hm::dim> along{d};
    const auto groups = mesh.groups(std::span<const hm::dim>(along));
    std::int64_t span = 0;
    for (const auto& g : groups) span = std::max(span, nodes_spanned(g, dpn));
    dims.push_back({{"name", std::string(d.name())},
                    {"extent", mesh.extent(i)},
                    {"stride", mesh.stride(i)},
                    {"max_nodes_per_group", span},
                    {"intra_node", span == 1},
                    {"groups", groups}});
    t.rows.push_back({std::string(d.name()), std::to_string(mesh.extent(i)), std::to_string(mesh.stride(i)),
                      std::to_string(groups.size()), std::to_string(span), span == 1 ? "yes" : "no",
                      fmt::format("{}", fmt::join(groups.front(), ","))});
  }
  doc["dims"] = std::move(dims);

  // The layout search: every order of the dims, ranked by modelled communication time on the
  // topology; the baseline is the order given (Megatron-LM's by default).
  if (world > dpn && world % dpn != 0) {
    usage_fail("--world {} is not a whole number of nodes of --devices-per-node {}; expected a multiple",
               world, dpn);
  }
  {
    std::int64_t n = 0, orders = 1;
    for (std::size_t i = 0; i < mesh.dims_count(); ++i)
      if (mesh.extent(i) > 1) orders *= ++n;  // n! after the loop (n <= 5)
    const std::int64_t work = orders * std::max<std::int64_t>(n, 1) * world;
    if (work > max_search_work)
      usage_fail(
          "mesh: the layout search would evaluate {} placements ({} orders x {} dims x {} ranks); expected "
          "at "
          "most {} (a smaller --world or fewer dims of extent > 1)",
          work, orders, n, world, max_search_work);
  }
  hm::topology topo{.nodes = static_cast<int>(world > dpn ? world / dpn : 1),
                    .devices_per_node = static_cast<int>(world > dpn ? dpn : world),
                    .intra_bw_gbps = args.real("intra-gbps", 1e-3, 1e6),
                    .inter_bw_gbps = args.real("inter-gbps", 1e-3, 1e6)};
  const auto load = traffic_of(args.str("traffic"));
  const std::string_view combines[] = {"sum", "max"};
  const hm::search_options opts{
      .total = args.choice("combine", combines) == "max" ? hm::combine::max : hm::combine::sum,
      .baseline = mesh.order_string()};
  const auto choice = hm::search_layout(mesh, load, topo, opts);
  std::vector<std::string> reasons;
  {
    const std::string text = choice.explain();
    std::size_t at = 0;
    while (at <= text.size()) {
      const auto nl = text.find('\n', at);
      reasons.push_back(text.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
  }
  json ranking = json::array();
  for (std::size_t i = 0; i < choice.ranking.size() && i < 5; ++i)
    ranking.push_back(candidate_json(choice.ranking[i]));
  doc["search"] = {
      {"traffic", {{"tp", load.tp}, {"cp", load.cp}, {"ep", load.ep}, {"dp", load.dp}, {"pp", load.pp}}},
      {"intra_gbps", topo.intra_bw_gbps},
      {"inter_gbps", topo.inter_bw_gbps},
      {"orders", choice.ranking.size()},
      {"best", candidate_json(choice.best())},
      {"baseline", candidate_json(choice.baseline())},
      {"baseline_rank", choice.baseline_index + 1},
      {"speedup", choice.speedup()},
      {"reasons", reasons},
      {"top", std::move(ranking)}};
  require_finite(doc);
  if (format == output_format::json) {
    print_json(out, doc);
  } else {
    out << fmt::format("mesh {} over {} ranks ({} nodes x {} devices)\n", mesh.str(), world,
                       doc["nodes"].get<std::int64_t>(), dpn);
    t.print(out);
    out << fmt::format("\nlayout search ({} orders, traffic per rank per step: {}):\n", choice.ranking.size(),
                       args.str("traffic"));
    for (const auto& line : reasons) out << "  " << line << '\n';
  }
}

}  // namespace

std::vector<subcommand> mesh_commands() {
  command_spec spec("mesh",
                    "The LLM mesh: layout, groups along each dim, and which groups stay inside a node.");
  spec.option("world", "N", "number of ranks (required, except with --moe --shapes)")
      .option("order", "ORDER", "dims joined by '-', fastest-varying first (Megatron-LM notation)",
              "tp-cp-ep-dp-pp")
      .option("tp", "N", "tensor-parallel degree", "1")
      .option("cp", "N", "context-parallel degree", "1")
      .option("ep", "N", "expert-parallel degree (with --moe: of the expert mesh)", "1")
      .option("dp", "N", "data-parallel degree (default: world / (tp*cp*ep*pp))")
      .option("pp", "N", "pipeline-parallel degree", "1")
      .option("devices-per-node", "N", "devices per node; rank r is on node r / N",
              fmt::format("{}", hm::topology{}.devices_per_node))
      .option("traffic", "tp=B,cp=B,...",
              "layout search: bytes per rank per step along each dim (default: an illustrative 7B-class mix)",
              "tp=8e9,cp=2e9,ep=4e9,dp=1e9,pp=2.5e8")
      .option("intra-gbps", "B", "layout search: intra-node bandwidth per device, GB/s",
              fmt::format("{}", hm::topology{}.intra_bw_gbps))
      .option("inter-gbps", "B", "layout search: inter-node bandwidth per device, GB/s",
              fmt::format("{}", hm::topology{}.inter_bw_gbps))
      .option("combine", "HOW", "layout search: sum or max of the per-dim times", "sum")
      .option("format", "FMT", "json or table", "json")
      .flag("moe",
            "Megatron-LM's MoE layout: a decoder mesh (tp, cp, dp, pp) and an expert mesh (etp, ep, edp, pp) "
            "over "
            "the same ranks, and every group family Megatron builds from them; no layout search")
      .option("etp", "N", "with --moe: expert tensor-parallel degree (default: --tp, as in Megatron-LM)")
      .option(
          "shapes", "FILE",
          "with --moe: one shape per line ({\"world\": 16, \"tp\": 2, \"pp\": 2, \"ep\": 4, \"etp\": 1, "
          "\"order\": \"tp-cp-ep-pp-dp\"}); prints one JSON object per line, {\"shape\": ..., \"refused\": "
          "reason} for a shape Megatron refuses")
      .epilog(
          "The layout search ranks every order of the dims (extent > 1) by modelled communication time on\n"
          "nodes of --devices-per-node devices and compares the best with the given --order.\n\n"
          "output (json):\n"
          "  {\"world\": 16, \"order\": \"tp-cp-ep-dp-pp\", \"mesh\": "
          "\"(tp=8,cp=2,ep=1,dp=1,pp=1):(1,8,16,16,16)\",\n"
          "   \"devices_per_node\": 8, \"nodes\": 2,\n"
          "   \"dims\": [{\"name\": \"tp\", \"extent\": 8, \"stride\": 1, \"max_nodes_per_group\": 1,\n"
          "             \"intra_node\": true, \"groups\": [[0, 1, ...], ...]}, ...],\n"
          "   \"search\": {\"traffic\": {...}, \"orders\": 2, \"best\": {\"order\": \"tp-cp\", "
          "\"time_model_ms\": ..,\n"
          "              \"dims\": [...]}, \"baseline\": {...}, \"baseline_rank\": 1, \"speedup\": 1.0,\n"
          "              \"reasons\": [\"best order tp-cp ...\", ...], \"top\": [...]}}\n\n"
          "--moe builds Megatron-LM's decoder and expert meshes (world = tp*cp*dp*pp = etp*ep*edp*pp) for "
          "its\n"
          "orders tp-cp-ep-dp-pp and tp-cp-ep-pp-dp, and exits 2 with Megatron's reason for a shape it "
          "refuses.\n"
          "output (--moe, json):\n"
          "  {\"world\": 16, \"order\": \"tp-cp-ep-dp-pp\", \"sizes\": {\"tp\": 2, \"cp\": 2, \"dp\": 2, "
          "\"pp\": 2, "
          "\"etp\": 1,\n"
          "   \"ep\": 4, \"edp\": 2}, \"decoder\": \"(tp=2,cp=2,ep=1,dp=2,pp=2):(1,2,4,4,8)\", \"expert\": "
          "\"...\",\n"
          "   \"families\": [{\"name\": \"DATA_PARALLEL_GROUP_WITH_CP\", \"generator\": \"decoder\", "
          "\"token\": "
          "\"dp-cp\",\n"
          "                 \"dims\": \"cp-dp\", \"groups\": [[0, 2, 4, 6], ...]}, ...]}\n\n"
          "example:\n"
          "  hetmesh-plan mesh --world 64 --tp 8 --cp 2 --pp 2 --format table\n"
          "  hetmesh-plan mesh --moe --world 16 --tp 2 --cp 2 --pp 2 --ep 4 --etp 1 --format table\n");
  return {{std::move(spec), run_mesh}};
}

}  // namespace hetmesh_plan
