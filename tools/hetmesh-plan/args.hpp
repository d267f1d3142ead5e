// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: each subcommand's options and help text over the tools' one strict parser
// (tools/common/hetmesh_tools/args.hpp, which hetmesh-data-convert uses too). Each subcommand declares its
// options (name, value name, help, default, required or flag); `parse` turns argv into a `parsed` map and
// every problem (an unknown option, a missing value, an option twice, a stray positional argument, "12abc"
// for a number) into a usage_error whose message names the option, the value and what was expected, so main
// prints one line and exits 2. `parsed` tells an option given on the command line from a default, so a
// command can refuse an option it would otherwise ignore.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/core/error.hpp>

#include <hetmesh_tools/args.hpp>

namespace hetmesh_plan {

/// A command line the tool cannot accept (unknown option, missing value, malformed number, ...): the
/// tools' one usage_error, a hetmesh::invalid_argument, so one handler in main reports it.
using usage_error = hetmesh::tools::usage_error;

template <class... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw usage_error(fmt::format(format, std::forward<Args>(args)...));
}

/// Parses a whole string as a base-10 integer of type T ("12abc", "1.5", "" refused); `what` names it in
/// the error.
template <class T>
[[nodiscard]] T parse_integer(std::string_view text, std::string_view what) {
  return static_cast<T>(
      hetmesh::tools::parse_int(text, what, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
}

/// Parses a whole string as a finite floating-point number ("inf", "nan", "1.5x" refused).
[[nodiscard]] inline double parse_real(std::string_view text, std::string_view what) {
  return hetmesh::tools::parse_real(text, what);
}

/// Splits "a,b,c" into its comma-separated fields (no trimming: the shell already split on spaces).
[[nodiscard]] inline std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    out.push_back(
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

/// What one option is: `--name VALUE` (or `--name=VALUE`), or a `--flag` without a value.
struct option_spec {
  std::string name;        // without the leading dashes
  std::string value_name;  // empty for a flag
  std::string help;
  std::optional<std::string> default_value;
  bool required = false;
};

class command_spec;

/// The options given on one command line, after defaults are applied. Accessors convert and check
/// the value, naming the option, the value and the expected range in every error.
class parsed {
 public:
  /// Whether the option has a value (given, or defaulted).
  [[nodiscard]] bool has(const std::string& name) const { return values_.count(name) != 0; }
  /// Whether the switch `name` was given.
  [[nodiscard]] bool flag(const std::string& name) const { return has(name); }
  /// Whether `name` was given on the command line (not merely defaulted).
  [[nodiscard]] bool given(const std::string& name) const { return given_.count(name) != 0; }

  /// The option's text; usage_error when it has none.
  [[nodiscard]] const std::string& str(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) usage_fail("option --{} is required", name);
    return it->second;
  }
  /// The option's text, or nullopt.
  [[nodiscard]] std::optional<std::string> opt_str(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

  /// An integer option within [lo, hi] (the whole text must be the number).
  [[nodiscard]] std::int64_t integer(const std::string& name,
                                     std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                                     std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    return hetmesh::tools::parse_int(str(name), "option --" + name, lo, hi);
  }
  /// An int option (ranks, stages, degrees) within [lo, hi].
  [[nodiscard]] int int32(const std::string& name, int lo = 1,
                          int hi = std::numeric_limits<int>::max()) const {
    return static_cast<int>(integer(name, lo, hi));
  }
  /// An int option within [lo, hi], or nullopt when absent.
  [[nodiscard]] std::optional<int> opt_int32(const std::string& name, int lo = 1,
                                             int hi = std::numeric_limits<int>::max()) const {
    if (!has(name)) return std::nullopt;
    return int32(name, lo, hi);
  }
  /// A finite real option in [lo, hi] (> 0 and below 1e15 unless told otherwise): the bounds keep the
  /// modelled times the tool prints finite and positive.
  [[nodiscard]] double real(const std::string& name, double lo = 1e-9, double hi = 1e15) const {
    const double v = parse_real(str(name), "option --" + name);
    if (v < lo || v > hi)
      usage_fail("option --{} '{}': out of range; expected a number in [{:g}, {:g}]", name, str(name), lo,
                 hi);
    return v;
  }
  /// A comma-separated list of integers, e.g. `--cu-seqlens 0,5,12`.
  [[nodiscard]] std::vector<std::int64_t> integer_list(const std::string& name) const {
    std::vector<std::int64_t> out;
    std::size_t i = 0;
    for (const auto field : split_commas(str(name))) {
      out.push_back(parse_integer<std::int64_t>(field, fmt::format("option --{} (entry {})", name, i)));
      ++i;
    }
    return out;
  }
  /// A value that must be one of `choices`.
  [[nodiscard]] const std::string& choice(const std::string& name,
                                          std::span<const std::string_view> choices) const {
    const auto& v = str(name);
    if (std::find(choices.begin(), choices.end(), std::string_view(v)) == choices.end()) {
      usage_fail("option --{} '{}': expected one of {}", name, v, fmt::join(choices, ", "));
    }
    return v;
  }
  /// usage_error when `name` was given but `needed` was not: an option that would otherwise be
  /// silently ignored ("--kv-ratio applies only with --hidden").
  void needs(const std::string& name, const std::string& needed, std::string_view why) const {
    if (given(name) && !given(needed))
      usage_fail("option --{} '{}' applies only with --{} ({}); expected --{} too, or no --{}", name,
                 str(name), needed, why, needed, name);
  }

  /// Every option given or defaulted, by name (flags map to "").
  [[nodiscard]] const std::map<std::string, std::string>& values() const noexcept { return values_; }

 private:
  friend class command_spec;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> given_;
};

/// The options of one subcommand, and its help text.
class command_spec {
 public:
  command_spec(std::string name, std::string summary)
      : name_(std::move(name)), summary_(std::move(summary)) {}

  /// `--name VALUE`, optional; with a default it is always present in `parsed`.
  command_spec& option(std::string name, std::string value_name, std::string help,
                       std::optional<std::string> default_value = std::nullopt) {
    add({std::move(name), std::move(value_name), std::move(help), std::move(default_value), false});
    return *this;
  }
  /// `--name VALUE`, required.
  command_spec& required(std::string name, std::string value_name, std::string help) {
    add({std::move(name), std::move(value_name), std::move(help), std::nullopt, true});
    return *this;
  }
  /// `--name` without a value.
  command_spec& flag(std::string name, std::string help) {
    add({std::move(name), "", std::move(help), std::nullopt, false});
    return *this;
  }
  /// Free text printed after the options in --help (formats, examples).
  command_spec& epilog(std::string text) {
    epilog_ = std::move(text);
    return *this;
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::string& summary() const noexcept { return summary_; }

  /// Parses `args` (everything after the subcommand name) with hetmesh::tools::parse_args: unknown
  /// options, missing values, an option twice and positional arguments are usage_errors. `--help` (or
  /// `-h`) is reported through `parsed::flag("help")` and skips the required-option check, so
  /// `cmd --help` always works.
  [[nodiscard]] parsed parse(std::span<const std::string> args) const {
    std::vector<std::string> names;  // "--name": parse_args' option_spec holds views of these
    names.reserve(specs_.size());
    for (const auto& s : specs_) names.push_back("--" + s.name);
    std::vector<hetmesh::tools::option_spec> specs;
    for (std::size_t i = 0; i < specs_.size(); ++i)
      specs.push_back({names[i], specs_[i].value_name, specs_[i].help});
    specs.push_back({"--help", "", "print the help and exit"});
    specs.push_back({"-h", "", "print the help and exit"});
    hetmesh::tools::parsed_args a;
    try {
      a = hetmesh::tools::parse_args(args, specs, {}, 0);
    } catch (const usage_error& e) {
      usage_fail("{}: {} (see '{} --help')", name_, e.what(), name_);
    }
    parsed out;
    if (a.has("--help") || a.has("-h")) {
      out.values_["help"] = "";
      return out;
    }
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const auto& spec = specs_[i];
      if (a.has(names[i])) {
        out.values_[spec.name] = a.get(names[i]).value_or("");
        out.given_[spec.name] = true;
      } else if (spec.default_value) {
        out.values_[spec.name] = *spec.default_value;
      } else if (spec.required) {
        usage_fail("{}: missing required option --{} {}", name_, spec.name, spec.value_name);
      }
    }
    return out;
  }

  /// The --help text: usage line, summary, options with defaults, epilog.
  [[nodiscard]] std::string help(std::string_view program) const {
    std::string usage = fmt::format("usage: {} {}", program, name_);
    for (const auto& s : specs_) {
      if (s.required) usage += fmt::format(" --{} {}", s.name, s.value_name);
    }
    usage += " [options]\n\n" + summary_ + "\n\noptions:\n";
    std::size_t width = 0;
    for (const auto& s : specs_) width = std::max(width, label(s).size());
    for (const auto& s : specs_) {
      std::string line = fmt::format("  {:<{}}  {}", label(s), width, s.help);
      if (s.required) line += " (required)";
      if (s.default_value) line += fmt::format(" (default: {})", *s.default_value);
      usage += line + "\n";
    }
    usage += fmt::format("  {:<{}}  {}\n", "--help", width, "print this help and exit");
    if (!epilog_.empty()) usage += "\n" + epilog_;
    if (usage.back() != '\n') usage += '\n';
    return usage;
  }

 private:
  void add(option_spec s) { specs_.push_back(std::move(s)); }
  [[nodiscard]] const option_spec* find(const std::string& key) const {
    for (const auto& s : specs_)
      if (s.name == key) return &s;
    return nullptr;
  }
  [[nodiscard]] std::string option_names() const {
    std::vector<std::string> names;
    for (const auto& s : specs_) names.push_back("--" + s.name);
    return fmt::format("{}", fmt::join(names, " "));
  }
  [[nodiscard]] static std::string label(const option_spec& s) {
    return s.value_name.empty() ? "--" + s.name : fmt::format("--{} {}", s.name, s.value_name);
  }

  std::string name_;
  std::string summary_;
  std::string epilog_;
  std::vector<option_spec> specs_;
};

}  // namespace hetmesh_plan
