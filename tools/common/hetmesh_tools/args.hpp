// SPDX-License-Identifier: Apache-2.0
// hetmesh tools: one strict command-line parser for every tool, example and benchmark. It refuses what a
// permissive loop would skip or misread: unknown options, an option without its value, an option given twice,
// numbers with trailing garbage ("12abc") or out of range, values outside a fixed set, and positional
// arguments beyond (or short of) what the command takes. Each refusal is a usage_error whose message names
// the option or argument and what was expected, so a tool can print it on one line and exit 2.
//   static constexpr hetmesh::tools::option_spec opts[] = {{"--dtype", "uint16|int32", "token type"}};
//   const auto a = hetmesh::tools::parse_args(args, opts, {"IN.jsonl", "OUT_PREFIX"});
//   const auto type = a.choice("--dtype", "int32", {"uint16", "int32"});
// Examples and benchmarks bind their options to variables (parse_into, parse_command_line):
//   int steps = 6;  std::string out = "x.json";  bool quick = false;
//   if (!hetmesh::tools::parse_command_line(argc, argv, "bench_x", {{"--steps", "N", "steps", &steps, 1},
//       {"--out", "FILE", "where", &out}, {"--quick", "", "fewer", &quick}})) return 2;
// Linked as hetmesh_tools_common (tools/common on the include path): #include <hetmesh_tools/args.hpp>.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include <hetmesh/core/error.hpp>

namespace hetmesh::tools {

/// A command line the tool cannot accept (the tool prints it and exits 2).
class usage_error : public invalid_argument {
 public:
  /// Takes the message, as hetmesh::error does.
  using invalid_argument::invalid_argument;
};

/// One option a command accepts: its name ("--per-shard"), the name of its value for messages ("N";
/// empty for a switch that takes none) and a one-line description.
struct option_spec {
  std::string_view name;    ///< "--name"
  std::string_view value;   ///< what its value is ("N", "uint16|int32"); empty: a switch
  std::string_view help;    ///< one line for usage texts
  bool repeatable = false;  ///< may be given more than once (values kept in order)
};

/// `text` as an integer in [lo, hi]: the whole text must be the number (no "12abc", no " 12", no "1.5");
/// usage_error naming `what`, the text and the range otherwise. Pure.
[[nodiscard]] inline std::int64_t parse_int(std::string_view text, std::string_view what,
                                            std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t v = 0;
  const auto* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec == std::errc::invalid_argument || p != end)
    throw_error<usage_error>("{} '{}': expected an integer in [{}, {}]", what, text, lo, hi);
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    throw_error<usage_error>("{} '{}': out of range; expected an integer in [{}, {}]", what, text, lo, hi);
  return v;
}

/// `text` as a finite real number: the whole text must be the number ("1.5", "2e-3"; no "1.5x", no "inf",
/// no "nan"); usage_error naming `what`, the text and the expected form otherwise. Pure.
[[nodiscard]] inline double parse_real(std::string_view text, std::string_view what) {
  double v = 0;
  const auto* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc{} || p != end || !std::isfinite(v))
    throw_error<usage_error>("{} '{}': expected a finite number such as 1.5 or 2e-3", what, text);
  return v;
}

/// What parse_args found: the positional arguments in order and each option's values.
class parsed_args {
 public:
  /// The positional arguments, in order.
  [[nodiscard]] const std::vector<std::string>& positionals() const noexcept { return positionals_; }
  /// Whether option `name` was given.
  [[nodiscard]] bool has(std::string_view name) const { return find(name) != nullptr; }
  /// The value of option `name` (its last value for a repeatable one), or nullopt when not given.
  [[nodiscard]] std::optional<std::string> get(std::string_view name) const {
    const auto* e = find(name);
    if (e == nullptr || e->values.empty()) return std::nullopt;
    return e->values.back();
  }
  /// Every value of option `name`, in order (empty when not given).
  [[nodiscard]] std::vector<std::string> all(std::string_view name) const {
    const auto* e = find(name);
    return e == nullptr ? std::vector<std::string>{} : e->values;
  }
  /// The value of `name` as an integer in [lo, hi], or `def` when not given (parse_int's errors, naming
  /// the option).
  [[nodiscard]] std::int64_t integer(std::string_view name, std::int64_t def,
                                     std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                                     std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    const auto v = get(name);
    return v ? parse_int(*v, hetmesh::format("option {}", name), lo, hi) : def;
  }
  /// The value of `name`, which must be one of `choices`, or `def` when not given; usage_error naming the
  /// option, the value and the choices otherwise.
  [[nodiscard]] std::string choice(std::string_view name, std::string_view def,
                                   std::initializer_list<std::string_view> choices) const {
    const auto v = get(name);
    if (!v) return std::string(def);
    std::string list;
    for (auto c : choices) {
      if (*v == c) return *v;
      list += hetmesh::format("{}{}", list.empty() ? "" : ", ", c);
    }
    throw_error<usage_error>("option {} '{}': expected one of {}", name, *v, list);
  }

 private:
  friend parsed_args parse_args(std::span<const std::string>, std::span<const option_spec>,
                                std::span<const std::string_view>, std::size_t);
  struct entry {
    std::string name;
    std::vector<std::string> values;
  };
  [[nodiscard]] const entry* find(std::string_view name) const {
    for (const auto& e : options_)
      if (e.name == name) return &e;
    return nullptr;
  }
  std::vector<std::string> positionals_{};
  std::vector<entry> options_{};
};

/// Parses `args` (the arguments after the command) against `options`, expecting the positional
/// arguments named in `positional_names`, of which the first `required` must be present (all of them
/// when `required` is larger than their count). Options may come anywhere, as "--name value" or
/// "--name=value"; "--" ends the options. Throws usage_error for an unknown option (naming it and the
/// accepted ones), a missing value (the option and what it expected), a value given to a switch, an
/// option given twice, a missing positional (its name) and an extra one (its text). Pure.
[[nodiscard]] inline parsed_args parse_args(std::span<const std::string> args,
                                            std::span<const option_spec> options,
                                            std::span<const std::string_view> positional_names,
                                            std::size_t required = std::numeric_limits<std::size_t>::max()) {
  parsed_args out;
  auto accepted = [&] {
    std::string list;
    for (const auto& o : options) list += hetmesh::format("{}{}", list.empty() ? "" : ", ", o.name);
    return list;
  };
  bool options_done = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!options_done && a == "--") {
      options_done = true;
      continue;
    }
    if (options_done || a.size() < 2 || a[0] != '-') {
      if (out.positionals_.size() >= positional_names.size())
        throw_error<usage_error>("unexpected argument '{}'; expected {} positional argument(s)", a,
                                 positional_names.size());
      out.positionals_.push_back(a);
      continue;
    }
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const option_spec* spec = nullptr;
    for (const auto& o : options)
      if (o.name == name) spec = &o;
    if (spec == nullptr && options.empty())
      throw_error<usage_error>("unknown option '{}'; this command takes no options", name);
    if (spec == nullptr)
      throw_error<usage_error>("unknown option '{}'; expected one of {}", name, accepted());
    std::string value;
    if (spec->value.empty()) {
      if (eq != std::string::npos)
        throw_error<usage_error>("option {} takes no value, got '{}'", name, a.substr(eq + 1));
    } else if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size() || (args[i + 1].size() >= 2 && args[i + 1].rfind("--", 0) == 0))
        throw_error<usage_error>("option {} needs a value; expected {}", name, spec->value);
      value = args[++i];
    }
    parsed_args::entry* e = nullptr;
    for (auto& x : out.options_)
      if (x.name == name) e = &x;
    if (e != nullptr && !spec->repeatable)
      throw_error<usage_error>("option {} given twice ('{}', then '{}'); expected it once", name,
                               e->values.empty() ? std::string() : e->values.back(), value);
    if (e == nullptr) e = &out.options_.emplace_back(parsed_args::entry{name, {}});
    if (!spec->value.empty()) e->values.push_back(std::move(value));
  }
  const std::size_t need = required < positional_names.size() ? required : positional_names.size();
  if (out.positionals_.size() < need)
    throw_error<usage_error>("missing argument {}; expected {} positional argument(s)",
                             positional_names[out.positionals_.size()], need);
  return out;
}

/// The arguments after the program's name, argv[1..argc), as parse_args and parse_into take them.
[[nodiscard]] inline std::vector<std::string> arguments(int argc, char** argv) {
  return argc > 1 ? std::vector<std::string>(argv + 1, argv + argc) : std::vector<std::string>{};
}

/// One argument of a program bound to the variable it sets: an option ("--name", given as "--name value"
/// or "--name=value"; a switch when `value` is empty and the target a bool) or, for a name that does not
/// start with '-', an optional positional argument (in the order listed). A string target takes the text;
/// an integer target the number in [lo, hi] (and in its type's range; parse_int's refusals); a double
/// target a finite number (parse_real); a bool target becomes true when the switch is given.
struct bound_option {
  std::string_view name;   ///< "--name", or a positional's name for messages ("RANKS")
  std::string_view value;  ///< what its value is ("N", "FILE"); empty: a switch (bool target)
  std::string_view help;   ///< one line for usage texts
  std::variant<std::string*, std::int64_t*, int*, double*, bool*> target;  ///< where the value goes
  std::int64_t lo = std::numeric_limits<std::int64_t>::min();              ///< least integer accepted
  std::int64_t hi = std::numeric_limits<std::int64_t>::max();              ///< largest integer accepted
};

/// Parses `args` against `options` (parse_args' rules, except that an option may be given more than once:
/// its last value counts, as in the hand-written loops this replaces) and stores each given value into its
/// target; targets of options not given keep their values (the defaults). Throws usage_error naming the
/// option (or positional) for an unknown option, a missing value, a value given to a switch, a bad or
/// out-of-range number and an extra positional argument; on a throw, targets set before it keep their new
/// values.
inline void parse_into(std::span<const std::string> args, std::span<const bound_option> options) {
  std::vector<option_spec> specs;
  std::vector<std::string_view> positional;
  std::vector<const bound_option*> positional_options;
  for (const auto& o : options) {
    if (o.name.starts_with("-")) {
      specs.push_back({o.name, o.value, o.help, true});
    } else {
      positional.push_back(o.name);
      positional_options.push_back(&o);
    }
  }
  const auto a = parse_args(args, specs, positional, 0);
  auto store = [](const bound_option& o, const std::string& text, const std::string& what) {
    if (auto* s = std::get_if<std::string*>(&o.target)) **s = text;
    if (auto* n = std::get_if<std::int64_t*>(&o.target)) **n = parse_int(text, what, o.lo, o.hi);
    if (auto* n = std::get_if<int*>(&o.target))
      **n = static_cast<int>(parse_int(text, what,
                                       std::max<std::int64_t>(o.lo, std::numeric_limits<int>::min()),
                                       std::min<std::int64_t>(o.hi, std::numeric_limits<int>::max())));
    if (auto* d = std::get_if<double*>(&o.target)) **d = parse_real(text, what);
  };
  for (const auto& o : options) {
    if (!o.name.starts_with("-") || !a.has(o.name)) continue;
    if (auto* b = std::get_if<bool*>(&o.target)) {
      **b = true;
      continue;
    }
    store(o, *a.get(o.name), hetmesh::format("option {}", o.name));
  }
  for (std::size_t i = 0; i < a.positionals().size(); ++i)
    store(*positional_options[i], a.positionals()[i],
          hetmesh::format("argument {}", positional_options[i]->name));
}

/// parse_into over argv for a program's main: on a usage_error prints "<program>: <message>" on stderr, and
/// `usage` on a line of its own when it is not empty, and returns false (the program then exits 2, the
/// status every hetmesh program gives a bad command line); true when the arguments were stored.
[[nodiscard]] inline bool parse_command_line(int argc, char** argv, std::string_view program,
                                             std::initializer_list<bound_option> options,
                                             std::string_view usage = {}) {
  try {
    parse_into(arguments(argc, argv), std::span<const bound_option>(options.begin(), options.size()));
    return true;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), e.what());
    if (!usage.empty()) std::fprintf(stderr, "%.*s\n", static_cast<int>(usage.size()), usage.data());
    return false;
  }
}

}  // namespace hetmesh::tools
