// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals for the NCCL backend: status codes to exceptions, type and op mapping, the
// deadline-bounded wait for NCCL's non-blocking mode, and the watchdog that aborts a communicator
// whose work does not complete within its timeout. The CUDA runtime is used directly (owning stream,
// event and device-array handles below), not through hetmesh/cuda/: comm/ and cuda/ do not include each
// other.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../../core/error.hpp"
#include "../dtype.hpp"
#include "../reduce_op.hpp"

namespace hetmesh::comm::nccl::detail {

using clock = std::chrono::steady_clock;

/// Throws backend_error(code) naming `call` and `where` when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, std::string_view call, std::string_view where) {
  if (status != cudaSuccess)
    throw backend_error(hetmesh::format("{}: {} failed: {} ({})", where, call, cudaGetErrorString(status),
                                        cudaGetErrorName(status)),
                        static_cast<int>(status));
}

/// An owning non-blocking CUDA stream on the current device (move-only).
class stream_handle {
 public:
  stream_handle() {
    check_cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
               "nccl stream");
  }
  stream_handle(stream_handle&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream_handle& operator=(stream_handle&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream_handle(const stream_handle&) = delete;
  stream_handle& operator=(const stream_handle&) = delete;
  ~stream_handle() { reset(); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

 private:
  void reset() noexcept {
    if (s_) cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// An owning CUDA event without timing, for completion queries (move-only; `event_handle{nullptr}`
/// holds none yet).
class event_handle {
 public:
  event_handle() {
    check_cuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreateWithFlags",
               "nccl event");
  }
  explicit event_handle(std::nullptr_t) noexcept {}
  event_handle(event_handle&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event_handle& operator=(event_handle&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  event_handle(const event_handle&) = delete;
  event_handle& operator=(const event_handle&) = delete;
  ~event_handle() { reset(); }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { check_cuda(cudaEventRecord(e_, s), "cudaEventRecord", "nccl event"); }

 private:
  void reset() noexcept {
    if (e_) cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

/// n elements of T in device memory (cudaMalloc), for the backend's own small buffers (the barrier's
/// scratch word, split's rank exchange). Move-only; copies are synchronous.
template <class T>
class device_array {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  device_array() = default;
  explicit device_array(std::size_t n) : n_(n) {
    if (n != 0) check_cuda(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc", "nccl");
  }
  device_array(device_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { reset(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::span<T> span() const noexcept { return {p_, n_}; }
  /// Host to device; `host.size()` must be size().
  void copy_from(std::span<const T> host) {
    if (n_ != 0)
      check_cuda(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", "nccl");
  }
  /// Device to host; `host.size()` must be size().
  void copy_to(std::span<T> host) const {
    if (n_ != 0)
      check_cuda(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy", "nccl");
  }

 private:
  void reset() noexcept {
    if (p_) cudaFree(p_);
    p_ = nullptr, n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// backend_error with NCCL's error string and, when a communicator is known, its last-error text.
[[noreturn]] inline void raise(ncclResult_t r, std::string_view call, std::string_view where,
                               ncclComm_t comm) {
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw backend_error(hetmesh::format("{}: {} failed: {}{}{}", where, call, ncclGetErrorString(r),
                                      last && *last ? ": " : "", last ? last : ""),
                      static_cast<int>(r));
}

[[nodiscard]] inline ncclDataType_t datatype(dtype t) noexcept {
  switch (t) {
    case dtype::int8:
      return ncclInt8;
    case dtype::uint8:
      return ncclUint8;
    case dtype::int16:   // NCCL has no 16-bit integers; no dtype_of yields them, so collectives never
    case dtype::uint16:  // pass them here
      break;
    case dtype::int32:
      return ncclInt32;
    case dtype::uint32:
      return ncclUint32;
    case dtype::int64:
      return ncclInt64;
    case dtype::uint64:
      return ncclUint64;
    case dtype::float16:
      return ncclFloat16;
    case dtype::bfloat16:
      return ncclBfloat16;
    case dtype::float32:
      return ncclFloat32;
    case dtype::float64:
      return ncclFloat64;
  }
  return ncclUint8;
}

[[nodiscard]] inline ncclRedOp_t op(reduce_op r) noexcept {
  switch (r) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::prod:
      return ncclProd;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::avg:
      return ncclAvg;
  }
  return ncclSum;
}

/// Why a communicator was aborted.
enum class abort_kind : std::uint8_t { none, timeout, async_error, user };

/// The state a communicator shares with its watchdog thread.
struct state {
  ncclComm_t comm = nullptr;
  int device = 0;
  stream_handle owned_stream;  // the communicator's stream
  std::chrono::milliseconds timeout{};

  std::mutex m;
  std::condition_variable cv;
  struct pending {
    event_handle done;
    clock::time_point enqueued;
    const char* op;
  };
  std::deque<pending> work;         // enqueued operations not yet seen complete, oldest first
  std::vector<event_handle> spare;  // completed events, reused: creating one per call would cost microseconds
  std::atomic<abort_kind> aborted{abort_kind::none};
  std::string reason;
  bool stop = false;
  std::thread watchdog;

  /// Aborts the communicator once (ncclCommAbort is safe to call while another thread is inside an
  /// NCCL call on it: that is what it is for). Idempotent.
  void abort(abort_kind kind, std::string why) {
    abort_kind expected = abort_kind::none;
    {
      std::lock_guard lock(m);
      if (!aborted.compare_exchange_strong(expected, kind)) return;
      reason = std::move(why);
    }
    ncclCommAbort(comm);
    cv.notify_all();
  }

  /// One watchdog pass: retire completed work, abort on an asynchronous error or on work older than
  /// the timeout.
  void poll() {
    if (aborted.load() != abort_kind::none) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      const char* last = ncclGetLastError(comm);
      abort(abort_kind::async_error,
            hetmesh::format("asynchronous NCCL error: {}: {}", ncclGetErrorString(async), last ? last : ""));
      return;
    }
    std::unique_lock lock(m);
    while (!work.empty()) {
      const cudaError_t st = cudaEventQuery(work.front().done.get());
      if (st == cudaSuccess) {
        spare.push_back(std::move(work.front().done));
        work.pop_front();
        continue;
      }
      if (st != cudaErrorNotReady) {
        lock.unlock();
        abort(abort_kind::async_error,
              hetmesh::format("CUDA error while waiting: {}", cudaGetErrorString(st)));
        return;
      }
      if (clock::now() - work.front().enqueued > timeout) {
        const char* op = work.front().op;
        lock.unlock();
        abort(abort_kind::timeout,
              hetmesh::format("{} did not complete within {} ms (a rank is missing or stuck); the "
                              "watchdog aborted the communicator",
                              op, timeout.count()));
      }
      return;
    }
  }

  void start_watchdog(std::chrono::milliseconds interval) {
    watchdog = std::thread([this, interval] {
      cudaSetDevice(device);
      std::unique_lock lock(m);
      while (!stop) {
        cv.wait_for(lock, interval, [&] { return stop; });
        if (stop) break;
        lock.unlock();
        poll();
        lock.lock();
      }
    });
  }

  void stop_watchdog() noexcept {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }
};

}  // namespace hetmesh::comm::nccl::detail
