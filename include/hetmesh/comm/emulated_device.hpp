// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::emulated_device: a device communicator on a machine without a GPU. It wraps a host
// communicator (loopback threads, MPI) and takes emulated device pointers (core/memory_space.hpp) where NCCL
// takes device pointers: every operation maps its buffers back to host memory and runs on the wrapped
// communicator. A host buffer passed to it is refused (invalid_argument naming the operation), as passing
// one to NCCL would be a bug; operations complete when they return, which satisfies the stream-ordered
// contract trivially. With model::emulated_device_memory, the device path of the runtime runs and is tested
// on CPUs exactly as it would over NCCL and cuda::device_memory.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../core/memory_space.hpp"
#include "collectives.hpp"
#include "communicator.hpp"
#include "group_cache.hpp"

namespace hetmesh::comm {

/// A device communicator over host communicator `Host`, taking emulated device pointers. Owns the wrapped
/// communicator. Models comm::device_communicator (stream_type is an int the wrapper records and ignores).
template <host_communicator Host>
class emulated_device {
 public:
  using is_communicator = void;  ///< opt-in for comm::communicator
  /// Buffers are (emulated) device memory.
  static constexpr memory_space memory = memory_space::device;
  /// A stand-in for a device stream: recorded by set_stream, returned by stream(), ordering nothing
  /// (every operation completes before it returns).
  using stream_type = int;

  /// Wraps `host` (moved in).
  explicit emulated_device(Host host) : host_(std::move(host)) {}

  /// The caller's rank in the group (the wrapped communicator's).
  [[nodiscard]] int rank() const noexcept { return host_.rank(); }
  /// Ranks in the group.
  [[nodiscard]] int size() const noexcept { return host_.size(); }
  /// The group's members as world ranks, in group order.
  [[nodiscard]] std::span<const int> ranks() const noexcept { return host_.ranks(); }
  /// The wrapped host communicator (for control traffic in host memory).
  [[nodiscard]] Host& host() noexcept { return host_; }
  /// The stream set last (0 at first).
  [[nodiscard]] stream_type stream() const noexcept { return stream_; }
  /// Records `s` (device_communicator requirement 5; orders nothing here).
  void set_stream(stream_type s) noexcept { stream_ = s; }
  /// Every operation has completed when it returned: nothing to wait for.
  void synchronize() const noexcept {}

  /// The batch with each buffer mapped to host memory, on the wrapped communicator.
  void group_p2p(std::span<const p2p_op> ops) {
    std::vector<p2p_op> h(ops.begin(), ops.end());
    for (auto& op : h)
      if (op.count > 0) op.data = emulated::to_host(op.data, "comm::emulated_device::group_p2p");
    comm::group_p2p(host_, std::span<const p2p_op>(h));
  }
  /// comm::all_reduce on the wrapped communicator, over the host memory behind `inout`.
  template <element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    comm::all_reduce(host_, host(inout, "all_reduce"), op);
  }
  /// comm::broadcast on the wrapped communicator, over the host memory behind `buf`.
  template <element T>
  void broadcast(std::span<T> buf, int root) {
    comm::broadcast(host_, host(buf, "broadcast"), root);
  }
  /// comm::all_gather on the wrapped communicator, over the host memory behind the buffers.
  template <element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    comm::all_gather(host_, host(send, "all_gather"), host(recv, "all_gather"));
  }
  /// comm::reduce_scatter on the wrapped communicator, over the host memory behind the buffers.
  template <element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, reduce_op op) {
    comm::reduce_scatter(host_, host(send, "reduce_scatter"), host(recv, "reduce_scatter"), op);
  }
  /// Counts and displacements are host arrays (as for every backend); the payloads are device memory.
  template <element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_displs, std::span<T> recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs) {
    comm::all_to_all_v(host_, host(send, "all_to_all_v"), send_counts, send_displs,
                       host(recv, "all_to_all_v"), recv_counts, recv_displs);
  }
  /// comm::barrier on the wrapped communicator.
  void barrier() { comm::barrier(host_); }

  /// The wrapped communicator's split, wrapped, on this one's stream (as NCCL's split keeps the parent's
  /// stream). Collective over this group.
  [[nodiscard]] emulated_device split(int color, int key) {
    emulated_device child(comm::split(host_, color, key));
    child.stream_ = stream_;
    return child;
  }
  /// The wrapped communicator's subgroup, wrapped, on this one's stream (host backends that have one).
  [[nodiscard]] emulated_device subgroup(std::span<const int> members) const requires
      subgroup_communicator<Host> {
    emulated_device child(host_.subgroup(members));
    child.stream_ = stream_;
    return child;
  }

 private:
  template <class T>
  static std::span<T> host(std::span<T> s, const char* op) {
    if (s.empty()) return s;
    return std::span<T>(emulated::to_host(s.data(), op), s.size());
  }

  Host host_;
  stream_type stream_ = 0;
};

}  // namespace hetmesh::comm
