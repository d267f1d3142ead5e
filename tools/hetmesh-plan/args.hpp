// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: a small command-line parser. Each subcommand declares its options (name, value name,
// help, default, required or flag); `parse` turns argv into a `parsed` map and every problem into a
// `usage_error` whose message names the option and what was expected, so main prints one line and
// exits 2. No dependency beyond the standard library and fmt: the tool must build wherever hetmesh does.
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

namespace hetmesh_plan {

/// A command line the tool cannot accept (unknown option, missing value, malformed number, ...).
/// Derives from hetmesh::invalid_argument so one handler in main reports it like any planner error.
class usage_error : public hetmesh::invalid_argument {
 public:
  using hetmesh::invalid_argument::invalid_argument;
};

template <class... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw usage_error(fmt::format(format, std::forward<Args>(args)...));
}

/// Parses a whole string as a base-10 integer of type T; `what` names it in the error.
template <class T>
[[nodiscard]] T parse_integer(std::string_view text, std::string_view what) {
  T value{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && *first == '+') ++first;  // "+8" is as good as "8"
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != last) {
    usage_fail("{}: '{}' is not an integer; expected a whole number such as 8", what, text);
  }
  if (ec == std::errc::result_out_of_range) {
    usage_fail("{}: {} is out of range; expected a value in [{}, {}]", what, text,
               std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  }
  return value;
}

/// Parses a whole string as a finite floating-point number.
[[nodiscard]] inline double parse_real(std::string_view text, std::string_view what) {
  // std::from_chars for double is in libstdc++ 11+, and clang 14 on Debian uses libstdc++ 12.
  double value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && *first == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc{} || ptr != last || !(value == value) ||
      value == std::numeric_limits<double>::infinity() || value == -std::numeric_limits<double>::infinity()) {
    usage_fail("{}: '{}' is not a finite number; expected e.g. 1.5 or 2e-3", what, text);
  }
  return value;
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
/// the value, naming the option in every error.
class parsed {
 public:
  [[nodiscard]] bool has(const std::string& name) const { return values_.count(name) != 0; }
  [[nodiscard]] bool flag(const std::string& name) const { return has(name); }

  [[nodiscard]] const std::string& str(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) usage_fail("option --{} is required", name);
    return it->second;
  }
  [[nodiscard]] std::optional<std::string> opt_str(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

  /// An integer option within [lo, hi].
  [[nodiscard]] std::int64_t integer(const std::string& name,
                                     std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                                     std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    const auto v = parse_integer<std::int64_t>(str(name), "--" + name);
    if (v < lo || v > hi) {
      if (hi == std::numeric_limits<std::int64_t>::max())
        usage_fail("--{} = {}; expected at least {}", name, v, lo);
      usage_fail("--{} = {}; expected a value in [{}, {}]", name, v, lo, hi);
    }
    return v;
  }
  /// An int option (ranks, stages, degrees) within [lo, hi].
  [[nodiscard]] int int32(const std::string& name, int lo = 1,
                          int hi = std::numeric_limits<int>::max()) const {
    return static_cast<int>(integer(name, lo, hi));
  }
  [[nodiscard]] std::optional<int> opt_int32(const std::string& name, int lo = 1,
                                             int hi = std::numeric_limits<int>::max()) const {
    if (!has(name)) return std::nullopt;
    return int32(name, lo, hi);
  }
  /// A real option, > 0 unless `allow_zero`.
  [[nodiscard]] double real(const std::string& name, bool allow_zero = false) const {
    const double v = parse_real(str(name), "--" + name);
    if (v < 0 || (!allow_zero && v == 0)) {
      usage_fail("--{} = {}; expected a number {} 0", name, str(name), allow_zero ? ">=" : ">");
    }
    return v;
  }
  /// A comma-separated list of integers, e.g. `--cu-seqlens 0,5,12`.
  [[nodiscard]] std::vector<std::int64_t> integer_list(const std::string& name) const {
    std::vector<std::int64_t> out;
    std::size_t i = 0;
    for (const auto field : split_commas(str(name))) {
      out.push_back(parse_integer<std::int64_t>(field, fmt::format("--{} (entry {})", name, i)));
      ++i;
    }
    return out;
  }
  /// A value that must be one of `choices`.
  [[nodiscard]] const std::string& choice(const std::string& name,
                                          std::span<const std::string_view> choices) const {
    const auto& v = str(name);
    if (std::find(choices.begin(), choices.end(), std::string_view(v)) == choices.end()) {
      usage_fail("--{} = '{}'; expected one of: {}", name, v, fmt::join(choices, ", "));
    }
    return v;
  }

  /// Every option given or defaulted, by name (flags map to "").
  [[nodiscard]] const std::map<std::string, std::string>& values() const noexcept { return values_; }

 private:
  friend class command_spec;
  std::map<std::string, std::string> values_;
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

  /// Parses `args` (everything after the subcommand name). `--help` is reported through
  /// `parsed::flag("help")` and skips the required-option check, so `cmd --help` always works.
  [[nodiscard]] parsed parse(std::span<const std::string> args) const {
    parsed out;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg == "--help" || arg == "-h") {
        out.values_["help"] = "";
        continue;
      }
      if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
        usage_fail(
            "{}: unexpected argument '{}'; expected options of the form --name VALUE (see '{} --help')",
            name_, arg, name_);
      }
      std::string key = arg.substr(2);
      std::optional<std::string> inline_value;
      if (const auto eq = key.find('='); eq != std::string::npos) {
        inline_value = key.substr(eq + 1);
        key.resize(eq);
      }
      const option_spec* spec = find(key);
      if (spec == nullptr) {
        usage_fail("{}: unknown option --{}; expected one of: {} (see '{} --help')", name_, key,
                   option_names(), name_);
      }
      if (out.values_.count(key) != 0)
        usage_fail("{}: option --{} given twice; expected it at most once", name_, key);
      if (spec->value_name.empty()) {
        if (inline_value) usage_fail("{}: option --{} takes no value, got '{}'", name_, key, *inline_value);
        out.values_[key] = "";
        continue;
      }
      if (inline_value) {
        out.values_[key] = *inline_value;
      } else {
        if (i + 1 >= args.size())
          usage_fail("{}: option --{} needs a value {}", name_, key, spec->value_name);
        out.values_[key] = args[++i];
      }
    }
    if (out.flag("help")) return out;
    for (const auto& spec : specs_) {
      if (out.values_.count(spec.name) != 0) continue;
      if (spec.default_value) {
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
