// SPDX-License-Identifier: Apache-2.0
// hetmesh: where a buffer lives (host or device memory), and emulated device pointers: host memory handed
// out under addresses the CPU cannot dereference, so that a device code path (a runtime piece over a device
// communicator and a device memory policy) runs, and is tested, on a machine without a GPU. A device path
// that reads or writes a buffer on the CPU by mistake crashes at once on an emulated pointer instead of
// silently working as it would on host memory.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <type_traits>

#include "error.hpp"

namespace hetmesh {

/// Where a buffer lives. Host buffers are read and written by the CPU; device buffers are passed to the
/// device (kernels, device communicators, copies) and never dereferenced on the host.
enum class memory_space : std::uint8_t { host, device };

namespace emulated {

/// The address bit an emulated device pointer carries. User-space addresses on x86-64 and AArch64 are
/// below 2^48, so a host pointer never has it, and an address with it is not canonical: dereferencing
/// one faults on the first access.
inline constexpr std::uintptr_t device_bit = std::uintptr_t{1} << 62;

namespace detail {
// Plain std::string messages (no fmt): this header is also read by nvcc (cuda/device_memory.hpp).
inline std::string address(const void* p) {
  char buf[2 + 2 * sizeof(void*) + 1];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
}  // namespace detail

/// Whether `p` is an emulated device pointer (carries device_bit). O(1).
[[nodiscard]] inline bool is_device_pointer(const void* p) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & device_bit) != 0;
}

/// The emulated device view of host memory `p`: the same bytes, under an address the CPU cannot use.
/// Null stays null. Throws invalid_argument when `p` is already a device pointer. O(1).
template <class T>
[[nodiscard]] T* to_device(T* p) {
  if (p == nullptr) return p;
  if (is_device_pointer(p))
    throw invalid_argument("emulated::to_device: " + detail::address(p) +
                           " is already an emulated device pointer; expected host memory");
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) | device_bit);
}

/// The host memory behind emulated device pointer `p`. Null stays null. Throws invalid_argument naming `who`
/// when `p` is a host pointer: a host buffer was passed where the device path expects device memory. O(1).
template <class T>
[[nodiscard]] T* to_host(T* p, const char* who = "emulated::to_host") {
  if (p == nullptr) return p;
  if (!is_device_pointer(p))
    throw invalid_argument(std::string(who) + ": " + detail::address(p) +
                           " is a host pointer; expected an emulated device pointer (device memory from an "
                           "emulated device memory policy or emulated::to_device)");
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~device_bit);
}

/// span versions of to_device / to_host: the same elements, the other view. An empty span maps to an
/// empty span (its pointer is not checked).
template <class T>
[[nodiscard]] std::span<T> to_device(std::span<T> s) {
  return s.empty() ? std::span<T>() : std::span<T>(to_device(s.data()), s.size());
}
template <class T>
[[nodiscard]] std::span<T> to_host(std::span<T> s, const char* who = "emulated::to_host") {
  return s.empty() ? std::span<T>() : std::span<T>(to_host(s.data(), who), s.size());
}

}  // namespace emulated
}  // namespace hetmesh
