// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: the communicator concept and the one primitive every backend provides, a batch of
// point-to-point operations. Collectives (collectives.hpp) call a backend's own implementation when
// it has one and otherwise build the operation from that primitive.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/memory_space.hpp"
#include "dtype.hpp"

namespace hetmesh::comm {

/// Where a communicator's buffers live (hetmesh::memory_space, core/memory_space.hpp). Host backends
/// (loopback, mpi) read and write the spans they are given; device backends (nccl) pass the pointers to
/// the device and never dereference them.
using memory_space = hetmesh::memory_space;

/// Raised on a rank whose communicator was aborted because another rank failed (its body threw, or
/// it gave up on a collective). The original failure is reported on the rank where it happened;
/// loopback::run prefers that one over these induced errors.
class aborted_error : public error {
 public:
  /// Takes the message, as hetmesh::error does.
  using error::error;
};

/// Largest tag a user may pass to send/recv/p2p ops; tags above it are reserved for the generic
/// collectives built from point-to-point operations.
inline constexpr int max_user_tag = (1 << 20) - 1;

/// One operation of a point-to-point batch, type-erased so that a batch may mix element types.
/// Build them with `send_op` / `recv_op`; the buffers must stay alive until the batch completes.
struct p2p_op {
  /// Which way the data goes.
  enum class kind : std::uint8_t { send, recv };
  /// Send to `peer` or receive from it.
  kind what = kind::send;
  int peer = 0;            ///< rank within the communicator's group
  int tag = 0;             ///< 0 <= tag <= max_user_tag for user batches
  void* data = nullptr;    ///< host or device pointer, per the backend's memory_space
  std::int64_t count = 0;  ///< elements
  /// Element type of `data`.
  dtype type = dtype::uint8;

  friend bool operator==(const p2p_op&, const p2p_op&) = default;
};

/// A send of `buf` to `peer` with `tag`, for a batch.
template <element T>
[[nodiscard]] p2p_op send_op(std::span<const T> buf, int peer, int tag = 0) noexcept {
  return {p2p_op::kind::send,
          peer,
          tag,
          const_cast<std::remove_cv_t<T>*>(buf.data()),
          static_cast<std::int64_t>(buf.size()),
          dtype_of_v<T>};
}
template <element T>
[[nodiscard]] p2p_op send_op(std::span<T> buf, int peer, int tag = 0) noexcept {
  return send_op(std::span<const T>(buf), peer, tag);
}

/// A receive into `buf` from `peer` with `tag`, for a batch. The matching send must carry exactly
/// `buf.size()` elements of the same dtype.
template <element T>
[[nodiscard]] p2p_op recv_op(std::span<T> buf, int peer, int tag = 0) noexcept {
  static_assert(!std::is_const_v<T>, "recv_op needs a writable buffer");
  return {p2p_op::kind::recv, peer, tag, buf.data(), static_cast<std::int64_t>(buf.size()), dtype_of_v<T>};
}

/// Opt-in for the communicator concept: a backend declares `using is_communicator = void;` (or a
/// third party specialises this variable), so that an unrelated type with rank()/size() never
/// satisfies the concept by accident.
template <class C>
inline constexpr bool enable_communicator = requires {
  typename C::is_communicator;
};

/// A communicator is a backend handle for one group of ranks. Requirements:
///  1. opt-in: enable_communicator<C> is true;
///  2. `c.rank()` -> int, this caller's rank within the group, in [0, size);
///  3. `c.size()` -> int, the number of ranks in the group, >= 1;
///  4. `c.ranks()` -> std::span<const int>, the group's members as global (world) ranks, in group
///     order: ranks()[c.rank()] is the caller's global rank;
///  5. `c.group_p2p(std::span<const p2p_op>)`: issues every operation of the batch together and
///     returns when all have completed (host backends) or are enqueued (device backends); a batch
///     whose sends and receives match across ranks never deadlocks, whatever the order of its ops;
///  6. `C::memory` is the memory_space of the buffers its operations take.
/// Everything else (all_reduce, all_to_all_v, ...) is optional: collectives.hpp uses the backend's
/// member when present and otherwise a generic algorithm over group_p2p.
template <class C>
concept communicator = enable_communicator<std::remove_cvref_t<C>> &&
    requires(C& c, std::span<const p2p_op> ops) {
  { std::as_const(c).rank() } -> std::convertible_to<int>;
  { std::as_const(c).size() } -> std::convertible_to<int>;
  { std::as_const(c).ranks() } -> std::convertible_to<std::span<const int>>;
  c.group_p2p(ops);
  { std::remove_cvref_t<C>::memory } -> std::convertible_to<memory_space>;
};

/// A communicator whose buffers are host memory: the CPU may read and write every span its operations
/// take, and each operation has completed when it returns. Runtime pieces that pack, unpack or inspect
/// buffers on the CPU (run::reshard, the pipeline executor, delivery, ...) require it; the pieces that
/// take a model::memory_policy (token dispatch, the Ulysses exchange and attention) run on either.
/// Requirements:
///  1. communicator<C>;
///  2. `C::memory == memory_space::host`.
/// Models: comm::loopback::communicator, comm::mpi::communicator (static_assert in their headers).
template <class C>
concept host_communicator = communicator<C> &&(std::remove_cvref_t<C>::memory == memory_space::host);

/// A communicator whose buffers are device memory and whose operations are stream-ordered: an
/// operation returns once it is enqueued, and it runs after everything enqueued before it on the
/// communicator's current stream. Requirements:
///  1. communicator<C>;
///  2. `C::memory == memory_space::device`;
///  3. `typename C::stream_type`: the backend's stream handle (cudaStream_t for NCCL), copyable;
///  4. `std::as_const(c).stream()` -> C::stream_type: the stream operations are enqueued on now;
///  5. `c.set_stream(s)` with `s` a C::stream_type: later operations are enqueued on `s`, so they are
///     ordered after the caller's own work on `s` (no extra synchronisation);
///  6. `c.synchronize()`: returns when every operation enqueued so far has completed (bounded by the
///     communicator's timeout).
/// Models: comm::nccl::communicator (static_assert in nccl.hpp). comm/ does not include cuda/, so the
/// stream type is the backend's, not a hetmesh::cuda type.
template <class C>
concept device_communicator = communicator<C> &&(std::remove_cvref_t<C>::memory == memory_space::device) &&
                              requires(C& c, typename std::remove_cvref_t<C>::stream_type s) {
  { std::as_const(c).stream() } -> std::convertible_to<typename std::remove_cvref_t<C>::stream_type>;
  c.set_stream(s);
  c.synchronize();
};

/// A communicator's group and caller as plain values (its members as world ranks, this rank, the group's
/// size), so that code which only reports or checks them is not a template over the communicator.
struct group_view {
  std::span<const int> ranks;  ///< the group's members as ranks of the world, in group order
  int rank = 0;                ///< the caller's index in the group
  int size = 0;                ///< the group's size
};

/// `c`'s group and caller.
template <communicator C>
[[nodiscard]] group_view view_of(const C& c) {
  return group_view{c.ranks(), c.rank(), c.size()};
}

/// "group [0,2,4] rank 1/3": the group and caller as error messages print them. A group of more than
/// 6 ranks prints its first 4 and last 2 members and its size ("group [0,1,2,3,...,16382,16383] of
/// 16384 rank 1/16384"), so a message stays short on a large cluster. O(1) in the group size.
[[nodiscard]] HETMESH_COMPILED std::string describe(group_view g)
#if HETMESH_BODIES
{
  const std::span<const int> r = g.ranks;
  if (r.size() <= 6) return hetmesh::format("group [{}] rank {}/{}", fmt::join(r, ","), g.rank, g.size);
  return hetmesh::format("group [{},...,{}] of {} rank {}/{}", fmt::join(r.first(4), ","),
                         fmt::join(r.last(2), ","), r.size(), g.rank, g.size);
}
#else
    ;
#endif

/// describe(view_of(c)): `c`'s group and caller as error messages print them.
template <communicator C>
[[nodiscard]] std::string describe(const C& c) {
  return describe(view_of(c));
}

}  // namespace hetmesh::comm

template <>
struct fmt::formatter<hetmesh::memory_space> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::memory_space m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m == hetmesh::memory_space::host ? "host" : "device");
  }
};

template <>
struct fmt::formatter<hetmesh::comm::p2p_op> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::comm::p2p_op& op, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}(peer={}, tag={}, {} x {})",
                              op.what == hetmesh::comm::p2p_op::kind::send ? "send" : "recv", op.peer, op.tag,
                              op.count, op.type);
  }
};
