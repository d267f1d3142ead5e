// SPDX-License-Identifier: Apache-2.0
// The communicator concept's host and device refinements: which types model which, checked at compile
// time (static_assert), with minimal stand-ins for the cases no backend here exhibits (a device type
// without set_stream, a type that is both in shape but names host memory).
#include <doctest/doctest.h>

#include <span>

#include <hetmesh/comm/communicator.hpp>
#include <hetmesh/comm/loopback.hpp>

#include "p2p_only.hpp"

namespace comm = hetmesh::comm;

namespace {
/// The members every communicator needs; Memory and the stream members vary below.
template <comm::memory_space Memory>
struct base {
  using is_communicator = void;
  static constexpr comm::memory_space memory = Memory;
  int rank() const { return 0; }
  int size() const { return 1; }
  std::span<const int> ranks() const { return {}; }
  void group_p2p(std::span<const comm::p2p_op>) {}
};
struct stream_handle {};
/// A device communicator: device memory, a stream it can be told to use, synchronize.
struct device_like : base<comm::memory_space::device> {
  using stream_type = stream_handle;
  stream_handle stream() const { return {}; }
  void set_stream(stream_handle) {}
  void synchronize() {}
};
/// Device memory but no way to order after the user's stream: a communicator, not a device_communicator.
struct device_without_stream : base<comm::memory_space::device> {};
/// Stream members but host memory: a host_communicator, never a device one.
struct host_with_stream : base<comm::memory_space::host> {
  using stream_type = stream_handle;
  stream_handle stream() const { return {}; }
  void set_stream(stream_handle) {}
  void synchronize() {}
};
}  // namespace

static_assert(comm::host_communicator<comm::loopback::communicator>);
static_assert(comm::host_communicator<comm::loopback::communicator&>);
static_assert(!comm::device_communicator<comm::loopback::communicator>);
static_assert(comm::host_communicator<comm::testing::p2p_only<comm::loopback::communicator>>);
static_assert(comm::device_communicator<device_like> && !comm::host_communicator<device_like>);
static_assert(comm::communicator<device_without_stream> &&
              !comm::device_communicator<device_without_stream> &&
              !comm::host_communicator<device_without_stream>);
static_assert(comm::host_communicator<host_with_stream> && !comm::device_communicator<host_with_stream>);
static_assert(!comm::host_communicator<int> && !comm::device_communicator<int>);

TEST_CASE("host_communicator and device_communicator split communicators by memory space") {
  CHECK(comm::host_communicator<comm::loopback::communicator>);
  CHECK(comm::device_communicator<device_like>);
  CHECK(!comm::device_communicator<device_without_stream>);
}
