// SPDX-License-Identifier: Apache-2.0
// hetmesh: the exception hierarchy. Every run-time failure hetmesh reports derives from
// hetmesh::error and carries context: what was being done, and what was expected.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

// CUDA translation units (nvcc) get the exception types without fmt, whose consteval format checks
// nvcc cannot compile; throw_error is for host translation units.
#ifndef __CUDACC__
#include <fmt/core.h>
#endif

#include "../config.hpp"

namespace hetmesh {

/// Base of every exception hetmesh throws. `what()` is the full message: the context frames added
/// on the way up (outermost first), then the original message.
class error : public std::runtime_error {
 public:
  /// An error with `message` and no context frames yet.
  explicit error(const std::string& message) : std::runtime_error(message), message_(message) {}

  /// The message without context frames.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

  /// Adds an outer context frame ("while planning step 7") and returns *this, for rethrow.
  /// Usage: `catch (hetmesh::error& e) { e.add_context("while ..."); throw; }`
  HETMESH_COMPILED error& add_context(const std::string& frame);

  /// The context frames (outermost first), then the message; the plain message when no frame was added.
  [[nodiscard]] const char* what() const noexcept override {
    return full_.empty() ? std::runtime_error::what() : full_.c_str();
  }

 private:
  std::string message_;
  std::string full_;
};

/// A value, size or configuration the caller passed is not acceptable (bad extents, unknown names,
/// lengths a scheme cannot split, weights that do not sum to one, ...).
class invalid_argument : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// The request is well-formed but does not fit: a sample longer than any rank can hold, a batch that
/// exceeds capacity even with full offloading.
class capacity_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// An integer computation on input sizes would overflow its type (core/checked.hpp): the input is refused
/// rather than wrapped. It is an invalid_argument, since the sizes that overflow came from the caller.
class overflow_error : public invalid_argument {
 public:
  /// Takes the message, as hetmesh::error does.
  using invalid_argument::invalid_argument;
};

/// A collective could not complete within its timeout (a rank never arrived).
class timeout_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// Ranks disagree: mismatched sizes in a collective, plan hashes that differ across ranks.
class mismatch_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// Data on disk or on the wire is corrupt, truncated, or does not match its index.
class data_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// A backend (MPI, NCCL, CUDA) reported failure; `code()` is the backend's own status code and the
/// message includes the backend's own error text.
class backend_error : public error {
 public:
  /// An error with `message` (which already quotes the backend's own text) and the backend's status `code`.
  backend_error(const std::string& message, int code) : error(message), code_(code) {}
  /// The backend's own status code (an ncclResult_t, an MPI error code, a cudaError_t), for a caller that
  /// branches on it.
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A precondition checked by HETMESH_ASSERT failed.
class assertion_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

#ifndef __CUDACC__
namespace detail {
/// The format-string parameter of throw_error and HETMESH_ASSERT: fmt's compile-time checked string
/// when HETMESH_CHECK_FORMAT_STRINGS is on, else a plain string view (checked when formatted).
#if HETMESH_CHECK_FORMAT_STRINGS
template <class... Args>
using format_string_t = fmt::format_string<Args...>;
#else
template <class... Args>
using format_string_t = fmt::string_view;
#endif

/// The cold half of throw_error: one instantiation per exception type, not per call site.
template <class E>
[[noreturn]] [[gnu::cold]] [[gnu::noinline]] void throw_formatted(fmt::string_view format,
                                                                  fmt::format_args args) {
  throw E(fmt::vformat(format, args));
}

/// One type-erased format argument referring to `v` (which must outlive its use), through fmt's public
/// API. Instantiated once per argument *type*; a call site then only builds an array of these, where
/// fmt::make_format_args would instantiate a format_arg_store per distinct argument *pack* (hundreds in
/// the library, the largest item of its compile time).
template <class Context, class T>
[[nodiscard]] typename Context::format_arg erased_arg(const T& v) {
  return fmt::basic_format_args<Context>(fmt::make_format_args<Context>(v)).get(0);
}

/// vformat/vformat_to arguments for a pack: built per type (erased_arg), passed as one array.
template <class Context, class... Args>
struct erased_args {
  typename Context::format_arg data[sizeof...(Args) == 0 ? 1 : sizeof...(Args)];
  explicit erased_args(const Args&... args) : data{erased_arg<Context>(args)...} {}
  [[nodiscard]] fmt::basic_format_args<Context> get() const noexcept {
    return {data, static_cast<int>(sizeof...(Args))};
  }
};

/// How many arguments throw_error, hetmesh::format and hetmesh::format_to take as plain (non-template)
/// parameters; calls with more go through a variadic overload.
inline constexpr int max_erased_args = 16;

/// One argument of throw_error / hetmesh::format / hetmesh::format_to, type-erased where it is passed:
/// the implicit conversion from `const T&` is instantiated once per argument type, so these functions
/// are not instantiated per argument pack (there were about 300 distinct packs in `hetmesh.hpp`, each an
/// instantiation of the function, of an argument array type and of its constructor). Refers to the
/// argument, which lives until the end of the caller's full-expression. A default-constructed one is
/// "no argument" and ends the list.
class format_arg {
 public:
  /// No argument: the end of the list.
  format_arg() = default;
  /// Refers to `v`, which must be formattable by fmt.
  template <class T>
  format_arg(const T& v)  // NOLINT(google-explicit-constructor): converts at the call site by design
      : arg_(erased_arg<fmt::format_context>(v)) {}

  /// Packs the leading given arguments of `args` (up to the first "no argument") for fmt::vformat;
  /// `data` receives them and must outlive the result.
  template <std::size_t N>
  [[nodiscard]] static fmt::format_args pack(const format_arg (&args)[N],
                                             fmt::format_context::format_arg (&data)[N]) noexcept {
    int n = 0;
    while (n < static_cast<int>(N) && args[n].arg_) {
      data[n] = args[n].arg_;
      ++n;
    }
    return {data, n};
  }

 private:
  fmt::format_context::format_arg arg_;
};

/// Formats `format` with the given leading arguments of `args` (see format_arg::pack).
[[nodiscard]] HETMESH_COMPILED std::string vformat_erased(fmt::string_view format,
                                                          const format_arg (&args)[max_erased_args]);

/// Throws E with `format` formatted with the given leading arguments of `args`.
template <class E>
[[noreturn]] [[gnu::cold]] [[gnu::noinline]] void throw_erased(fmt::string_view format,
                                                               const format_arg (&args)[max_erased_args]) {
  throw E(vformat_erased(format, args));
}
}  // namespace detail

#if HETMESH_CHECK_FORMAT_STRINGS
/// fmt::format, with the format string checked at compile time (HETMESH_CHECK_FORMAT_STRINGS).
template <class... Args>
[[nodiscard]] std::string format(fmt::format_string<Args...> text, Args&&... args) {
  return fmt::vformat(text, fmt::make_format_args(args...));
}

/// fmt::format_to, checked like hetmesh::format.
template <class Out, class... Args>
Out format_to(Out out, fmt::format_string<Args...> text, Args&&... args) {
  return fmt::vformat_to(out, text, fmt::make_format_args(args...));
}

/// Throws E with a message formatted by fmt. `throw_error<invalid_argument>("cp={} ...", cp)`.
template <class E, class... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  detail::throw_formatted<E>(format, fmt::make_format_args(args...));
}
#else
/// fmt::format, with the format string checked when formatting rather than at compile time (unless
/// HETMESH_CHECK_FORMAT_STRINGS; a malformed string throws fmt::format_error). Not a template: each
/// argument converts to a type-erased detail::format_arg (instantiated once per argument type), so a call
/// site instantiates nothing per argument pack. The library's headers format through this and format_to.
[[nodiscard]] inline std::string format(fmt::string_view text, detail::format_arg a0 = {},
                                        detail::format_arg a1 = {}, detail::format_arg a2 = {},
                                        detail::format_arg a3 = {}, detail::format_arg a4 = {},
                                        detail::format_arg a5 = {}, detail::format_arg a6 = {},
                                        detail::format_arg a7 = {}, detail::format_arg a8 = {},
                                        detail::format_arg a9 = {}, detail::format_arg a10 = {},
                                        detail::format_arg a11 = {}, detail::format_arg a12 = {},
                                        detail::format_arg a13 = {}, detail::format_arg a14 = {},
                                        detail::format_arg a15 = {}) {
  return detail::vformat_erased(text, {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15});
}

/// hetmesh::format with more than detail::max_erased_args arguments.
template <class... Args>
requires(sizeof...(Args) > detail::max_erased_args) [[nodiscard]] std::string
    format(fmt::string_view text, Args&&... args) {
  return fmt::vformat(text,
                      detail::erased_args<fmt::format_context, std::remove_cvref_t<Args>...>(args...).get());
}

/// fmt::format_to, checked like hetmesh::format; one instantiation per output iterator type. Formats
/// through fmt::vformat (compiled into libfmt) and copies the result to `out`: calling fmt::vformat_to
/// with an iterator would compile fmt's whole formatting engine (about 70 KB of code at -O2) into every
/// translation unit that includes fmt/format.h. One string allocation per call.
template <class Out>
Out format_to(Out out, fmt::string_view text, detail::format_arg a0 = {}, detail::format_arg a1 = {},
              detail::format_arg a2 = {}, detail::format_arg a3 = {}, detail::format_arg a4 = {},
              detail::format_arg a5 = {}, detail::format_arg a6 = {}, detail::format_arg a7 = {},
              detail::format_arg a8 = {}, detail::format_arg a9 = {}, detail::format_arg a10 = {},
              detail::format_arg a11 = {}, detail::format_arg a12 = {}, detail::format_arg a13 = {},
              detail::format_arg a14 = {}, detail::format_arg a15 = {}) {
  const std::string s =
      detail::vformat_erased(text, {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15});
  return std::copy(s.begin(), s.end(), out);
}

/// hetmesh::format_to with more than detail::max_erased_args arguments.
template <class Out, class... Args>
requires(sizeof...(Args) > detail::max_erased_args) Out
    format_to(Out out, fmt::string_view text, Args&&... args) {
  const std::string s = fmt::vformat(
      text, detail::erased_args<fmt::format_context, std::remove_cvref_t<Args>...>(args...).get());
  return std::copy(s.begin(), s.end(), out);
}

/// Throws E with a message formatted by fmt. `throw_error<invalid_argument>("cp={} ...", cp)`.
/// A call site converts each argument to a type-erased detail::format_arg (instantiated once per
/// argument type); throw_error is instantiated once per exception type, and the formatting is out of
/// line (fmt::vformat).
template <class E>
[[noreturn]] void throw_error(fmt::string_view format, detail::format_arg a0 = {}, detail::format_arg a1 = {},
                              detail::format_arg a2 = {}, detail::format_arg a3 = {},
                              detail::format_arg a4 = {}, detail::format_arg a5 = {},
                              detail::format_arg a6 = {}, detail::format_arg a7 = {},
                              detail::format_arg a8 = {}, detail::format_arg a9 = {},
                              detail::format_arg a10 = {}, detail::format_arg a11 = {},
                              detail::format_arg a12 = {}, detail::format_arg a13 = {},
                              detail::format_arg a14 = {}, detail::format_arg a15 = {}) {
  detail::throw_erased<E>(format, {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15});
}

/// throw_error with more than detail::max_erased_args arguments.
template <class E, class... Args>
requires(sizeof...(Args) > detail::max_erased_args)
    [[noreturn]] void throw_error(fmt::string_view format, Args&&... args) {
  detail::throw_formatted<E>(
      format, detail::erased_args<fmt::format_context, std::remove_cvref_t<Args>...>(args...).get());
}
#endif
#endif

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED error& error::add_context(const std::string& frame) {
  full_ = frame + ": " + (full_.empty() ? message_ : full_);
  return *this;
}

}  // namespace hetmesh

#ifndef __CUDACC__  // device code formats no messages (fmt is not included there)
namespace hetmesh::detail {

HETMESH_COMPILED std::string vformat_erased(fmt::string_view format,
                                            const format_arg (&args)[max_erased_args]) {
  fmt::format_context::format_arg data[max_erased_args];
  return fmt::vformat(format, format_arg::pack(args, data));
}

}  // namespace hetmesh::detail
#endif
#endif  // HETMESH_BODIES
