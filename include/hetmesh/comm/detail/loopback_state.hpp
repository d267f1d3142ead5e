// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: the shared state behind loopback communicators (ranks as threads).
//
// A collective is a rendezvous in two phases:
//   A (arrive): each rank posts its arguments (pointers, counts, dtype) and waits until all have
//     posted. The last to arrive checks that the posts agree and records a verdict; every rank
//     reads the same verdict, so either all raise mismatch_error or all proceed.
//   compute: each rank reads the others' posted buffers directly (no staging copy) and writes its
//     own output or (all_reduce) its slice of every rank's output, which no other rank reads or
//     writes; nothing in this phase waits or throws.
//   B (release): each rank waits until all have finished reading and writing, so no rank returns
//     (and frees its buffers) while another still reads or writes them. B ignores aborts for that reason; it
//     always completes, because every rank past A is in the compute phase, which never blocks.
// Point-to-point messages are eager: a send copies into the receiver's mailbox and returns.
//
// Every wait has a deadline. A rank that times out withdraws its post, aborts the group (so the
// others raise promptly instead of waiting out their own timeouts) and raises timeout_error.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../../core/error.hpp"
#include "../communicator.hpp"
#include "../dtype.hpp"
#include "../reduce_op.hpp"

namespace hetmesh::comm::loopback::detail {

using clock = std::chrono::steady_clock;

/// One rank's arguments to the current collective.
struct post {
  std::string_view op;  // a string literal naming the collective
  dtype type = dtype::uint8;
  std::int64_t count = 0;  // elements this rank contributes (op-specific meaning)
  int root = 0;
  reduce_op rop = reduce_op::sum;
  const void* send = nullptr;
  void* recv = nullptr;
  std::span<const std::int64_t> send_counts, send_displs, recv_counts, recv_displs;
};

/// Where an operation runs, for error messages (formatted only when an error is raised).
struct site {
  std::string_view op;
  int rank;
};

struct message {
  std::vector<std::byte> bytes;
  dtype type;
  std::int64_t count;
};

/// Why a group was aborted; decides which error its waiting ranks raise.
enum class abort_kind : std::uint8_t { none, timeout, rank_failed };

class group_state {
 public:
  explicit group_state(std::vector<int> members)
      : members_(std::move(members)), n_(static_cast<int>(members_.size())) {
    posts_.resize(static_cast<std::size_t>(n_));
    entered_.assign(static_cast<std::size_t>(n_), 0);
  }

  [[nodiscard]] const std::vector<int>& members() const noexcept { return members_; }
  [[nodiscard]] int size() const noexcept { return n_; }

  /// Marks the group failed; every current and future wait raises. Idempotent: the first reason wins.
  void abort(abort_kind kind, std::string reason) {
    {
      std::lock_guard lock(m_);
      if (abort_ != abort_kind::none) return;
      abort_ = kind;
      abort_reason_ = std::move(reason);
    }
    cv_.notify_all();
  }

  /// Phase A. Posts `p` for `rank`, waits for every rank, returns every rank's post. `verify` runs once,
  /// under the lock, on the completed posts; a non-empty result is raised as mismatch_error on every
  /// rank.
  template <class Verify>
  std::span<const post> arrive(int rank, const post& p, clock::duration timeout, const site& where,
                               Verify&& verify) {
    const auto deadline = clock::now() + timeout;
    std::unique_lock lock(m_);
    raise_if_aborted(where);
    const std::uint64_t gen = generation_;
    posts_[static_cast<std::size_t>(rank)] = p;
    ++entered_[static_cast<std::size_t>(rank)];
    if (++arrived_ == n_) {
      arrived_ = 0;
      done_ = 0;
      verdict_.clear();
      try {
        verdict_ = verify(std::span<const post>(posts_));
      } catch (const std::exception& e) {
        verdict_ = hetmesh::format("could not prepare the collective: {}", e.what());
      }
      ++generation_;
      lock.unlock();
      cv_.notify_all();
      lock.lock();
    } else {
      const bool completed =
          cv_.wait_until(lock, deadline, [&] { return generation_ != gen || abort_ != abort_kind::none; });
      if (generation_ == gen) {  // not completed: withdraw, so the barrier cannot complete without us
        const std::string missing = missing_ranks(entered_[static_cast<std::size_t>(rank)]);
        --arrived_;
        --entered_[static_cast<std::size_t>(rank)];
        if (completed) raise_aborted(where);
        auto reason = hetmesh::format(
            "{}: timed out after {} ms waiting for ranks [{}] to arrive; expected all {} "
            "ranks of the group to call it",
            describe(where), std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), missing,
            n_);
        abort_ = abort_kind::timeout;
        abort_reason_ = reason;
        lock.unlock();
        cv_.notify_all();
        throw timeout_error(reason);
      }
    }
    if (!verdict_.empty()) throw mismatch_error(hetmesh::format("{}: {}", describe(where), verdict_));
    return std::span<const post>(posts_);
  }

  /// Phase B: returns once every rank has called release for this collective. Ignores aborts (see
  /// the file comment); the deadline only guards against a rank that died inside the compute phase.
  void release(clock::duration timeout, const site& where) {
    const auto deadline = clock::now() + timeout;
    std::unique_lock lock(m_);
    if (++done_ == n_) {
      lock.unlock();
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_until(lock, deadline, [&] { return done_ == n_; }))
      throw timeout_error(
          hetmesh::format("{}: timed out after the data exchange waiting for the other ranks to finish "
                          "reading; expected them to finish within the timeout",
                          describe(where)));
  }

  /// Eager send: copies `bytes` into the mailbox of (src -> dst, tag).
  void deliver(int src, int dst, int tag, message msg, const site& where) {
    {
      std::lock_guard lock(m_);
      raise_if_aborted(where);
      mail_[{src, dst, tag}].push_back(std::move(msg));
    }
    cv_.notify_all();
  }

  /// Waits for the oldest message of (src -> dst, tag) and removes it from the mailbox.
  message take(int src, int dst, int tag, clock::duration timeout, const site& where,
               std::int64_t expected_count, dtype expected_type) {
    const auto deadline = clock::now() + timeout;
    std::unique_lock lock(m_);
    auto& box = mail_[{src, dst, tag}];
    const bool ready =
        cv_.wait_until(lock, deadline, [&] { return !box.empty() || abort_ != abort_kind::none; });
    if (!box.empty()) {
      message msg = std::move(box.front());
      box.pop_front();
      return msg;
    }
    if (ready) raise_aborted(where);
    auto reason = hetmesh::format(
        "{}: timed out after {} ms waiting for a message from rank {} with tag {}; expected rank {} to send "
        "{} x {}",
        describe(where), std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), src, tag,
        src, expected_count, expected_type);
    abort_ = abort_kind::timeout;
    abort_reason_ = reason;
    lock.unlock();
    cv_.notify_all();
    throw timeout_error(reason);
  }

 private:
  void raise_if_aborted(const site& where) const {
    if (abort_ != abort_kind::none) raise_aborted(where);
  }
  [[noreturn]] void raise_aborted(const site& where) const {
    // A timeout elsewhere in the group is reported as a timeout here too: this rank could not
    // complete for the same reason (a rank missing), and callers catch timeout_error for that.
    if (abort_ == abort_kind::timeout)
      throw timeout_error(
          hetmesh::format("{}: the group was aborted after a timeout ({})", describe(where), abort_reason_));
    throw aborted_error(hetmesh::format("{}: the group was aborted ({})", describe(where), abort_reason_));
  }
  [[nodiscard]] std::string describe(const site& where) const {
    return hetmesh::format("loopback {} on group [{}] rank {}/{}", where.op, fmt::join(members_, ","),
                           where.rank, n_);
  }
  /// Group ranks that have entered fewer than `count` collectives.
  [[nodiscard]] std::string missing_ranks(std::uint64_t count) const {
    std::vector<int> missing;
    for (int r = 0; r < n_; ++r)
      if (entered_[static_cast<std::size_t>(r)] < count) missing.push_back(r);
    return hetmesh::format("{}", fmt::join(missing, ","));
  }

  const std::vector<int> members_;  // global ranks, in group order
  const int n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<post> posts_;
  std::vector<std::uint64_t> entered_;  // collectives each rank has entered
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  int done_ = 0;
  std::string verdict_;
  std::map<std::tuple<int, int, int>, std::deque<message>> mail_;
  abort_kind abort_ = abort_kind::none;
  std::string abort_reason_;
};

/// The process-wide state of one loopback::run: every group created under it (so a failing rank can
/// abort them all) and the registry through which the members of a new group find its state.
class world_state {
 public:
  explicit world_state(int n) : world_(std::make_shared<group_state>(iota(n))) { all_.push_back(world_); }

  [[nodiscard]] const std::shared_ptr<group_state>& world() const noexcept { return world_; }

  /// The state of the `global_rank`'s next group over `members`. Not blocking: the first member to ask
  /// creates it and the others find it. The k-th request of each member for the same member list gets
  /// the same state, so creating a group twice yields two distinct groups.
  std::shared_ptr<group_state> join(const std::vector<int>& members, int global_rank) {
    std::lock_guard lock(m_);
    const std::uint64_t k = requests_[{global_rank, members}]++;
    auto& entry = pending_[{members, k}];
    if (!entry.state) {
      entry.state = std::make_shared<group_state>(members);
      all_.push_back(entry.state);
      if (aborted_) entry.state->abort(abort_kind::rank_failed, reason_);
    }
    auto state = entry.state;
    if (++entry.joined == static_cast<int>(members.size())) pending_.erase({members, k});
    return state;
  }

  /// Aborts every group: called when a rank's body throws.
  void abort_all(const std::string& reason) {
    std::vector<std::weak_ptr<group_state>> groups;
    {
      std::lock_guard lock(m_);
      if (aborted_) return;
      aborted_ = true;
      reason_ = reason;
      groups = all_;
    }
    for (auto& g : groups)
      if (auto s = g.lock()) s->abort(abort_kind::rank_failed, reason);
  }

 private:
  static std::vector<int> iota(int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
  }
  struct pending_group {
    std::shared_ptr<group_state> state;
    int joined = 0;
  };
  std::shared_ptr<group_state> world_;
  std::mutex m_;
  std::vector<std::weak_ptr<group_state>> all_;
  std::map<std::pair<int, std::vector<int>>, std::uint64_t> requests_;
  std::map<std::pair<std::vector<int>, std::uint64_t>, pending_group> pending_;
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace hetmesh::comm::loopback::detail
