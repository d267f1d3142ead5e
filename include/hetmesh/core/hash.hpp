// SPDX-License-Identifier: Apache-2.0
// hetmesh: stable hashing of plans. `plan_hash(x)` is equal on every rank, platform and run for
// equal values: it hashes values, never addresses, and never depends on unordered iteration order.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace hetmesh {

/// Streaming 64-bit hash (FNV-1a over bytes, finalised with a splitmix64 mix). Not cryptographic.
class hasher {
 public:
  constexpr hasher() = default;

  /// Mixes `n` bytes into the state. Cost: O(n).
  constexpr void add_bytes(const unsigned char* data, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      state_ ^= data[i];
      state_ *= 0x100000001b3ULL;
    }
  }
  /// Mixes the 8 bytes of `v`, little-endian whatever the host order, so digests agree across machines.
  constexpr void add_u64(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) {
      state_ ^= (v >> (8 * i)) & 0xffU;
      state_ *= 0x100000001b3ULL;
    }
  }
  /// The finalised 64-bit digest of everything added so far; the state is unchanged, so adding may go on.
  [[nodiscard]] constexpr std::uint64_t digest() const noexcept {
    std::uint64_t z = state_ + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_ = 0xcbf29ce484222325ULL;
};

namespace detail {
template <class T>
concept has_member_hash_append = requires(const T& t, hasher& h) {
  t.hash_append(h);
};
template <class T>
concept has_adl_hash_append = requires(const T& t, hasher& h) {
  hash_append(h, t);
};
}  // namespace detail

/// Appends `v` to `h`. Customisation, in order: a member `void hash_append(hasher&) const`; an ADL
/// `hash_append(hasher&, const T&)`; integers, enums, floating point (by bit pattern, with -0 == +0),
/// strings, pairs, optionals and containers (anything with begin(), end() and size(); length-prefixed).
/// The cheap type traits are tested first and containers are recognised by their members rather than
/// by std::ranges concepts: every plan type instantiates this, so its compile cost is paid everywhere.
template <class T>
constexpr void append(hasher& h, const T& v) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    h.add_u64(v ? 1U : 0U);
  } else if constexpr (std::is_integral_v<U> || std::is_enum_v<U>) {
    h.add_u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
  } else if constexpr (std::is_floating_point_v<U>) {
    double d = static_cast<double>(v);
    if (d == 0.0) d = 0.0;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    h.add_u64(bits);
  } else if constexpr (detail::has_member_hash_append<U>) {
    v.hash_append(h);
  } else if constexpr (detail::has_adl_hash_append<U>) {
    hash_append(h, v);
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    const std::string_view s = v;
    h.add_u64(s.size());
    for (char c : s) h.add_u64(static_cast<unsigned char>(c));
  } else if constexpr (requires {
                         v.first;
                         v.second;
                       }) {
    append(h, v.first);
    append(h, v.second);
  } else if constexpr (requires {
                         v.has_value();
                         *v;
                       }) {
    h.add_u64(v.has_value() ? 1U : 0U);
    if (v.has_value()) append(h, *v);
  } else if constexpr (requires {
                         v.begin();
                         v.end();
                         v.size();
                       }) {
    h.add_u64(static_cast<std::uint64_t>(v.size()));
    for (const auto& x : v) append(h, x);
  } else {
    static_assert(sizeof(U) == 0,
                  "hetmesh::append: give this type a member `void hash_append(hetmesh::hasher&) const` "
                  "that appends each field with hetmesh::append");
  }
}

/// Appends several values in order.
template <class... Ts>
constexpr void append_all(hasher& h, const Ts&... vs) {
  (append(h, vs), ...);
}

/// The stable hash of a plan (or any hashable value). Equal values give equal hashes on every rank.
template <class T>
[[nodiscard]] constexpr std::uint64_t plan_hash(const T& v) {
  hasher h;
  append(h, v);
  return h.digest();
}

}  // namespace hetmesh
