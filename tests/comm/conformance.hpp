// SPDX-License-Identifier: Apache-2.0
// The communication conformance suite: ONE body, templated on the communicator, that runs every
// collective over several element types, sizes (0, 1, odd, large) and group shapes, on data that is a
// pure function of (seed, rank, index), and checks every element exactly. The loopback tests, the
// MPI test (under mpirun) and the NCCL test (on a GPU) all run this body.
//
// Checks run on every rank; a wrong element raises hetmesh::data_error naming the op, dtype, size,
// group, rank, index, the value received and the value expected. (Assertions are raised as
// exceptions, not doctest CHECKs, because they happen on loopback's worker threads.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/core/random.hpp>

namespace hetmesh::comm::testing {

/// Calls the free collectives directly on host buffers. A device backend's test supplies an invoker
/// with the same members that stages the buffers through device memory.
struct direct_invoker {
  template <class C, class T>
  static void all_reduce(C& c, std::span<T> x, reduce_op op) {
    comm::all_reduce(c, x, op);
  }
  template <class C, class T>
  static void broadcast(C& c, std::span<T> x, int root) {
    comm::broadcast(c, x, root);
  }
  template <class C, class T>
  static void all_gather(C& c, std::span<const T> s, std::span<T> r) {
    comm::all_gather(c, s, r);
  }
  template <class C, class T>
  static void all_gather_v(C& c, std::span<const T> s, std::span<T> r, std::span<const std::int64_t> counts) {
    comm::all_gather_v(c, s, r, counts);
  }
  template <class C, class T>
  static void reduce_scatter(C& c, std::span<const T> s, std::span<T> r, reduce_op op) {
    comm::reduce_scatter(c, s, r, op);
  }
  template <class C, class T>
  static void all_to_all(C& c, std::span<const T> s, std::span<T> r) {
    comm::all_to_all(c, s, r);
  }
  template <class C, class T>
  static void all_to_all_v(C& c, std::span<const T> s, std::span<const std::int64_t> sc,
                           std::span<const std::int64_t> sd, std::span<T> r, std::span<const std::int64_t> rc,
                           std::span<const std::int64_t> rd) {
    comm::all_to_all_v(c, s, sc, sd, r, rc, rd);
  }
  template <class C>
  static void group_p2p(C& c, std::span<const p2p_op> ops) {
    comm::group_p2p(c, ops);
  }
  template <class C>
  static void barrier(C& c) {
    comm::barrier(c);
  }
};

/// What to run. Defaults are the full suite.
struct conformance_options {
  std::vector<std::int64_t> sizes{0, 1, 7, 1 << 16};
  bool reductions = true;  ///< all_reduce, reduce_scatter
  std::vector<reduce_op> ops{reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg};
  std::uint64_t seed = 20260;
};

/// A value of rank `rank` at `index` for the given reduce_op. The ranges keep every result exact in
/// every type: sums of 8 values of |v| <= 100, products of 8 values of |v| <= 2, integers < 2^24 in float.
template <class T>
[[nodiscard]] T value(std::uint64_t seed, int rank, std::int64_t index, reduce_op op = reduce_op::min) {
  const std::uint64_t h =
      key_hash({seed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(index)});
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return static_cast<T>(static_cast<std::int64_t>(h % 201) - 100);
    case reduce_op::prod:
      return static_cast<T>(((h & 1) ? 1 : -1) * static_cast<std::int64_t>(1 + (h >> 1) % 2));
    default:
      return static_cast<T>(static_cast<std::int64_t>(h % 2000001) - 1000000);
  }
}

/// The reduction of every group rank's value at `index`, in rank order, as the backends compute it.
template <class T>
[[nodiscard]] T reduced(std::uint64_t seed, int group_size, std::int64_t index, reduce_op op) {
  T acc = value<T>(seed, 0, index, op);
  for (int r = 1; r < group_size; ++r) {
    const T v = value<T>(seed, r, index, op);
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg:
        acc = static_cast<T>(acc + v);
        break;
      case reduce_op::prod:
        acc = static_cast<T>(acc * v);
        break;
      case reduce_op::min:
        acc = std::min(acc, v);
        break;
      case reduce_op::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == reduce_op::avg) acc = static_cast<T>(acc / static_cast<T>(group_size));
  return acc;
}

/// Counts checked elements and raises on the first wrong one.
class checker {
 public:
  template <communicator C, class T>
  void expect(const C& c, std::string_view op, std::int64_t size, std::int64_t index, T got, T want) {
    ++checked_;
    if (!(got == want))
      throw_error<data_error>("conformance: {} of {} x {} on {}: element {} is {}; expected {}", op, size,
                              dtype_of_v<T>, describe(c), index, got, want);
  }
  [[nodiscard]] std::int64_t checked() const noexcept { return checked_; }

 private:
  std::int64_t checked_ = 0;
};

template <class Invoker, communicator C, class T>
void conform_type(C& c, const conformance_options& opt, checker& ck) {
  const int n = c.size(), me = c.rank();
  const std::uint64_t s = opt.seed + static_cast<std::uint64_t>(dtype_of_v<T>) * 1000;
  for (const std::int64_t m : opt.sizes) {
    const auto mu = static_cast<std::size_t>(m);
    if (opt.reductions) {
      for (const reduce_op op : opt.ops) {
        std::vector<T> x(mu);
        for (std::int64_t i = 0; i < m; ++i) x[static_cast<std::size_t>(i)] = value<T>(s, me, i, op);
        Invoker::all_reduce(c, std::span<T>(x), op);
        for (std::int64_t i = 0; i < m; ++i)
          ck.expect(c, "all_reduce", m, i, x[static_cast<std::size_t>(i)], reduced<T>(s, n, i, op));
        // reduce_scatter: rank j's block j of every rank's send, reduced.
        std::vector<T> send(mu * static_cast<std::size_t>(n)), recv(mu);
        for (std::size_t i = 0; i < send.size(); ++i)
          send[i] = value<T>(s + 1, me, static_cast<std::int64_t>(i), op);
        Invoker::reduce_scatter(c, std::span<const T>(send), std::span<T>(recv), op);
        for (std::int64_t i = 0; i < m; ++i)
          ck.expect(c, "reduce_scatter", m, i, recv[static_cast<std::size_t>(i)],
                    reduced<T>(s + 1, n, static_cast<std::int64_t>(me) * m + i, op));
      }
    }
    for (const int root : {0, n - 1}) {
      std::vector<T> x(mu);
      for (std::int64_t i = 0; i < m; ++i) x[static_cast<std::size_t>(i)] = value<T>(s + 2, me, i);
      Invoker::broadcast(c, std::span<T>(x), root);
      for (std::int64_t i = 0; i < m; ++i)
        ck.expect(c, "broadcast", m, i, x[static_cast<std::size_t>(i)], value<T>(s + 2, root, i));
    }
    {
      std::vector<T> x(mu), all(mu * static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < m; ++i) x[static_cast<std::size_t>(i)] = value<T>(s + 3, me, i);
      Invoker::all_gather(c, std::span<const T>(x), std::span<T>(all));
      for (int j = 0; j < n; ++j)
        for (std::int64_t i = 0; i < m; ++i)
          ck.expect(c, "all_gather", m, j * m + i, all[static_cast<std::size_t>(j * m + i)],
                    value<T>(s + 3, j, i));
    }
    {  // all_gather_v: rank j contributes (m + j) % (m + 2) elements (zero for some ranks when m is small)
      auto count_of = [&](int j) { return (m + j) % (m + 2); };
      std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) counts[static_cast<std::size_t>(j)] = count_of(j);
      std::vector<T> x(static_cast<std::size_t>(count_of(me)));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = value<T>(s + 4, me, static_cast<std::int64_t>(i));
      std::vector<T> all(
          static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), std::int64_t{0})));
      Invoker::all_gather_v(c, std::span<const T>(x), std::span<T>(all),
                            std::span<const std::int64_t>(counts));
      std::size_t k = 0;
      for (int j = 0; j < n; ++j)
        for (std::int64_t i = 0; i < count_of(j); ++i, ++k)
          ck.expect(c, "all_gather_v", m, static_cast<std::int64_t>(k), all[k], value<T>(s + 4, j, i));
    }
    {  // all_to_all: block j from rank i holds value(i, j*m + e)
      std::vector<T> send(mu * static_cast<std::size_t>(n)), recv(send.size());
      for (std::size_t i = 0; i < send.size(); ++i)
        send[i] = value<T>(s + 5, me, static_cast<std::int64_t>(i));
      Invoker::all_to_all(c, std::span<const T>(send), std::span<T>(recv));
      for (int j = 0; j < n; ++j)
        for (std::int64_t e = 0; e < m; ++e)
          ck.expect(c, "all_to_all", m, j * m + e, recv[static_cast<std::size_t>(j * m + e)],
                    value<T>(s + 5, j, static_cast<std::int64_t>(me) * m + e));
    }
    {  // all_to_all_v with uneven counts and gaps between blocks (the gaps must stay untouched)
      auto cnt = [&](int from, int to) { return (m + from + 2 * to) % (m + 3); };
      const auto nu = static_cast<std::size_t>(n);
      std::vector<std::int64_t> sc(nu), sd(nu), rc(nu), rd(nu);
      std::int64_t so = 0, ro = 0;
      for (int j = 0; j < n; ++j) {
        const auto ju = static_cast<std::size_t>(j);
        sc[ju] = cnt(me, j), sd[ju] = so + j, so += sc[ju] + j;
        rc[ju] = cnt(j, me), rd[ju] = ro + 1, ro += rc[ju] + 1;
      }
      std::vector<T> send(static_cast<std::size_t>(so)), recv(static_cast<std::size_t>(ro), T(-7));
      for (int j = 0; j < n; ++j)
        for (std::int64_t e = 0; e < sc[static_cast<std::size_t>(j)]; ++e)
          send[static_cast<std::size_t>(sd[static_cast<std::size_t>(j)] + e)] =
              value<T>(s + 6, me, static_cast<std::int64_t>(j) * 1000003 + e);
      Invoker::all_to_all_v(c, std::span<const T>(send), std::span<const std::int64_t>(sc),
                            std::span<const std::int64_t>(sd), std::span<T>(recv),
                            std::span<const std::int64_t>(rc), std::span<const std::int64_t>(rd));
      std::vector<T> want(recv.size(), T(-7));
      for (int j = 0; j < n; ++j)
        for (std::int64_t e = 0; e < rc[static_cast<std::size_t>(j)]; ++e)
          want[static_cast<std::size_t>(rd[static_cast<std::size_t>(j)] + e)] =
              value<T>(s + 6, j, static_cast<std::int64_t>(me) * 1000003 + e);
      for (std::size_t i = 0; i < recv.size(); ++i)
        ck.expect(c, "all_to_all_v", m, static_cast<std::int64_t>(i), recv[i], want[i]);
    }
    {  // grouped point-to-point: a ring both ways, ops issued receive-first to prove batching
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      std::vector<T> to_next(mu), to_prev(mu), from_prev(mu), from_next(mu);
      for (std::int64_t i = 0; i < m; ++i) {
        to_next[static_cast<std::size_t>(i)] = value<T>(s + 7, me, i);
        to_prev[static_cast<std::size_t>(i)] = value<T>(s + 8, me, i);
      }
      const p2p_op ops[] = {
          recv_op(std::span<T>(from_prev), prev, 1), recv_op(std::span<T>(from_next), next, 2),
          send_op(std::span<const T>(to_next), next, 1), send_op(std::span<const T>(to_prev), prev, 2)};
      Invoker::group_p2p(c, std::span<const p2p_op>(ops));
      for (std::int64_t i = 0; i < m; ++i) {
        ck.expect(c, "group_p2p", m, i, from_prev[static_cast<std::size_t>(i)], value<T>(s + 7, prev, i));
        ck.expect(c, "group_p2p", m, i, from_next[static_cast<std::size_t>(i)], value<T>(s + 8, next, i));
      }
    }
  }
  Invoker::barrier(c);
}

/// Runs every collective on `c` for int32, int64, float and double. Returns the number of elements
/// checked on this rank.
template <class Invoker = direct_invoker, communicator C>
std::int64_t conform(C& c, const conformance_options& opt = {}) {
  checker ck;
  conform_type<Invoker, C, std::int32_t>(c, opt, ck);
  conform_type<Invoker, C, std::int64_t>(c, opt, ck);
  conform_type<Invoker, C, float>(c, opt, ck);
  conform_type<Invoker, C, double>(c, opt, ck);
  return ck.checked();
}

/// The group shapes: the whole group, then two sub-groups (even and odd ranks, each in reverse order,
/// so group order differs from parent order), each running the suite with small sizes. Needs
/// `c.subgroup(members)` (loopback, mpi).
template <class Invoker = direct_invoker, communicator C>
std::int64_t conform_with_groups(C& c, const conformance_options& opt = {}) {
  std::int64_t checked = conform<Invoker>(c, opt);
  if (c.size() > 1) {
    std::vector<int> mine;
    for (int r = c.size() - 1; r >= 0; --r)
      if (r % 2 == c.rank() % 2) mine.push_back(r);
    auto sub = c.subgroup(std::span<const int>(mine));
    conformance_options small = opt;
    small.sizes = {0, 1, 7, 130};
    checked += conform<Invoker>(sub, small);
  }
  return checked;
}

}  // namespace hetmesh::comm::testing
