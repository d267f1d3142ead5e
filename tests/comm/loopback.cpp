// SPDX-License-Identifier: Apache-2.0
// Loopback backend: the conformance suite at several world sizes, the generic (point-to-point) path
// of every collective, and the failure modes (missing rank, mismatched sizes, a failing rank, bad
// input), each of which must end in its documented error and never hang.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>

#include "conformance.hpp"
#include "p2p_only.hpp"

namespace comm = hetmesh::comm;
namespace lb = hetmesh::comm::loopback;
using namespace std::chrono_literals;

namespace {

using comm::testing::p2p_only;
static_assert(comm::communicator<p2p_only<lb::communicator>>);
static_assert(!comm::communicator<int>);

/// Runs `body` on n ranks and returns what each rank's body returned (as int64).
template <class F>
std::vector<std::int64_t> run_collect(int n, F body, std::chrono::milliseconds timeout = 20s) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n), -1);
  lb::run(
      n, [&](lb::communicator& c) { out[static_cast<std::size_t>(c.rank())] = body(c); }, timeout);
  return out;
}

}  // namespace

TEST_CASE("loopback: the conformance suite passes on worlds of 1, 2, 3, 4 and 8 ranks, with sub-groups") {
  for (const int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    comm::testing::conformance_options opt;
    if (n == 8) opt.sizes = {0, 1, 7, 4099};  // keep the 8-thread run quick on two cores
    const auto checked =
        run_collect(n, [&](lb::communicator& c) { return comm::testing::conform_with_groups(c, opt); });
    for (const auto k : checked) CHECK(k > 0);
  }
}

TEST_CASE("loopback: every collective built generically from group_p2p conforms") {
  for (const int n : {1, 3, 4}) {
    CAPTURE(n);
    comm::testing::conformance_options opt;
    opt.sizes = {0, 1, 7, 1000};
    const auto checked = run_collect(n, [&](lb::communicator& c) {
      p2p_only g(c);
      return comm::testing::conform(g, opt);
    });
    for (const auto k : checked) CHECK(k > 0);
  }
}

TEST_CASE("loopback: in-place all_gather and reduce_scatter") {
  lb::run(3, [](lb::communicator& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    std::vector<int> all(3 * 5, -1);
    for (std::size_t i = 0; i < 5; ++i) all[me * 5 + i] = static_cast<int>(me * 100 + i);
    comm::all_gather(c, std::span<const int>(all.data() + me * 5, 5), std::span<int>(all));
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t i = 0; i < 5; ++i)
        if (all[j * 5 + i] != static_cast<int>(j * 100 + i)) throw std::runtime_error("in-place all_gather");
    std::vector<int> rs(3 * 4);
    for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<int>(i + me);
    comm::reduce_scatter(c, std::span<const int>(rs), std::span<int>(rs.data() + me * 4, 4),
                         comm::reduce_op::sum);
    for (std::size_t i = 0; i < 4; ++i)
      if (rs[me * 4 + i] != static_cast<int>(3 * (me * 4 + i) + 3))
        throw std::runtime_error("in-place reduce_scatter");
  });
}

TEST_CASE("loopback: all_reduce and reduce_scatter combine in rank order, bitwise, across reduction blocks") {
  // Floats whose sum depends on the order of the additions; counts that cross the 8 KiB blocks of
  // detail::reduce_slice and leave a remainder, and do not divide evenly over the ranks.
  constexpr std::size_t m = 2 * 2048 + 123;
  auto value = [](std::size_t rank, std::size_t i) {
    return static_cast<float>((rank * 7919 + i * 104729) % 1000003) * (rank % 2 ? 1e-3F : 1e3F) + 0.1F;
  };
  for (const int n : {3, 5}) {
    CAPTURE(n);
    for (const auto op : {comm::reduce_op::sum, comm::reduce_op::avg, comm::reduce_op::prod,
                          comm::reduce_op::min, comm::reduce_op::max}) {
      CAPTURE(op);
      auto expected = [&](std::size_t i) {  // r0 op r1 op ... in rank order, then avg's one division
        float acc = value(0, i);
        for (std::size_t r = 1; r < static_cast<std::size_t>(n); ++r) {
          const float v = value(r, i);
          comm::detail::reduce_into(&acc, &v, 1, op);
        }
        comm::detail::finish_reduce(&acc, 1, op, n);
        return acc;
      };
      const auto bad = run_collect(n, [&](lb::communicator& c) {
        const auto me = static_cast<std::size_t>(c.rank());
        std::int64_t wrong = 0;
        std::vector<float> x(m);
        for (std::size_t i = 0; i < m; ++i) x[i] = value(me, i);
        comm::all_reduce(c, std::span<float>(x), op);
        for (std::size_t i = 0; i < m; ++i) wrong += x[i] != expected(i) ? 1 : 0;  // bitwise
        std::vector<float> rs(static_cast<std::size_t>(n) * m);
        for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
          for (std::size_t i = 0; i < m; ++i) rs[j * m + i] = value(me, j * m + i);
        comm::reduce_scatter(c, std::span<const float>(rs), std::span<float>(rs.data() + me * m, m), op);
        for (std::size_t i = 0; i < m; ++i) wrong += rs[me * m + i] != expected(me * m + i) ? 1 : 0;
        return wrong;
      });
      for (const auto w : bad) CHECK(w == 0);
    }
  }
}

TEST_CASE("loopback: a missing rank makes the others raise timeout_error quickly, naming the missing rank") {
  std::vector<std::string> messages(4);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(lb::run(
                      4,
                      [&](lb::communicator& c) {
                        if (c.rank() == 3) return;  // never calls the collective
                        std::vector<double> x(10, 1.0);
                        try {
                          comm::all_reduce(c, std::span<double>(x), comm::reduce_op::sum);
                        } catch (const hetmesh::timeout_error& e) {
                          messages[static_cast<std::size_t>(c.rank())] = e.what();
                          throw;
                        }
                      },
                      200ms),
                  hetmesh::timeout_error);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(messages[static_cast<std::size_t>(r)]);
    CHECK(messages[static_cast<std::size_t>(r)].find("all_reduce") != std::string::npos);
    CHECK(messages[static_cast<std::size_t>(r)].find("[3]") != std::string::npos);
  }
}

TEST_CASE("loopback: a receive with no matching send times out naming the peer") {
  try {
    lb::run(
        2,
        [](lb::communicator& c) {
          if (c.rank() == 0) {
            std::vector<int> x(4);
            comm::recv(c, std::span<int>(x), 1, 5);
          }
        },
        100ms);
    FAIL("expected timeout_error");
  } catch (const hetmesh::timeout_error& e) {
    const std::string what = e.what();
    CHECK(what.find("from rank 1 with tag 5") != std::string::npos);
  }
}

TEST_CASE("loopback: mismatched counts raise mismatch_error on every rank") {
  std::vector<int> mismatched(3, 0);
  CHECK_THROWS_AS(lb::run(3,
                          [&](lb::communicator& c) {
                            std::vector<int> x(c.rank() == 1 ? 5 : 4, 1);
                            try {
                              comm::all_reduce(c, std::span<int>(x), comm::reduce_op::sum);
                            } catch (const hetmesh::mismatch_error&) {
                              mismatched[static_cast<std::size_t>(c.rank())] = 1;
                              throw;
                            }
                          }),
                  hetmesh::mismatch_error);
  CHECK(mismatched == std::vector<int>{1, 1, 1});
}

TEST_CASE("loopback: other cross-rank disagreements are detected") {
  SUBCASE("different collectives") {
    CHECK_THROWS_AS(lb::run(2,
                            [](lb::communicator& c) {
                              std::vector<int> x(4, 1);
                              if (c.rank() == 0)
                                comm::all_reduce(c, std::span<int>(x), comm::reduce_op::sum);
                              else
                                comm::broadcast(c, std::span<int>(x), 0);
                            }),
                    hetmesh::mismatch_error);
  }
  SUBCASE("different dtypes") {
    CHECK_THROWS_AS(lb::run(2,
                            [](lb::communicator& c) {
                              std::vector<int> x(4, 1);
                              std::vector<float> y(4, 1);
                              if (c.rank() == 0)
                                comm::broadcast(c, std::span<int>(x), 0);
                              else
                                comm::broadcast(c, std::span<float>(y), 0);
                            }),
                    hetmesh::mismatch_error);
  }
  SUBCASE("different roots") {
    CHECK_THROWS_AS(lb::run(2,
                            [](lb::communicator& c) {
                              std::vector<int> x(4, 1);
                              comm::broadcast(c, std::span<int>(x), c.rank());
                            }),
                    hetmesh::mismatch_error);
  }
  SUBCASE("all_to_all_v counts that do not pair up") {
    CHECK_THROWS_AS(lb::run(2,
                            [](lb::communicator& c) {
                              std::vector<int> s(4, 1), r(4);
                              const std::int64_t sc[] = {1, c.rank() == 0 ? 2 : 1}, d[] = {0, 2};
                              const std::int64_t rc[] = {1, 1};
                              comm::all_to_all_v(c, std::span<const int>(s), std::span(sc), std::span(d),
                                                 std::span<int>(r), std::span(rc), std::span(d));
                            }),
                    hetmesh::mismatch_error);
  }
  SUBCASE("a receive buffer of the wrong size") {
    CHECK_THROWS_AS(lb::run(2,
                            [](lb::communicator& c) {
                              std::vector<int> x(c.rank() == 0 ? 6 : 4, 1);
                              if (c.rank() == 0)
                                comm::send(c, std::span<const int>(x), 1);
                              else
                                comm::recv(c, std::span<int>(x), 0);
                            }),
                    hetmesh::mismatch_error);
  }
}

TEST_CASE("loopback: a rank that throws aborts the others and run rethrows its error, not theirs") {
  std::atomic<int> aborted{0};
  try {
    lb::run(4, [&](lb::communicator& c) {
      if (c.rank() == 2) throw std::logic_error("rank two fails on purpose");
      try {
        comm::barrier(c);
      } catch (const comm::aborted_error&) {
        ++aborted;
        throw;
      }
    });
    FAIL("expected the rank's error");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()) == "rank two fails on purpose");
  }
  CHECK(aborted.load() == 3);  // no wait ran into its 60 s default timeout
}

TEST_CASE("loopback: bad input gets invalid_argument before anything is communicated") {
  CHECK_THROWS_AS(lb::run(0, [](lb::communicator&) {}), hetmesh::invalid_argument);
  lb::run(2, [](lb::communicator& c) {
    std::vector<int> a(4), b(7);
    CHECK_THROWS_AS(comm::send(c, std::span<const int>(a), 2), hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::send(c, std::span<const int>(a), -1), hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::send(c, std::span<const int>(a), 0, -3), hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::broadcast(c, std::span<int>(a), 5), hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::all_gather(c, std::span<const int>(a), std::span<int>(b)),
                    hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::all_to_all(c, std::span<const int>(b), std::span<int>(b)),
                    hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::all_to_all(c, std::span<const int>(a), std::span<int>(a)),
                    hetmesh::invalid_argument);
    CHECK_THROWS_AS(comm::reduce_scatter(c, std::span<const int>(b), std::span<int>(a), comm::reduce_op::sum),
                    hetmesh::invalid_argument);
    const std::int64_t counts[] = {4, 9};
    CHECK_THROWS_AS(comm::all_gather_v(c, std::span<const int>(a), std::span<int>(b), std::span(counts)),
                    hetmesh::invalid_argument);
    const std::int64_t sc[] = {2, 2}, sd[] = {0, 3};
    CHECK_THROWS_AS(comm::all_to_all_v(c, std::span<const int>(a), std::span(sc), std::span(sd),
                                       std::span<int>(b), std::span(sc), std::span(sd)),
                    hetmesh::invalid_argument);
    CHECK_THROWS_AS((void)c.subgroup(std::span<const int>()), hetmesh::invalid_argument);
    const int outside[] = {1 - c.rank()};
    CHECK_THROWS_AS((void)c.subgroup(std::span<const int>(outside)), hetmesh::invalid_argument);
    const int dup[] = {0, 0, 1};
    CHECK_THROWS_AS((void)c.subgroup(std::span<const int>(dup)), hetmesh::invalid_argument);
    comm::barrier(c);  // the group is still usable: nothing was communicated
  });
}

TEST_CASE("loopback: sub-groups are independent and creating one twice gives two groups") {
  lb::run(4, [](lb::communicator& c) {
    const int pair[] = {c.rank() / 2 * 2 + 1, c.rank() / 2 * 2};  // reversed pair order
    auto a = c.subgroup(std::span<const int>(pair));
    auto b = c.subgroup(std::span<const int>(pair));
    if (a.size() != 2 || a.ranks()[static_cast<std::size_t>(a.rank())] != c.rank())
      throw std::runtime_error("sub-group rank mapping");
    // Interleave collectives on a and b: distinct states, so they do not cross.
    std::vector<int> x{c.rank()}, y{10 * c.rank()};
    comm::all_reduce(a, std::span<int>(x), comm::reduce_op::max);
    comm::all_reduce(b, std::span<int>(y), comm::reduce_op::min);
    if (x[0] != c.rank() / 2 * 2 + 1 || y[0] != 10 * (c.rank() / 2 * 2))
      throw std::runtime_error("sub-group values");
  });
}

TEST_CASE("loopback: all_gather_vectors returns every rank's vector, lengths exchanged for it") {
  lb::run(4, [](lb::communicator& c) {
    std::vector<std::int64_t> mine(static_cast<std::size_t>(c.rank() % 3));  // lengths 0, 1, 2, 0
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = static_cast<std::int64_t>(hetmesh::key_hash({5, static_cast<std::uint64_t>(c.rank()), i}));
    const auto all = comm::all_gather_vectors(c, std::span<const std::int64_t>(mine));
    if (all.size() != 4) throw std::runtime_error("one vector per rank");
    for (int r = 0; r < 4; ++r) {
      const auto& v = all[static_cast<std::size_t>(r)];
      if (v.size() != static_cast<std::size_t>(r % 3)) throw std::runtime_error("length of rank's vector");
      for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != static_cast<std::int64_t>(hetmesh::key_hash({5, static_cast<std::uint64_t>(r), i})))
          throw std::runtime_error("value of rank's vector");
    }
  });
}
