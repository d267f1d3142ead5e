// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the JSON spelling of mixture_config. Unknown keys are errors (a misspelt "wieght" must
// not silently become the default). A weight is a number (constant) or a list of [step, weight] pairs
// (a piecewise-linear curriculum). Example:
//   {"seed": 7, "global_batch": 64,
//    "sources": [{"name": "web", "format": "indexed", "paths": ["/d/web"], "weight": [[0, 0.8], [1000,
//    0.5]]},
//                {"name": "code", "paths": ["/d/code"], "weight": [[0, 0.2], [1000, 0.5]]}],
//    "cost": {"linear": 1, "quadratic": 1}, "balance": "lpt",
//    "layout": {"order": "tp-cp-ep-dp-pp", "tp": 2, "dp": 4}, "micro_batches": 2}
// (layout: an order string, default Megatron-LM's, and the extents of tp cp ep dp pp, default 1)
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "mixture.hpp"

namespace hetmesh::data {

namespace detail {

inline void check_keys(const nlohmann::json& j, std::initializer_list<const char*> allowed,
                       const std::string& where) {
  if (!j.is_object()) throw_error<invalid_argument>("{}: expected a JSON object, got {}", where, j.dump());
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += hetmesh::format("{}\"{}\"", list.empty() ? "" : ", ", a);
      throw_error<invalid_argument>("{}: unknown key \"{}\"; expected one of {}", where, k, list);
    }
  }
}

inline weight_schedule schedule_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_number()) return {{0, j.get<double>()}};
  weight_schedule s{};
  if (j.is_array()) {
    for (const auto& p : j) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number())
        throw_error<invalid_argument>("{}: schedule point {} is not a [step, weight] pair", where, p.dump());
      s.push_back({p[0].get<std::int64_t>(), p[1].get<double>()});
    }
    return s;
  }
  throw_error<invalid_argument>("{}: a weight is a number or a list of [step, weight] pairs, got {}", where,
                                j.dump());
}

inline nlohmann::json schedule_to_json(const weight_schedule& s) {
  if (s.size() == 1 && s[0].step == 0) return s[0].weight;
  auto out = nlohmann::json::array();
  for (const auto& p : s) out.push_back({p.step, p.weight});
  return out;
}

template <class T>
T get_as(const nlohmann::json& j, const char* key, const std::string& where) {
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw_error<invalid_argument>("{}: field \"{}\" is missing or has the wrong type ({})", where, key,
                                  e.what());
  }
}

inline std::vector<group_weight> groups_from_json(const nlohmann::json& j, const std::string& where) {
  std::vector<group_weight> out{};
  if (!j.is_object()) throw_error<invalid_argument>("{}: expected an object of name: weight", where);
  for (const auto& [k, v] : j.items()) out.push_back({k, schedule_from_json(v, where + "." + k)});
  return out;
}

}  // namespace detail

/// Parses and validates a mixture. Throws invalid_argument naming the offending field.
[[nodiscard]] inline mixture_config mixture_from_json(const nlohmann::json& j) {
  detail::check_keys(j,
                     {"seed", "global_batch", "sources", "modalities", "buckets", "cost", "balance", "layout",
                      "micro_batches", "max_tokens_per_micro_batch"},
                     "mixture");
  mixture_config c;
  c.seed = j.value("seed", std::uint64_t{0});
  c.global_batch = detail::get_as<std::int64_t>(j, "global_batch", "mixture");
  if (!j.contains("sources") || !j["sources"].is_array())
    throw_error<invalid_argument>("mixture: \"sources\" must be a list");
  for (std::size_t i = 0; i < j["sources"].size(); ++i) {
    const auto& s = j["sources"][i];
    const std::string where = hetmesh::format("mixture.sources[{}]", i);
    detail::check_keys(
        s,
        {"name", "format", "paths", "weight", "modality", "bucket", "min_tokens", "max_tokens", "max_epochs"},
        where);
    source_spec spec;
    spec.name = detail::get_as<std::string>(s, "name", where);
    const std::string fmt_name = s.value("format", "indexed");
    if (fmt_name == "indexed")
      spec.format = source_format::indexed;
    else if (fmt_name == "webdataset")
      spec.format = source_format::webdataset;
    else
      throw_error<invalid_argument>("{}: format \"{}\"; expected \"indexed\" or \"webdataset\"", where,
                                    fmt_name);
    spec.paths = detail::get_as<std::vector<std::string>>(s, "paths", where);
    if (s.contains("weight")) spec.weight = detail::schedule_from_json(s["weight"], where + ".weight");
    spec.modality = s.value("modality", "text");
    spec.bucket = s.value("bucket", "");
    spec.min_tokens = s.value("min_tokens", std::int64_t{0});
    spec.max_tokens = s.value("max_tokens", std::int64_t{0});
    spec.max_epochs = s.value("max_epochs", std::int64_t{0});
    c.sources.push_back(std::move(spec));
  }
  if (j.contains("modalities"))
    c.modalities = detail::groups_from_json(j["modalities"], "mixture.modalities");
  if (j.contains("buckets")) c.buckets = detail::groups_from_json(j["buckets"], "mixture.buckets");
  if (j.contains("cost")) {
    const auto& k = j["cost"];
    detail::check_keys(k, {"linear", "quadratic", "item_linear", "item_quadratic"}, "mixture.cost");
    c.cost.text = {
        .a = k.value("quadratic", std::int64_t{0}), .b = k.value("linear", std::int64_t{1}), .c = 0};
    c.cost.item = {.a = k.value("item_quadratic", std::int64_t{0}),
                   .b = k.value("item_linear", std::int64_t{1}),
                   .c = 0};
  }
  const std::string bal = j.value("balance", "lpt");
  if (bal == "lpt")
    c.balance = balance_method::lpt;
  else if (bal == "karmarkar_karp")
    c.balance = balance_method::karmarkar_karp;
  else if (bal == "round_robin")
    c.balance = balance_method::round_robin;
  else
    throw_error<invalid_argument>(
        "mixture.balance: \"{}\"; expected \"lpt\", \"karmarkar_karp\" or \"round_robin\"", bal);
  if (j.contains("layout")) {
    const auto& l = j["layout"];
    detail::check_keys(l, {"order", "tp", "cp", "ep", "dp", "pp"}, "mixture.layout");
    c.layout =
        mesh_of_order(l.value("order", std::string(mesh::megatron_order)), {{mesh::tp, l.value("tp", 1)},
                                                                            {mesh::cp, l.value("cp", 1)},
                                                                            {mesh::ep, l.value("ep", 1)},
                                                                            {mesh::dp, l.value("dp", 1)},
                                                                            {mesh::pp, l.value("pp", 1)}});
  }
  c.micro_batches = j.value("micro_batches", 1);
  c.max_tokens_per_micro_batch = j.value("max_tokens_per_micro_batch", std::int64_t{0});
  validate(c);
  return c;
}

/// The JSON of a mixture; mixture_from_json(mixture_to_json(c)) == c.
[[nodiscard]] inline nlohmann::json mixture_to_json(const mixture_config& c) {
  nlohmann::json j;
  j["seed"] = c.seed;
  j["global_batch"] = c.global_batch;
  auto& srcs = j["sources"] = nlohmann::json::array();
  for (const auto& s : c.sources)
    srcs.push_back({{"name", s.name},
                    {"format", s.format == source_format::indexed ? "indexed" : "webdataset"},
                    {"paths", s.paths},
                    {"weight", detail::schedule_to_json(s.weight)},
                    {"modality", s.modality},
                    {"bucket", s.bucket},
                    {"min_tokens", s.min_tokens},
                    {"max_tokens", s.max_tokens},
                    {"max_epochs", s.max_epochs}});
  auto groups = [](const std::vector<group_weight>& gs) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& g : gs) o[g.name] = detail::schedule_to_json(g.weight);
    return o;
  };
  if (!c.modalities.empty()) j["modalities"] = groups(c.modalities);
  if (!c.buckets.empty()) j["buckets"] = groups(c.buckets);
  j["cost"] = {{"linear", c.cost.text.b},
               {"quadratic", c.cost.text.a},
               {"item_linear", c.cost.item.b},
               {"item_quadratic", c.cost.item.a}};
  j["balance"] = c.balance == balance_method::lpt              ? "lpt"
                 : c.balance == balance_method::karmarkar_karp ? "karmarkar_karp"
                                                               : "round_robin";
  const auto order = c.layout.mesh().order_string();  // dims of extent > 1; in JSON among tp cp ep dp pp
  j["layout"] = {{"order", order.empty() ? std::string(mesh::megatron_order) : order}};
  for (std::size_t i = 0; i < c.layout.mesh().dims_count(); ++i)
    j["layout"][std::string(c.layout.mesh().name(i).name())] = c.layout.mesh().extent(i);
  j["micro_batches"] = c.micro_batches;
  j["max_tokens_per_micro_batch"] = c.max_tokens_per_micro_batch;
  return j;
}

}  // namespace hetmesh::data
