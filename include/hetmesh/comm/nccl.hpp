// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::nccl: the NCCL backend (device memory, stream-ordered). Needs the hetmesh::nccl
// CMake target (HETMESH_HAS_NCCL). Buffers are device spans (cuda::device_buffer::span()); for
// `__half` / `__nv_bfloat16` elements include hetmesh/cuda/half.hpp (comm/ does not include cuda/). Every
// operation is enqueued on the communicator's current stream and returns without waiting; `synchronize()`
// waits for it with a deadline.
//
// Ordering after the user's compute: by default a communicator enqueues on a stream of its own, which
// knows nothing of the user's kernels. Either hand it the stream the compute runs on
// (`c.set_stream(s)`, or `nccl::stream_scope scope(c, s);` for a few calls), so a collective starts
// after the kernels enqueued before it on `s`; or keep the own stream and make it wait on an event
// the user recorded after the compute (`c.wait(event)`, cudaStreamWaitEvent: no host block). Either
// way nothing blocks the host; read results after `c.synchronize()` or by ordering later work on the
// same stream. The watchdog's timeout runs from the moment a call is enqueued, so on a shared stream
// it includes the user's work queued before that call.
//
// No hangs: communicators are created in NCCL's non-blocking mode and every call that reports
// ncclInProgress is polled with a deadline. A watchdog thread polls ncclCommGetAsyncError and the
// completion of enqueued work; when work is older than the timeout, or NCCL reports an asynchronous
// error, it calls ncclCommAbort, and the next call on the communicator raises timeout_error or
// backend_error (with NCCL's last-error text). An aborted communicator is unusable.
// Groups: split (ncclCommSplit, collective over the parent). NCCL has no all-to-all-v and no
// all-gather-v: the generic versions (one ncclGroupStart/End batch of sends and receives) serve them.
#pragma once

#include "../config.hpp"

#if HETMESH_HAS_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "communicator.hpp"
#include "detail/deadline.hpp"
#include "detail/members.hpp"
#include "detail/nccl_support.hpp"

namespace hetmesh::comm::nccl {

/// Per-communicator settings: timeout and watchdog.
struct options {
  /// How long enqueued work may stay incomplete before the watchdog aborts the communicator; the next
  /// call on it then raises timeout_error.
  std::chrono::milliseconds timeout{HETMESH_DEFAULT_TIMEOUT_MS};
  std::chrono::milliseconds watchdog_interval{20};  ///< how often the watchdog polls; 0: no watchdog thread
  friend bool operator==(const options&, const options&) = default;
};

/// A fresh unique id (on the rank that creates the communicator; broadcast it to the others, e.g.
/// with comm::nccl::init_from_mpi in nccl_mpi.hpp).
[[nodiscard]] inline ncclUniqueId unique_id() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    detail::raise(r, "ncclGetUniqueId", "nccl", nullptr);
  return id;
}

/// A handle on an NCCL communicator with its own stream, modelling comm::device_communicator. Operations are
/// enqueued on stream(); a watchdog polls for asynchronous errors and aborts on timeout. Move-only.
class communicator : public comm::detail::group_members {
 public:
  /// Marks the type as a communicator (opt-in, as the concepts require).
  using is_communicator = void;
  /// Buffers are device memory.
  static constexpr memory_space memory = memory_space::device;
  /// Operations are enqueued on a CUDA stream (device_communicator requirement 3).
  using stream_type = cudaStream_t;

  /// Joins the communicator of `nranks` ranks identified by `id` as `rank`, on CUDA device `device`.
  /// Collective over the nranks processes (or threads); bounded by the timeout. `global_ranks` (one
  /// per rank, default 0..nranks-1) is what ranks() reports.
  [[nodiscard]] static communicator init(const ncclUniqueId& id, int nranks, int rank, int device,
                                         options opt = {}, std::vector<int> global_ranks = {}) {
    if (nranks < 1 || rank < 0 || rank >= nranks)
      throw_error<invalid_argument>("nccl::communicator::init: rank {} of {}; expected 0 <= rank < nranks",
                                    rank, nranks);
    if (global_ranks.empty())
      for (int r = 0; r < nranks; ++r) global_ranks.push_back(r);
    detail::check_cuda(cudaSetDevice(device), "cudaSetDevice", "nccl::communicator::init");
    auto s = std::make_shared<detail::state>();
    s->device = device, s->timeout = opt.timeout;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&s->comm, nranks, id, rank, &cfg);
    communicator c(std::move(s), rank, std::move(global_ranks), opt);
    c.settle(r, "ncclCommInitRankConfig", "init");
    return c;
  }
  /// A communicator of one rank on `device` (tests, single-GPU runs).
  [[nodiscard]] static communicator single(int device, options opt = {}) {
    return init(unique_id(), 1, 0, device, opt);
  }

  /// Moves the handle; `o` is left empty.
  communicator(communicator&&) noexcept = default;
  /// Releases this handle and takes `o`'s; `o` is left empty.
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      release();
      s_ = std::move(o.s_), rank_ = o.rank_, ranks_ = std::move(o.ranks_), opt_ = o.opt_,
      scratch_ = std::move(o.scratch_), user_stream_ = o.user_stream_, has_user_stream_ = o.has_user_stream_;
    }
    return *this;
  }
  ~communicator() { release(); }  // copies are deleted by group_members: the handle is owned once

  /// The native ncclComm_t, for NCCL calls hetmesh does not wrap.
  [[nodiscard]] ncclComm_t native() const noexcept { return s_->comm; }
  /// The stream this communicator's operations are enqueued on now: the one set_stream chose, else
  /// its own (own_stream()). Order user kernels against it.
  [[nodiscard]] cudaStream_t stream() const noexcept {
    return has_user_stream_ ? user_stream_ : s_->owned_stream.get();
  }
  /// The non-blocking stream created with the communicator, whatever set_stream chose.
  [[nodiscard]] cudaStream_t own_stream() const noexcept { return s_->owned_stream.get(); }
  /// Enqueues every later operation of this handle on the caller's stream `s` (a stream of device(),
  /// or 0 for the legacy default stream), so each runs after the work enqueued on `s` before it: a
  /// gradient all_reduce issued after the backward kernels on `s` reads finished gradients. Local, not
  /// collective; the caller keeps `s` alive while work of this communicator is pending on it (until
  /// synchronize() or reset_stream() after it). Cost: O(1), no CUDA call.
  void set_stream(cudaStream_t s) {
    usable("set_stream");
    user_stream_ = s, has_user_stream_ = true;
  }
  /// Whether operations go to own_stream() (no set_stream in effect).
  [[nodiscard]] bool uses_own_stream() const noexcept { return !has_user_stream_; }
  /// Back to own_stream() for later operations. Local; O(1).
  void reset_stream() noexcept { has_user_stream_ = false, user_stream_ = nullptr; }
  /// Makes the current stream wait, on the device, for the user's event `e` (cudaStreamWaitEvent):
  /// operations enqueued after this call start once the work `e` recorded has completed. The host is
  /// not blocked. Pre: `e` was recorded (cudaEventRecord) on a stream of device(). Local; O(1).
  void wait(cudaEvent_t e) {
    usable("wait");
    on_device("wait");
    detail::check_cuda(cudaStreamWaitEvent(stream(), e, 0), "cudaStreamWaitEvent", where("wait"));
  }
  /// The CUDA device the communicator was created on.
  [[nodiscard]] int device() const noexcept { return s_->device; }

  /// ncclCommSplit: ranks of equal color, ordered by (key, rank). Collective over the whole parent.
  /// The child's ranks() are gathered over the child (one small all-gather, synchronised). The child
  /// enqueues on the parent's stream when the parent has one set (set_stream), else on its own: a
  /// runtime that splits the user's communicator (train::system's pipeline and pool communicators, HDP's
  /// rings) keeps every operation on the stream the user's kernels run on.
  [[nodiscard]] communicator split(int color, int key) {
    usable("split");
    auto s = std::make_shared<detail::state>();
    s->device = s_->device, s->timeout = opt_.timeout;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommSplit(s_->comm, color, key, &s->comm, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) detail::raise(r, "ncclCommSplit", where("split"), s_->comm);
    // Non-blocking mode: NCCL writes the child's handle only once the split has completed (it stays null
    // until then), and the child is usable once its own state leaves ncclInProgress. Poll the parent (an
    // error of the split lands there), then the handle, then the child, all within the timeout.
    ncclResult_t state = ncclInProgress;
    ncclComm_t child = nullptr;
    const bool completed = comm::detail::poll_until(opt_.timeout, {.yield_from = 0}, [&] {
      ncclResult_t parent = ncclSuccess;
      ncclCommGetAsyncError(s_->comm, &parent);
      if (parent != ncclSuccess && parent != ncclInProgress) {
        state = parent;
        return true;
      }
      child = std::atomic_ref<ncclComm_t>(s->comm).load(std::memory_order_acquire);
      if (child == nullptr) return false;
      if (ncclCommGetAsyncError(child, &state) != ncclSuccess) return true;
      return state != ncclInProgress;
    });
    if (!completed) {
      // NCCL's split job may still write the handle into s->comm: keep that small state alive (leaked
      // on purpose) rather than let a late write land in freed memory.
      static_cast<void>(new std::shared_ptr<detail::state>(std::move(s)));
      s_->abort(detail::abort_kind::timeout,
                hetmesh::format("ncclCommSplit did not complete within {} ms (a rank is missing)",
                                opt_.timeout.count()));
      usable("split");
    }
    if (state != ncclSuccess) detail::raise(state, "ncclCommSplit", where("split"), child ? child : s_->comm);
    communicator c(std::move(s), 0, {}, opt_);
    c.settle(ncclSuccess, "ncclCommSplit", "split");  // starts the child's watchdog
    int child_rank = 0, child_size = 0;
    if (const ncclResult_t e = ncclCommUserRank(child, &child_rank); e != ncclSuccess)
      detail::raise(e, "ncclCommUserRank", where("split"), child);
    if (const ncclResult_t e = ncclCommCount(child, &child_size); e != ncclSuccess)
      detail::raise(e, "ncclCommCount", where("split"), child);
    c.rank_ = child_rank;
    c.ranks_.assign(static_cast<std::size_t>(child_size), 0);
    detail::device_array<int> mine(1), all(static_cast<std::size_t>(child_size));
    const int me = ranks_[static_cast<std::size_t>(rank_)];
    mine.copy_from(std::span<const int>(&me, 1));
    c.all_gather(std::span<const int>(mine.span()), all.span());
    c.synchronize();
    all.copy_to(std::span<int>(c.ranks_));
    if (has_user_stream_) c.set_stream(user_stream_);  // the child enqueues where its parent does
    return c;
  }

  /// Backend of comm::all_reduce (collectives.hpp), which checks the arguments first and holds the contract.
  /// Enqueued on stream().
  template <element T>
  void all_reduce(std::span<T> x, reduce_op r) {
    enqueue("all_reduce", "ncclAllReduce", [&] {
      return ncclAllReduce(x.data(), x.data(), x.size(), detail::datatype(dtype_of_v<T>), detail::op(r),
                           s_->comm, stream());
    });
  }
  /// Backend of comm::broadcast (collectives.hpp), which checks the arguments first and holds the contract.
  /// Enqueued on stream().
  template <element T>
  void broadcast(std::span<T> x, int root) {
    enqueue("broadcast", "ncclBroadcast", [&] {
      return ncclBroadcast(x.data(), x.data(), x.size(), detail::datatype(dtype_of_v<T>), root, s_->comm,
                           stream());
    });
  }
  /// Backend of comm::all_gather (collectives.hpp), which checks the arguments first and holds the contract.
  /// Enqueued on stream().
  template <element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    enqueue("all_gather", "ncclAllGather", [&] {
      return ncclAllGather(send.data(), recv.data(), send.size(), detail::datatype(dtype_of_v<T>), s_->comm,
                           stream());
    });
  }
  /// Backend of comm::reduce_scatter (collectives.hpp), which checks the arguments first and holds the
  /// contract. Enqueued on stream().
  template <element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, reduce_op r) {
    enqueue("reduce_scatter", "ncclReduceScatter", [&] {
      return ncclReduceScatter(send.data(), recv.data(), recv.size(), detail::datatype(dtype_of_v<T>),
                               detail::op(r), s_->comm, stream());
    });
  }
#if NCCL_VERSION_CODE >= 22800
  template <element T>
  void all_to_all(std::span<const T> send, std::span<T> recv) {
    enqueue("all_to_all", "ncclAlltoAll", [&] {
      return ncclAlltoAll(send.data(), recv.data(), send.size() / static_cast<std::size_t>(size()),
                          detail::datatype(dtype_of_v<T>), s_->comm, stream());
    });
  }
#endif

  /// One ncclGroupStart/End batch of ncclSend/ncclRecv on the stream. NCCL does not check counts
  /// across ranks: a mismatched receive is undefined (use loopback or MPI to find such bugs).
  void group_p2p(std::span<const p2p_op> ops) {
    enqueue("group_p2p", "ncclGroupEnd", [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const p2p_op& o : ops) {
        const auto n = static_cast<std::size_t>(o.count);
        r = o.what == p2p_op::kind::send
                ? ncclSend(o.data, n, detail::datatype(o.type), o.peer, s_->comm, stream())
                : ncclRecv(o.data, n, detail::datatype(o.type), o.peer, s_->comm, stream());
        if (r != ncclSuccess && r != ncclInProgress) {
          ncclGroupEnd();
          return r;
        }
      }
      return ncclGroupEnd();
    });
  }

  /// All ranks have arrived: a one-element all-reduce, then synchronize() (so it blocks the host,
  /// bounded by the timeout).
  void barrier() {
    if (scratch_.size() == 0) scratch_ = detail::device_array<int>(1);
    all_reduce(scratch_.span(), reduce_op::sum);
    synchronize();
  }

  /// Waits until all work enqueued so far has completed, polling the stream and NCCL's asynchronous
  /// error; past the timeout it aborts the communicator and raises timeout_error.
  void synchronize() {
    usable("synchronize");
    const bool completed = comm::detail::poll_until(opt_.timeout, {.yield_from = 65}, [&] {
      const cudaError_t st = cudaStreamQuery(stream());
      if (st == cudaSuccess) return true;
      if (st != cudaErrorNotReady) detail::check_cuda(st, "cudaStreamQuery", where("synchronize"));
      poll_async("synchronize");
      return false;
    });
    if (!completed)
      s_->abort(detail::abort_kind::timeout,
                hetmesh::format("synchronize did not complete within {} ms", opt_.timeout.count()));
    usable("synchronize");
  }

  /// Aborts the communicator now (e.g. from a user's own watchdog); later calls raise aborted_error.
  void abort(const std::string& why) { s_->abort(detail::abort_kind::user, why); }

 private:
  communicator(std::shared_ptr<detail::state> s, int rank, std::vector<int> ranks, options opt)
      : group_members(rank, std::move(ranks)), s_(std::move(s)), opt_(opt) {}

  void release() noexcept {
    if (!s_) return;
    s_->stop_watchdog();
    if (s_->comm && s_->aborted.load() == detail::abort_kind::none) {
      // Finalize flushes outstanding work; bounded, then abort if a peer never completes it.
      ncclResult_t r = ncclCommFinalize(s_->comm);
      bool first = true;
      (void)comm::detail::poll_until(opt_.timeout, {}, [&] {
        if (!std::exchange(first, false)) ncclCommGetAsyncError(s_->comm, &r);
        return r != ncclInProgress;
      });
      if (r == ncclSuccess)
        ncclCommDestroy(s_->comm);
      else
        ncclCommAbort(s_->comm);
    }
    s_.reset();
  }

  [[nodiscard]] std::string where(const char* op) const {
    return hetmesh::format("nccl {} on {}", op, comm::describe(*this));
  }

  /// Raises if the communicator was aborted (by the watchdog, a timeout, or the user).
  void usable(const char* op) const {
    switch (s_->aborted.load()) {
      case detail::abort_kind::none:
        return;
      case detail::abort_kind::timeout:
        throw timeout_error(hetmesh::format("{}: {}", where(op), s_->reason));
      case detail::abort_kind::async_error:
        throw backend_error(hetmesh::format("{}: the communicator was aborted: {}", where(op), s_->reason),
                            ncclRemoteError);
      case detail::abort_kind::user:
        throw aborted_error(hetmesh::format("{}: the communicator was aborted: {}", where(op), s_->reason));
    }
  }
  void poll_async(const char* op) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(s_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      s_->abort(detail::abort_kind::async_error,
                hetmesh::format("asynchronous NCCL error: {}", ncclGetErrorString(async)));
      usable(op);
    }
  }

  /// Waits, bounded by the timeout, for a call that returned ncclInProgress (non-blocking mode); then
  /// starts the watchdog if the communicator has none yet.
  void settle(ncclResult_t r, const char* call, const char* op) {
    // The first poll is the call's own result; each later one asks NCCL again (a failing query ends it).
    bool first = true;
    const bool completed = comm::detail::poll_until(opt_.timeout, {.yield_from = 0}, [&] {
      if (!std::exchange(first, false) && ncclCommGetAsyncError(s_->comm, &r) != ncclSuccess) return true;
      return r != ncclInProgress;
    });
    if (!completed) {
      s_->abort(detail::abort_kind::timeout,
                hetmesh::format("{} did not complete within {} ms (a rank is missing)", call,
                                opt_.timeout.count()));
      usable(op);
    }
    if (r != ncclSuccess) detail::raise(r, call, where(op), s_->comm);
    if (!s_->watchdog.joinable() && opt_.watchdog_interval.count() > 0)
      s_->start_watchdog(opt_.watchdog_interval);
  }

  /// Makes the communicator's device current, without a cudaSetDevice when it already is (the common
  /// case: the call costs more than the query, on every enqueue).
  void on_device(const char* op) const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != s_->device)
      detail::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice", where(op));
  }

  /// Issues one NCCL call on the stream and registers its completion event with the watchdog.
  template <class Call>
  void enqueue(const char* op, const char* call, Call&& f) {
    usable(op);
    on_device(op);
    settle(f(), call, op);
    std::lock_guard lock(s_->m);
    detail::event_handle e{nullptr};
    if (s_->spare.empty()) {
      e = detail::event_handle{};
    } else {
      e = std::move(s_->spare.back());
      s_->spare.pop_back();
    }
    e.record(stream());
    s_->work.push_back({std::move(e), detail::clock::now(), op});
  }

  std::shared_ptr<detail::state> s_;
  options opt_;
  detail::device_array<int> scratch_;
  cudaStream_t user_stream_ = nullptr;  // set_stream's stream, when has_user_stream_
  bool has_user_stream_ = false;
};

static_assert(comm::device_communicator<communicator> && !comm::host_communicator<communicator>);

/// Enqueues a communicator's operations on the caller's stream for one scope, then restores the stream
/// it had: `{ nccl::stream_scope on(c, compute); comm::all_reduce(c, grads, reduce_op::sum); }` orders
/// the all-reduce after the kernels already on `compute`. Not copyable or movable; the communicator
/// must outlive it.
class stream_scope {
 public:
  /// c.set_stream(s) until the end of the scope.
  stream_scope(communicator& c, cudaStream_t s) : c_(c), had_(!c.uses_own_stream()), prev_(c.stream()) {
    c_.set_stream(s);
  }
  stream_scope(const stream_scope&) = delete;
  stream_scope& operator=(const stream_scope&) = delete;
  /// Restores the stream the communicator had before the scope.
  ~stream_scope() {
    if (had_)
      c_.set_stream(prev_);
    else
      c_.reset_stream();
  }

 private:
  communicator& c_;
  bool had_;
  cudaStream_t prev_;
};

}  // namespace hetmesh::comm::nccl

#endif  // HETMESH_HAS_NCCL
