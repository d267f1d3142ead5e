// SPDX-License-Identifier: Apache-2.0
// Memory policies and the emulated device: host_memory and emulated_device_memory compute the same bits;
// emulated device pointers refuse host memory (and the other way round) with a message naming the operation;
// comm::emulated_device moves emulated device buffers over loopback ranks exactly as the host communicator
// moves host buffers, and refuses host buffers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>

#include "support/memory_sequence.hpp"

using namespace hetmesh;

namespace {

template <class T>
std::vector<T> sequence_inputs(std::size_t rows, std::size_t dim, std::vector<T>& y, std::vector<T>& la,
                               std::vector<T>& lb) {
  rng gen(rows * 31 + dim);
  std::vector<T> x(rows * dim);
  y.resize(rows * dim), la.resize(rows), lb.resize(rows);
  for (auto* v : {&x, &y})
    for (auto& e : *v) e = static_cast<T>(gen.unit() * 2 - 1);
  for (std::size_t r = 0; r < rows; ++r) {
    la[r] = r % 7 == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(gen.unit() * 4 - 2);
    lb[r] = r % 5 == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(gen.unit() * 4 - 2);
  }
  return x;
}

template <class T>
void same_bits(std::size_t rows, std::size_t dim) {
  std::vector<T> y, la, lb;
  const auto x = sequence_inputs<T>(rows, dim, y, la, lb);
  model::host_memory h;
  model::emulated_device_memory d;
  const auto want = test_support::run_memory_sequence(h, std::span<const T>(x), std::span<const T>(y),
                                                      std::span<const T>(la), std::span<const T>(lb), dim);
  const auto got = test_support::run_memory_sequence(d, std::span<const T>(x), std::span<const T>(y),
                                                     std::span<const T>(la), std::span<const T>(lb), dim);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::isnan(want[i]) && std::isnan(got[i]))) REQUIRE(got[i] == want[i]);
  // The sequence did something: row 1 (both lse finite) was merged, so it differs from its input.
  if (rows > 1) CHECK(want[dim] != x[dim]);
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("emulated device memory computes the same bits as host memory") {
  for (std::size_t dim : {1, 4, 33})
    for (std::size_t rows : {1, 9, 100}) {
      same_bits<double>(rows, dim);
      same_bits<float>(rows, dim);
    }
}

TEST_CASE("emulated device buffers are device pointers the CPU cannot use") {
  model::emulated_device_memory::buffer<double> b;
  b.resize(8);
  CHECK(emulated::is_device_pointer(b.span().data()));
  model::host_memory::buffer<double> hb;
  hb.resize(8);
  CHECK_FALSE(emulated::is_device_pointer(hb.span().data()));
  // The host view is the same storage: writes through it are seen through the device view's download.
  const auto host_view = emulated::to_host(b.span());
  std::iota(host_view.begin(), host_view.end(), 1.0);
  std::vector<double> back(8);
  model::emulated_device_memory{}.download(std::span<double>(back), std::span<const double>(b.span()));
  CHECK(back[7] == 8.0);
}

TEST_CASE("emulated device memory refuses host buffers, naming the operation") {
  model::emulated_device_memory d;
  std::vector<double> host(4);
  model::emulated_device_memory::buffer<double> dev;
  dev.resize(4);
  const auto m1 = message_of([&] { d.fill(std::span<double>(host), 1.0); });
  CHECK(m1.find("emulated_device_memory::fill") != std::string::npos);
  CHECK(m1.find("is a host pointer; expected an emulated device pointer") != std::string::npos);
  const auto m2 = message_of([&] { d.copy(dev.span(), std::span<const double>(host)); });
  CHECK(m2.find("emulated_device_memory::copy") != std::string::npos);
  // upload takes the host side as host memory: a device pointer there is refused by nothing, but the
  // device side must be device memory.
  const auto m3 = message_of([&] { d.upload(std::span<double>(host), std::span<const double>(host)); });
  CHECK(m3.find("emulated_device_memory::upload") != std::string::npos);
  const auto m4 = message_of([&] { (void)emulated::to_device(dev.span()); });
  CHECK(m4.find("already an emulated device pointer") != std::string::npos);
  const auto m5 = message_of([&] { d.copy(dev.span(), std::span<const double>(dev.span()).first(3)); });
  CHECK(m5.find("destination holds 4 elements, source 3") != std::string::npos);
  const auto m6 = message_of([&] { d.copy_2d(dev.span(), 2, std::span<const double>(dev.span()), 2, 3, 2); });
  CHECK(m6.find("expected pitch >= width") != std::string::npos);
}

TEST_CASE("comm::emulated_device moves device buffers over loopback ranks as the host communicator does") {
  static_assert(comm::device_communicator<comm::emulated_device<comm::loopback::communicator>>);
  constexpr int n = 4;
  comm::loopback::run(n, [](comm::loopback::communicator& host) {
    const int r = host.rank();
    comm::emulated_device dev(host.subgroup(std::vector<int>{0, 1, 2, 3}));
    model::emulated_device_memory mem;
    // all_reduce
    std::vector<double> mine = {1.0 + r, 10.0 * r};
    model::emulated_device_memory::buffer<double> b;
    b.resize(2);
    mem.upload(b.span(), std::span<const double>(mine));
    comm::all_reduce(dev, b.span(), comm::reduce_op::sum);
    std::vector<double> got(2);
    mem.download(std::span<double>(got), std::span<const double>(b.span()));
    CHECK(got[0] == 1.0 + 2.0 + 3.0 + 4.0);
    CHECK(got[1] == 60.0);
    // all_to_all_v: rank r sends j+1 elements of value 100r + j to rank j.
    std::vector<std::int64_t> sc(n), sd(n), rc(n), rd(n);
    for (int j = 0; j < n; ++j) sc[j] = j + 1, rc[j] = r + 1;
    std::exclusive_scan(sc.begin(), sc.end(), sd.begin(), std::int64_t{0});
    std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), std::int64_t{0});
    std::vector<double> send;
    for (int j = 0; j < n; ++j) send.insert(send.end(), static_cast<std::size_t>(j + 1), 100.0 * r + j);
    model::emulated_device_memory::buffer<double> ds, dr;
    ds.resize(send.size());
    dr.resize(static_cast<std::size_t>(n * (r + 1)));
    mem.upload(ds.span(), std::span<const double>(send));
    comm::all_to_all_v(dev, std::span<const double>(ds.span()), std::span<const std::int64_t>(sc),
                       std::span<const std::int64_t>(sd), dr.span(), std::span<const std::int64_t>(rc),
                       std::span<const std::int64_t>(rd));
    std::vector<double> recv(dr.size());
    mem.download(std::span<double>(recv), std::span<const double>(dr.span()));
    for (int i = 0; i < n; ++i)
      for (int k = 0; k <= r; ++k) CHECK(recv[static_cast<std::size_t>(i * (r + 1) + k)] == 100.0 * i + r);
    // group_p2p around a ring
    model::emulated_device_memory::buffer<double> out, in;
    out.resize(3), in.resize(3);
    mem.fill(out.span(), static_cast<double>(r));
    comm::group_p2p(dev, {comm::send_op(std::span<const double>(out.span()), (r + 1) % n, 5),
                          comm::recv_op(in.span(), (r + n - 1) % n, 5)});
    std::vector<double> ring(3);
    mem.download(std::span<double>(ring), std::span<const double>(in.span()));
    CHECK(ring[2] == static_cast<double>((r + n - 1) % n));
    // split keeps the wrapper: two halves, each all-reducing on its own.
    auto half = comm::split(dev, r / 2, r);
    static_assert(std::is_same_v<decltype(half), decltype(dev)>);
    mem.fill(b.span(), 1.0);
    comm::all_reduce(half, b.span(), comm::reduce_op::sum);
    mem.download(std::span<double>(got), std::span<const double>(b.span()));
    CHECK(got[0] == 2.0);
    // Children keep the parent's stream, as NCCL's split does once a stream is set.
    CHECK(half.stream() == 0);
    dev.set_stream(7);
    CHECK(comm::split(dev, 0, r).stream() == 7);
    CHECK(dev.subgroup(std::vector<int>{r}).stream() == 7);
    dev.set_stream(0);
    // A host buffer handed to the device communicator is refused on every rank, naming the operation.
    std::vector<double> host_buf(2, 1.0);
    const auto msg =
        message_of([&] { comm::all_reduce(dev, std::span<double>(host_buf), comm::reduce_op::sum); });
    CHECK(msg.find("all_reduce") != std::string::npos);
    CHECK(msg.find("is a host pointer") != std::string::npos);
  });
}

TEST_CASE(
    "bound_memory: the bound policy, a shared host policy when none is bound, an error for a device one") {
  model::host_memory h;
  CHECK(&model::bound_memory(&h, [] { return std::string("unused"); }) == &h);
  model::host_memory* none = nullptr;
  auto& shared = model::bound_memory(none, [] { return std::string("unused"); });
  CHECK(&shared == &model::bound_memory(none, [] { return std::string("unused"); }));
  model::emulated_device_memory* unbound = nullptr;
  CHECK_THROWS_WITH_AS(
      model::bound_memory(unbound, [] { return std::string("stage 1 has no memory policy"); }),
      "stage 1 has no memory policy", invalid_argument);
}
