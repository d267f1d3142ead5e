// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::mpi: the MPI backend (host memory, any MPI_Comm). Needs the hetmesh::mpi CMake
// target (HETMESH_HAS_MPI).
//
// No hangs: every operation is issued nonblocking and polled with MPI_Testall until the
// communicator's timeout, after which it raises timeout_error. MPI cannot cancel a collective, so
// after a timeout the communicator is unusable (later calls raise) and the buffers of the timed-out
// call must stay alive as long as the communicator does (the destructor leaks the pending requests
// rather than wait for them). `options::blocking` uses the blocking MPI calls instead (no timeout,
// no polling), for runs that prefer MPI's own progress.
// Mismatches: a receive that gets more or fewer elements than its buffer raises mismatch_error
// (always). Collectives check that every rank passed the same op, dtype, counts and root when
// `options::verify` is set (default: at HETMESH_ASSERTION_LEVEL >= collective); the check is one
// small all-gather before the operation (detail/mpi_signature.hpp). Without it a mismatch is undefined
// behaviour in MPI (often a truncation error or a timeout). Creating communicators (dup, split, subgroup)
// waits within the same timeout (split and subgroup first check that every rank arrived, then make the
// blocking MPI call). A rank that dies (under `mpirun --enable-recovery`; by default mpirun ends the whole
// job) is a missing rank: the others raise timeout_error naming the operation, the group and their rank.
// Errors: the communicator's error handler is set to MPI_ERRORS_RETURN (also on a borrowed
// communicator) so that MPI failures become backend_error carrying MPI_Error_string's text.
#pragma once

#include "../config.hpp"

#if HETMESH_HAS_MPI

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "communicator.hpp"
#include "detail/members.hpp"
#include "detail/mpi_signature.hpp"
#include "detail/mpi_support.hpp"
#include "reduce_op.hpp"

namespace hetmesh::comm::mpi {

/// Per-communicator settings: timeout, verification, blocking or polling calls.
struct options {
  /// How long a polling collective waits before it raises timeout_error and marks the communicator broken.
  std::chrono::milliseconds timeout{HETMESH_DEFAULT_TIMEOUT_MS};
  bool verify =
      assertion_enabled(assertion_level::collective);  ///< cross-rank signature check per collective
  bool blocking = false;                               ///< blocking MPI calls: no timeout, no polling
  friend bool operator==(const options&, const options&) = default;
};

/// A handle on an MPI communicator (borrowed or owned), modelling comm::host_communicator. Collectives poll
/// nonblocking MPI calls so that a missing rank raises timeout_error instead of hanging (unless
/// options::blocking). Move-only: the handle is owned once.
class communicator : public comm::detail::group_members {
 public:
  /// Marks the type as a communicator (opt-in, as the concepts require).
  using is_communicator = void;
  /// Buffers are host memory.
  static constexpr memory_space memory = memory_space::host;

  /// Wraps `comm` without owning it (the caller frees it, after this object is gone).
  [[nodiscard]] static communicator borrow(MPI_Comm comm, options opt = {}) {
    return communicator(comm, false, opt);
  }
  /// Takes ownership of `comm`: MPI_Comm_free on destruction.
  [[nodiscard]] static communicator adopt(MPI_Comm comm, options opt = {}) {
    return communicator(comm, true, opt);
  }
  /// MPI_COMM_WORLD, borrowed. Pre: MPI is initialised (mpi::environment).
  [[nodiscard]] static communicator world(options opt = {}) { return borrow(MPI_COMM_WORLD, opt); }

  /// Moves the handle; `o` is left with MPI_COMM_NULL.
  communicator(communicator&& o) noexcept
      : group_members(std::move(o)),
        comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        owned_(std::exchange(o.owned_, false)),
        opt_(o.opt_),
        broken_(o.broken_),
        abandoned_(std::move(o.abandoned_)) {}
  /// Releases this handle (freeing it if owned) and takes `o`'s; `o` is left with MPI_COMM_NULL.
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL), owned_ = std::exchange(o.owned_, false), rank_ = o.rank_;
      ranks_ = std::move(o.ranks_), opt_ = o.opt_, broken_ = o.broken_, abandoned_ = std::move(o.abandoned_);
    }
    return *this;
  }
  ~communicator() { release(); }  // copies are deleted by group_members: the handle is owned once

  /// The native MPI_Comm, for MPI calls hetmesh does not wrap. Still owned by this object when adopted.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }
  /// The settings in use.
  [[nodiscard]] const options& opts() const noexcept { return opt_; }
  /// Replaces the settings. Local, not collective: every rank should set the same `verify`.
  void set_options(const options& o) { opt_ = o; }
  /// True after a timeout: every later operation raises.
  [[nodiscard]] bool broken() const noexcept { return broken_; }

  /// An owning duplicate. Collective over the group. Polling mode: MPI_Comm_idup completed within the
  /// timeout, else timeout_error naming "dup", the group and this rank (this handle is then broken, as
  /// after a timed-out collective); blocking mode: MPI_Comm_dup.
  [[nodiscard]] communicator dup() const {
    usable("dup");
    MPI_Comm c = MPI_COMM_NULL;
    if (opt_.blocking) {
      check(MPI_Comm_dup(comm_, &c), "MPI_Comm_dup", "dup");
    } else {
      MPI_Request q = MPI_REQUEST_NULL;
      check(MPI_Comm_idup(comm_, &c, &q), "MPI_Comm_idup", "dup");
      wait(std::span<MPI_Request>(&q, 1), {}, "dup", "every rank of the group to call dup");
    }
    return adopt(c, opt_);
  }
  /// MPI_Comm_split: groups of equal color ordered by (key, rank). Collective over the group. Polling
  /// mode: a barrier within the timeout first (timeout_error naming "split" when a rank is missing), so
  /// the blocking MPI_Comm_split starts only once every rank has arrived (MPI has no nonblocking split;
  /// a rank that dies between the two still blocks the others).
  [[nodiscard]] communicator split(int color, int key) const {
    arrive("split");
    MPI_Comm c = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &c), "MPI_Comm_split", "split");
    return adopt(c, opt_);
  }
  /// A communicator over `members` (ranks of this communicator, in order) by MPI_Comm_create_group:
  /// collective over the members only. Polling mode: the members first exchange a message with each
  /// other within the timeout (tag subgroup_tag; timeout_error naming "subgroup" when one is missing),
  /// so the blocking MPI_Comm_create_group starts once all have arrived. Pre: members distinct, in range,
  /// containing this rank.
  [[nodiscard]] communicator subgroup(std::span<const int> members) const {
    if (members.empty() || std::find(members.begin(), members.end(), rank_) == members.end())
      throw_error<invalid_argument>(
          "mpi subgroup on {}: [{}] does not contain this rank; expected a non-empty group "
          "containing the caller",
          comm::describe(*this), fmt::join(members, ","));
    for (const int r : members)
      if (r < 0 || r >= size())
        throw_error<invalid_argument>("mpi subgroup on {}: member {} out of range [0, {})",
                                      comm::describe(*this), r, size());
    usable("subgroup");
    if (!opt_.blocking) {
      // Every member sends one byte to every other and receives one from each: all arrived.
      const std::size_t m = members.size();
      auto bytes = std::make_unique<unsigned char[]>(2 * m);  // [0, m): received; [m, 2m): sent
      std::vector<MPI_Request> reqs;
      for (std::size_t i = 0; i < m; ++i) {
        if (members[i] == rank_) continue;
        reqs.emplace_back(MPI_REQUEST_NULL);
        check(MPI_Irecv(&bytes[i], 1, MPI_UNSIGNED_CHAR, members[i], subgroup_tag, comm_, &reqs.back()),
              "MPI_Irecv", "subgroup");
        reqs.emplace_back(MPI_REQUEST_NULL);
        check(MPI_Isend(&bytes[m + i], 1, MPI_UNSIGNED_CHAR, members[i], subgroup_tag, comm_, &reqs.back()),
              "MPI_Isend", "subgroup");
      }
      try {
        wait(std::span<MPI_Request>(reqs), {}, "subgroup", "every member of the subgroup to call subgroup");
      } catch (const timeout_error&) {
        (void)bytes.release();  // the abandoned requests still point into it: leaked on purpose
        throw;
      }
    }
    MPI_Group parent = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
    check(MPI_Comm_group(comm_, &parent), "MPI_Comm_group", "subgroup");
    const int rc = MPI_Group_incl(parent, static_cast<int>(members.size()), members.data(), &sub);
    MPI_Group_free(&parent);
    check(rc, "MPI_Group_incl", "subgroup");
    MPI_Comm c = MPI_COMM_NULL;
    const int rc2 = MPI_Comm_create_group(comm_, sub, /*tag=*/0x4854, &c);
    MPI_Group_free(&sub);
    check(rc2, "MPI_Comm_create_group", "subgroup");
    return adopt(c, opt_);
  }
  /// The tag of subgroup()'s arrival messages on the parent communicator (not for the user's messages).
  static constexpr int subgroup_tag = 0x4855;

  /// Backend of comm::all_reduce (collectives.hpp), which checks the arguments first and holds the contract.
  template <host_element T>
  void all_reduce(std::span<T> x, reduce_op r) {
    const int n = detail::count(static_cast<std::int64_t>(x.size()), "all_reduce");
    verify("all_reduce", dtype_of_v<T>, n, 0, r);
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "all_reduce");
    issue(
        "all_reduce", "MPI_Iallreduce",
        [&](MPI_Request* q) { return MPI_Iallreduce(MPI_IN_PLACE, x.data(), n, t, detail::op(r), comm_, q); },
        [&] { return MPI_Allreduce(MPI_IN_PLACE, x.data(), n, t, detail::op(r), comm_); });
    comm::detail::finish_reduce(x.data(), x.size(), r, size());
  }

  /// Backend of comm::broadcast (collectives.hpp), which checks the arguments first and holds the contract.
  template <host_element T>
  void broadcast(std::span<T> x, int root) {
    const int n = detail::count(static_cast<std::int64_t>(x.size()), "broadcast");
    verify("broadcast", dtype_of_v<T>, n, root, reduce_op::sum);
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "broadcast");
    issue(
        "broadcast", "MPI_Ibcast", [&](MPI_Request* q) { return MPI_Ibcast(x.data(), n, t, root, comm_, q); },
        [&] { return MPI_Bcast(x.data(), n, t, root, comm_); });
  }

  /// Backend of comm::all_gather (collectives.hpp), which checks the arguments first and holds the contract.
  template <host_element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    const int n = detail::count(static_cast<std::int64_t>(send.size()), "all_gather");
    verify("all_gather", dtype_of_v<T>, n, 0, reduce_op::sum);
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "all_gather");
    const void* s = send.data() == recv.data() + static_cast<std::size_t>(rank_) * send.size() && n > 0
                        ? MPI_IN_PLACE
                        : send.data();
    issue(
        "all_gather", "MPI_Iallgather",
        [&](MPI_Request* q) { return MPI_Iallgather(s, n, t, recv.data(), n, t, comm_, q); },
        [&] { return MPI_Allgather(s, n, t, recv.data(), n, t, comm_); });
  }

  /// Backend of comm::all_gather_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <host_element T>
  void all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const std::int64_t> recv_counts,
                    std::span<const std::int64_t> recv_displs) {
    verify("all_gather_v", dtype_of_v<T>, static_cast<std::int64_t>(send.size()), 0, reduce_op::sum,
           recv_counts);
    const auto rc = detail::counts(recv_counts, "all_gather_v"),
               rd = detail::counts(recv_displs, "all_gather_v");
    const int n = detail::count(static_cast<std::int64_t>(send.size()), "all_gather_v");
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "all_gather_v");
    const void* s = send.data() == recv.data() + recv_displs[static_cast<std::size_t>(rank_)] && n > 0
                        ? MPI_IN_PLACE
                        : send.data();
    issue(
        "all_gather_v", "MPI_Iallgatherv",
        [&](MPI_Request* q) {
          return MPI_Iallgatherv(s, n, t, recv.data(), rc.data(), rd.data(), t, comm_, q);
        },
        [&] { return MPI_Allgatherv(s, n, t, recv.data(), rc.data(), rd.data(), t, comm_); });
  }

  /// Backend of comm::reduce_scatter (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <host_element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, reduce_op r) {
    const int n = detail::count(static_cast<std::int64_t>(recv.size()), "reduce_scatter");
    verify("reduce_scatter", dtype_of_v<T>, n, 0, r);
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "reduce_scatter");
    // In place (recv is this rank's block of send) is not MPI_IN_PLACE's layout for this call, so
    // reduce from a copy of the send buffer then.
    std::vector<T> copy;
    const T* s = send.data();
    if (!recv.empty() && recv.data() == send.data() + static_cast<std::size_t>(rank_) * recv.size()) {
      copy.assign(send.begin(), send.end());
      s = copy.data();
    }
    issue(
        "reduce_scatter", "MPI_Ireduce_scatter_block",
        [&](MPI_Request* q) {
          return MPI_Ireduce_scatter_block(s, recv.data(), n, t, detail::op(r), comm_, q);
        },
        [&] { return MPI_Reduce_scatter_block(s, recv.data(), n, t, detail::op(r), comm_); });
    comm::detail::finish_reduce(recv.data(), recv.size(), r, size());
  }

  /// Backend of comm::all_to_all (collectives.hpp), which checks the arguments first and holds the contract.
  template <host_element T>
  void all_to_all(std::span<const T> send, std::span<T> recv) {
    const int n = detail::count(static_cast<std::int64_t>(send.size()) / size(), "all_to_all");
    verify("all_to_all", dtype_of_v<T>, n, 0, reduce_op::sum);
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "all_to_all");
    issue(
        "all_to_all", "MPI_Ialltoall",
        [&](MPI_Request* q) { return MPI_Ialltoall(send.data(), n, t, recv.data(), n, t, comm_, q); },
        [&] { return MPI_Alltoall(send.data(), n, t, recv.data(), n, t, comm_); });
  }

  /// Backend of comm::all_to_all_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <host_element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_displs, std::span<T> recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs) {
    verify("all_to_all_v", dtype_of_v<T>, 0, 0, reduce_op::sum, send_counts, recv_counts);
    const auto sc = detail::counts(send_counts, "all_to_all_v"),
               sd = detail::counts(send_displs, "all_to_all_v");
    const auto rc = detail::counts(recv_counts, "all_to_all_v"),
               rd = detail::counts(recv_displs, "all_to_all_v");
    const MPI_Datatype t = detail::datatype(dtype_of_v<T>, "all_to_all_v");
    issue(
        "all_to_all_v", "MPI_Ialltoallv",
        [&](MPI_Request* q) {
          return MPI_Ialltoallv(send.data(), sc.data(), sd.data(), t, recv.data(), rc.data(), rd.data(), t,
                                comm_, q);
        },
        [&] {
          return MPI_Alltoallv(send.data(), sc.data(), sd.data(), t, recv.data(), rc.data(), rd.data(), t,
                               comm_);
        });
  }

  /// Backend of comm::barrier (collectives.hpp): returns once every rank of the group has entered it.
  void barrier() {
    verify("barrier", dtype::uint8, 0, 0, reduce_op::sum);
    issue(
        "barrier", "MPI_Ibarrier", [&](MPI_Request* q) { return MPI_Ibarrier(comm_, q); },
        [&] { return MPI_Barrier(comm_); });
  }

  /// All sends and receives posted nonblocking, then completed together. A receive that gets a
  /// different element count than its buffer holds raises mismatch_error (dtype is not checked: MPI
  /// moves bytes of the receiver's type).
  void group_p2p(std::span<const p2p_op> ops) {
    usable("group_p2p");
    std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
    std::vector<MPI_Status> statuses(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const p2p_op& o = ops[i];
      const int n = detail::count(o.count, "group_p2p");
      const MPI_Datatype t = detail::datatype(o.type, "group_p2p");
      const int rc = o.what == p2p_op::kind::send ? MPI_Isend(o.data, n, t, o.peer, o.tag, comm_, &reqs[i])
                                                  : MPI_Irecv(o.data, n, t, o.peer, o.tag, comm_, &reqs[i]);
      if (rc != MPI_SUCCESS) {
        abandon(std::span<MPI_Request>(reqs.data(), i));
        check(rc, o.what == p2p_op::kind::send ? "MPI_Isend" : "MPI_Irecv", "group_p2p");
      }
    }
    const int rc = wait(std::span<MPI_Request>(reqs), std::span<MPI_Status>(statuses), "group_p2p",
                        "every peer of the batch to post its matching operation");
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const p2p_op& o = ops[i];
      if (o.what != p2p_op::kind::recv) continue;
      if (rc == MPI_ERR_IN_STATUS && statuses[i].MPI_ERROR == MPI_ERR_TRUNCATE)
        throw_error<mismatch_error>(
            "mpi group_p2p on {}: the message from rank {} with tag {} is larger than the "
            "receive buffer of {} x {}; expected exactly that count",
            comm::describe(*this), o.peer, o.tag, o.count, o.type);
      if (rc == MPI_ERR_IN_STATUS && statuses[i].MPI_ERROR != MPI_SUCCESS)
        check(statuses[i].MPI_ERROR, "MPI_Irecv", "group_p2p");
      int got = 0;
      MPI_Get_count(&statuses[i], detail::datatype(o.type, "group_p2p"), &got);
      if (got != o.count)
        throw_error<mismatch_error>(
            "mpi group_p2p on {}: the message from rank {} with tag {} holds {} elements; "
            "expected {} x {} (a receive takes exactly its buffer's count)",
            comm::describe(*this), o.peer, o.tag, got, o.count, o.type);
    }
    if (rc == MPI_ERR_IN_STATUS)
      for (const MPI_Status& s : statuses) check(s.MPI_ERROR, "MPI_Isend", "group_p2p");
  }

 private:
  communicator(MPI_Comm comm, bool owned, options opt) : comm_(comm), owned_(owned), opt_(opt) {
    if (comm == MPI_COMM_NULL)
      throw_error<invalid_argument>(
          "mpi::communicator over MPI_COMM_NULL; expected a communicator this rank belongs to");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "communicator");
    int n = 0;
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "communicator");
    check(MPI_Comm_size(comm_, &n), "MPI_Comm_size", "communicator");
    std::vector<int> local(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) local[static_cast<std::size_t>(i)] = i;
    ranks_.resize(static_cast<std::size_t>(n));
    MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    const int rc = MPI_Group_translate_ranks(g, n, local.data(), w, ranks_.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    check(rc, "MPI_Group_translate_ranks", "communicator");
  }

  void release() noexcept {
    if (comm_ == MPI_COMM_NULL || !environment::active()) return;
    if (!abandoned_.empty()) {
      int done = 0;
      MPI_Testall(static_cast<int>(abandoned_.size()), abandoned_.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) return;  // leaked on purpose: freeing a communicator with a pending collective is erroneous
    }
    if (owned_) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  [[nodiscard]] std::string where(const char* op) const {
    return hetmesh::format("mpi {} on {}", op, comm::describe(*this));
  }
  void check(int rc, const char* call, const char* op) const {
    if (rc != MPI_SUCCESS) mpi::check(rc, call, where(op));
  }
  void usable(const char* op) const {
    if (broken_)
      throw backend_error(
          hetmesh::format(
              "{}: the communicator timed out earlier and is unusable; expected a new communicator",
              where(op)),
          MPI_ERR_OTHER);
  }
  void abandon(std::span<MPI_Request> reqs) const {
    for (MPI_Request r : reqs)
      if (r != MPI_REQUEST_NULL) abandoned_.push_back(r);
  }

  /// Completes `reqs` within the timeout (see detail::waiter); on timeout marks the communicator
  /// broken and keeps the requests.
  int wait(std::span<MPI_Request> reqs, std::span<MPI_Status> statuses, const char* op,
           const char* expected) const {
    try {
      return detail::waiter{opt_.timeout, opt_.blocking}.wait(
          reqs, statuses, [&] { return where(op); }, expected);
    } catch (const timeout_error&) {
      broken_ = true;
      abandon(reqs);
      throw;
    }
  }

  /// Polling mode: an MPI_Ibarrier completed within the timeout, so that a blocking creation call
  /// (split) starts only when every rank has arrived; timeout_error naming `op` otherwise.
  void arrive(const char* op) const {
    usable(op);
    if (opt_.blocking) return;
    MPI_Request q = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &q), "MPI_Ibarrier", op);
    wait(std::span<MPI_Request>(&q, 1), {}, op, "every rank of the group to call it");
  }

  /// One collective: nonblocking + bounded wait, or the blocking call.
  template <class Nonblocking, class Blocking>
  void issue(const char* op, const char* call, Nonblocking&& nb, Blocking&& b) {
    usable(op);
    if (opt_.blocking) {
      check(b(), call, op);
      return;
    }
    MPI_Request q = MPI_REQUEST_NULL;
    check(nb(&q), call, op);
    wait(std::span<MPI_Request>(&q, 1), {}, op, "every rank of the group to call it");
  }

  /// With options::verify: gathers every rank's signature (op, dtype, count, root, reduce_op and up
  /// to two per-rank count arrays) and raises mismatch_error on every rank when they disagree.
  void verify(const char* op, dtype t, std::int64_t count, int root, reduce_op r,
              std::span<const std::int64_t> a = {}, std::span<const std::int64_t> b = {}) {
    if (!opt_.verify) return;
    usable(op);
    const auto n = static_cast<std::size_t>(size()), w = detail::signature_width(n);
    const auto mine = detail::make_signature(detail::op_code(op), t, count, root, r, a, b, n);
    std::vector<std::int64_t> all(w * n);
    MPI_Request q = MPI_REQUEST_NULL;
    check(MPI_Iallgather(mine.data(), static_cast<int>(w), MPI_INT64_T, all.data(), static_cast<int>(w),
                         MPI_INT64_T, comm_, &q),
          "MPI_Iallgather", op);
    wait(std::span<MPI_Request>(&q, 1), {}, op, "every rank of the group to call it (signature check)");
    detail::check_signatures(all, n, op, [&] { return where(op); });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  options opt_;
  // Mutable: a timeout in a const call (dup, split, subgroup) still breaks the handle and keeps the
  // requests MPI cannot cancel.
  mutable bool broken_ = false;
  mutable std::vector<MPI_Request> abandoned_;
};

static_assert(comm::host_communicator<communicator> && !comm::device_communicator<communicator>);

}  // namespace hetmesh::comm::mpi

#endif  // HETMESH_HAS_MPI
