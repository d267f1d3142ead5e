// SPDX-License-Identifier: Apache-2.0
// hetmesh::core: function_ref, a non-owning, non-allocating reference to a callable (as C++26's
// std::function_ref, smaller): two pointers, one indirect call. The runtime takes its callbacks through it,
// so a function that calls back (run::execute_pipeline_erased) is a template over its data types only, not
// over every caller's lambdas, and can be compiled once (docs/compile-time.md).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace hetmesh {

template <class Signature>
class function_ref;

/// A reference to a callable object invocable as R(Args...): it neither owns nor copies the object, so the
/// object must outlive every call through the reference (bind it to a named object, never to a temporary:
/// only lvalues are accepted). Empty when default-constructed (`bool(f)` is false; calling it is undefined).
/// Copying copies the reference. A result convertible to R is converted (static_cast); with R = void it is
/// discarded. Cost: one indirect call per call; no allocation, ever.
template <class R, class... Args>
class function_ref<R(Args...)> {
 public:
  /// The empty reference.
  constexpr function_ref() noexcept = default;

  /// A reference to `f`, which must outlive the reference's use. F may be const (called as const).
  template <class F>
  requires(std::is_object_v<F> && !std::is_same_v<std::remove_cv_t<F>, function_ref> &&
           std::is_invocable_v<F&, Args...> &&
           (std::is_void_v<R> ||
            std::is_convertible_v<
                std::invoke_result_t<F&, Args...>,
                R>)) constexpr function_ref(F& f) noexcept  // NOLINT(google-explicit-constructor):
                                                            // a reference converts
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_(&call<F>) {}

  /// Calls the referenced callable with `args`. Precondition: not empty.
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

  /// Whether the reference refers to a callable.
  [[nodiscard]] constexpr explicit operator bool() const noexcept { return call_ != nullptr; }

 private:
  template <class F>
  static R call(void* object, Args... args) {
    if constexpr (std::is_void_v<R>)
      (*static_cast<F*>(object))(std::forward<Args>(args)...);
    else
      return static_cast<R>((*static_cast<F*>(object))(std::forward<Args>(args)...));
  }

  void* object_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace hetmesh
