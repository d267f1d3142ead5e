// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the JSON spelling of mixture_config. Unknown keys are errors (a misspelt "wieght" must
// not silently become the default). A weight is a number (constant) or a list of [step, weight] pairs
// (a piecewise-linear curriculum). Example:
//   {"seed": 7, "global_batch": 64,
//    "sources": [{"name": "web", "format": "indexed", "paths": ["/d/web"], "weight": [[0, 0.8], [1000,
//    0.5]]},
//                {"name": "code", "paths": ["/d/code"], "weight": [[0, 0.2], [1000, 0.5]]}],
//    "cost": {"linear": 1, "quadratic": 1},
//    "layout": {"order": "tp-cp-ep-dp-pp", "tp": 2, "dp": 4}, "micro_batches": 2}
// (layout: an order string, default Megatron-LM's, and the extents of tp cp ep dp pp, default 1). The
// balancer is not data: it is a balance::partitioner type given to data::plan_step / data_loader, and a
// "balance" key is refused with a message saying so.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/json_file.hpp"
#include "mixture.hpp"

namespace hetmesh::data {

namespace detail {

/// A JSON value for an error message, cut to a readable length.
[[nodiscard]] inline std::string json_excerpt(const nlohmann::json& v) {
  std::string d = v.dump();
  if (d.size() > 60) d = d.substr(0, 57) + "...";
  return d;
}

inline void check_keys(const nlohmann::json& j, std::initializer_list<const char*> allowed,
                       const std::string& where) {
  if (!j.is_object())
    throw_error<invalid_argument>("{}: expected a JSON object, got {}", where, json_excerpt(j));
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
      if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number() ||
          (p[0].is_number_unsigned() &&
           p[0].get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
        throw_error<invalid_argument>(
            "{}: schedule point {} is not a [step, weight] pair (integer step, number "
            "weight)",
            where, json_excerpt(p));
      s.push_back({p[0].get<std::int64_t>(), p[1].get<double>()});
    }
    return s;
  }
  throw_error<invalid_argument>("{}: a weight is a number or a list of [step, weight] pairs, got {}", where,
                                json_excerpt(j));
}

inline nlohmann::json schedule_to_json(const weight_schedule& s) {
  if (s.size() == 1 && s[0].step == 0) return s[0].weight;
  auto out = nlohmann::json::array();
  for (const auto& p : s) out.push_back({p.step, p.weight});
  return out;
}

/// Field `key` of `j` as T, checked without nlohmann's conversions (which truncate 1.5 to 1 and wrap
/// -1 into unsigned): invalid_argument "`where`.`key` = <value>; expected <kind>" when it has the wrong
/// type or does not fit T; `def` when it is absent and not `required`.
template <class T>
[[nodiscard]] T field(const nlohmann::json& j, const char* key, const std::string& where, T def = T{},
                      bool required = false) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw_error<invalid_argument>("{}.{}: missing; this field is required", where, key);
    return def;
  }
  const auto& v = *it;
  auto bad = [&](const char* expected) {
    throw_error<invalid_argument>("{}.{} = {}; expected {}", where, key, json_excerpt(v), expected);
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) bad("a string");
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!v.is_array()) bad("a list of strings");
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) bad("a list of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) bad("a number");
    return v.get<T>();
  } else {
    static_assert(std::is_integral_v<T>,
                  "field<T>: T is a string, a list of strings, a number or an integer");
    if (!v.is_number_integer()) bad("an integer");
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) bad("an integer in range");
      return static_cast<T>(u);
    }
    const auto i = v.get<std::int64_t>();
    if constexpr (std::is_signed_v<T>) {
      if (i < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
          i > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
        bad("an integer in range");
    } else {
      if (i < 0) bad("a non-negative integer");
    }
    return static_cast<T>(i);
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
  c.seed = detail::field<std::uint64_t>(j, "seed", "mixture");
  c.global_batch = detail::field<std::int64_t>(j, "global_batch", "mixture", 0, true);
  if (!j.contains("sources") || !j["sources"].is_array())
    throw_error<invalid_argument>("mixture.sources = {}; expected a list of sources",
                                  j.contains("sources") ? detail::json_excerpt(j["sources"]) : "(missing)");
  for (std::size_t i = 0; i < j["sources"].size(); ++i) {
    const auto& s = j["sources"][i];
    const std::string where = hetmesh::format("mixture.sources[{}]", i);
    detail::check_keys(
        s,
        {"name", "format", "paths", "weight", "modality", "bucket", "min_tokens", "max_tokens", "max_epochs"},
        where);
    source_spec spec;
    spec.name = detail::field<std::string>(s, "name", where, "", true);
    const std::string fmt_name = detail::field<std::string>(s, "format", where, "indexed");
    if (fmt_name == "indexed")
      spec.format = source_format::indexed;
    else if (fmt_name == "webdataset")
      spec.format = source_format::webdataset;
    else
      throw_error<invalid_argument>("{}: format \"{}\"; expected \"indexed\" or \"webdataset\"", where,
                                    fmt_name);
    spec.paths = detail::field<std::vector<std::string>>(s, "paths", where, {}, true);
    if (s.contains("weight")) spec.weight = detail::schedule_from_json(s["weight"], where + ".weight");
    spec.modality = detail::field<std::string>(s, "modality", where, "text");
    spec.bucket = detail::field<std::string>(s, "bucket", where, "");
    spec.min_tokens = detail::field<std::int64_t>(s, "min_tokens", where);
    spec.max_tokens = detail::field<std::int64_t>(s, "max_tokens", where);
    spec.max_epochs = detail::field<std::int64_t>(s, "max_epochs", where);
    c.sources.push_back(std::move(spec));
  }
  if (j.contains("modalities"))
    c.modalities = detail::groups_from_json(j["modalities"], "mixture.modalities");
  if (j.contains("buckets")) c.buckets = detail::groups_from_json(j["buckets"], "mixture.buckets");
  if (j.contains("cost")) {
    const auto& k = j["cost"];
    detail::check_keys(k, {"linear", "quadratic", "item_linear", "item_quadratic"}, "mixture.cost");
    const std::string w = "mixture.cost";
    c.cost.text = {.a = detail::field<std::int64_t>(k, "quadratic", w, 0),
                   .b = detail::field<std::int64_t>(k, "linear", w, 1),
                   .c = 0};
    c.cost.item = {.a = detail::field<std::int64_t>(k, "item_quadratic", w, 0),
                   .b = detail::field<std::int64_t>(k, "item_linear", w, 1),
                   .c = 0};
  }
  if (j.contains("balance"))
    throw_error<invalid_argument>(
        "mixture.balance: the load-time balancer is no longer a mixture field; expected it as a "
        "balance::partitioner type passed to data::plan_step (balance::lpt_partition, "
        "karmarkar_karp_partition, round_robin_partition; data_loader's Split parameter); remove the key");
  if (j.contains("layout")) {
    const auto& l = j["layout"];
    detail::check_keys(l, {"order", "tp", "cp", "ep", "dp", "pp"}, "mixture.layout");
    const auto dim_extent = [&](const char* key) { return detail::field<int>(l, key, "mixture.layout", 1); };
    c.layout = mesh_of_order(
        detail::field<std::string>(l, "order", "mixture.layout", std::string(mesh::megatron_order)),
        {{mesh::tp, dim_extent("tp")},
         {mesh::cp, dim_extent("cp")},
         {mesh::ep, dim_extent("ep")},
         {mesh::dp, dim_extent("dp")},
         {mesh::pp, dim_extent("pp")}});
  }
  c.micro_batches = detail::field<int>(j, "micro_batches", "mixture", 1);
  c.max_tokens_per_micro_batch = detail::field<std::int64_t>(j, "max_tokens_per_micro_batch", "mixture");
  validate(c);
  return c;
}

/// The JSON of a mixture; mixture_from_json(mixture_to_json(c)) == c. A mixture with an in-process source
/// (data/memory_source.hpp: records held in memory or generated) has no JSON: invalid_argument naming it.
[[nodiscard]] inline nlohmann::json mixture_to_json(const mixture_config& c) {
  for (const auto& s : c.sources)
    if (s.format == source_format::in_process)
      throw_error<invalid_argument>(
          "mixture_to_json: source '{}' is an in-process source (held in memory or generated); expected "
          "file sources only: a mixture JSON cannot name one, build it in C++",
          s.name);
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
  const auto order = c.layout.mesh().order_string();  // dims of extent > 1; in JSON among tp cp ep dp pp
  j["layout"] = {{"order", order.empty() ? std::string(mesh::megatron_order) : order}};
  for (std::size_t i = 0; i < c.layout.mesh().dims_count(); ++i)
    j["layout"][std::string(c.layout.mesh().name(i).name())] = c.layout.mesh().extent(i);
  j["micro_batches"] = c.micro_batches;
  j["max_tokens_per_micro_batch"] = c.max_tokens_per_micro_batch;
  return j;
}

/// The mixture in the JSON file `path`: a regular file of at most 64 MiB, nested at most json_max_depth
/// levels (core/json_file.hpp: a directory, FIFO or device, a huge or "[[[[..." file is a data_error
/// naming the path), then mixture_from_json (invalid_argument naming the field), with the path added as
/// context. Not collective; O(bytes).
[[nodiscard]] inline mixture_config read_mixture_file(const std::string& path) {
  const auto j = read_json_file(path, "mixture", small_file_bytes);
  try {
    return mixture_from_json(j);
  } catch (error& e) {
    e.add_context(hetmesh::format("reading mixture '{}'", path));
    throw;
  }
}

}  // namespace hetmesh::data
