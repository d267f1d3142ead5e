// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: saving and loading a checkpoint collectively over a host communicator (the format and
// the guarantees: docs/checkpoint.md). Every rank passes its rank_snapshot; the ranks all-gather the hashes
// of their piece keys, counters and blobs, and each distinct piece (a replicated tensor held by every
// data-parallel rank) is written once, by the lowest rank holding it. Each rank writes its own shard file
// into the save's temporary directory; rank 0 then writes the manifest last and commits (rename, `latest`,
// pruning). A failure on one rank reaches every rank through run::agree_on_failure, never a hang.
//
// The asynchronous option (checkpoint_writer) runs the collective part (validation and the key all-gather)
// on the caller's thread, then hands the snapshot to a background thread that writes the rank's shard; no
// collective runs on that thread. Rank 0's thread commits without one either: it waits for every rank's
// index file to appear in the temporary directory (a rank that failed leaves an error marker there, so rank
// 0 fails at once; one that never writes is a timeout_error after checkpoint_options::commit_timeout_s).
// wait() rethrows this rank's writer error; wait(comm) also spreads any rank's error to every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../run/agreement.hpp"
#include "checkpoint_files.hpp"
#include "checkpoint_piece.hpp"
#include "checkpoint_store.hpp"

namespace hetmesh::train {

/// How a checkpoint is saved.
struct checkpoint_options {
  std::string layout;             ///< the layout it is saved under, for people and tools (not interpreted)
  int keep = 2;                   ///< step directories kept (the newest; `latest`'s always)
  double commit_timeout_s = 600;  ///< how long rank 0 waits for the other ranks' shards
};

namespace detail {

/// What one rank writes in a save: its pieces and blobs it owns, the checkpoint's id, the temporary dir.
struct checkpoint_save_plan {
  std::vector<char> own_piece;  ///< per snapshot piece: written by this rank
  std::vector<char> own_blob;   ///< per blob (name order): written by this rank
  std::uint64_t id = 0;         ///< the checkpoint's id (rank 0's draw)
  std::string tmp;              ///< the save's temporary directory
};

/// Checks a snapshot before anything is written: keys well-formed, data of key.count elements.
template <class T>
void check_snapshot(const rank_snapshot<T>& s, std::int64_t step) {
  if (step < 0) throw_error<invalid_argument>("train::save_checkpoint: step {}; expected >= 0", step);
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    const auto& p = s.pieces[i];
    const std::string where = hetmesh::format(
        "train::save_checkpoint: snapshot piece {} (tensor {} field '{}')", i, p.key.tensor, p.key.field);
    check_piece_key<invalid_argument>(p.key, where);
    if (p.key.field.empty() || p.key.tensor < 0)
      throw_error<invalid_argument>("{}: expected a tensor id >= 0 and a field name", where);
    if (static_cast<std::int64_t>(p.data.size()) != p.key.count)
      throw_error<invalid_argument>("{}: {} elements; expected key.count = {}", where, p.data.size(),
                                    p.key.count);
  }
}

/// A 64-bit hash of a string (counter and blob names, blob contents).
[[nodiscard]] inline std::uint64_t ckpt_text_hash(const void* p, std::size_t n) noexcept {
  hasher h;
  h.add_bytes(static_cast<const unsigned char*>(p), n);
  return h.digest();
}

/// Throws mismatch_error (on every rank: the gathered data is the same) when two ranks give one name
/// different values (entries of `all` from `at`: count, then (name hash, value) pairs). Advances `at`.
inline void ckpt_agree_named(const std::vector<std::vector<std::uint64_t>>& all, std::vector<std::size_t>& at,
                             const char* what, std::map<std::uint64_t, int>& owner) {
  std::map<std::uint64_t, std::uint64_t> value;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto n = all[r][at[r]++];
    for (std::uint64_t i = 0; i < n; ++i, at[r] += 2) {
      const auto [it, fresh] = value.emplace(all[r][at[r]], all[r][at[r] + 1]);
      owner.emplace(all[r][at[r]], static_cast<int>(r));
      if (!fresh && it->second != all[r][at[r] + 1])
        throw_error<mismatch_error>(
            "train::save_checkpoint: {} of name hash {:016x} differs on rank {} and rank "
            "{}; expected every rank that holds it to hold the same value",
            what, all[r][at[r]], owner[all[r][at[r]]], r);
    }
  }
}

/// The collective part of a save (see the file comment). `prior` is this rank's failure before it (its
/// previous asynchronous save's); it fails every rank. Collective over c.
template <comm::host_communicator C, class T>
checkpoint_save_plan plan_checkpoint_save(C& c, const std::string& root, std::int64_t step,
                                          const rank_snapshot<T>& s, std::exception_ptr prior) {
  std::exception_ptr failure = prior;
  if (!failure) try {
      check_snapshot(s, step);
    } catch (...) {
      failure = std::current_exception();
    }
  run::agree_on_failure(c, failure, "train::save_checkpoint");
  hasher draw;
  append(draw, static_cast<std::uint64_t>(std::random_device{}()));
  append(draw, static_cast<std::int64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::vector<std::uint64_t> mine = {static_cast<std::uint64_t>(step), sizeof(T), draw.digest(),
                                     s.pieces.size()};
  for (const auto& p : s.pieces) mine.push_back(piece_key_hash(p.key));
  mine.push_back(s.counters.size());
  for (const auto& [k, v] : s.counters)
    mine.insert(mine.end(), {ckpt_text_hash(k.data(), k.size()), static_cast<std::uint64_t>(v)});
  mine.push_back(s.blobs.size());
  for (const auto& [k, v] : s.blobs)
    mine.insert(mine.end(), {ckpt_text_hash(k.data(), k.size()), ckpt_text_hash(v.data(), v.size())});
  const auto all = comm::all_gather_vectors(c, std::span<const std::uint64_t>(mine));
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r][0] != all[0][0] || all[r][1] != all[0][1])
      throw_error<invalid_argument>(
          "train::save_checkpoint: rank {} saves step {} of {}-byte elements, rank 0 "
          "step {} of {}-byte elements; expected every rank to save the same",
          r, all[r][0], all[r][1], all[0][0], all[0][1]);
  std::map<std::uint64_t, int> piece_owner, counter_owner, blob_owner;
  std::vector<std::size_t> at(all.size(), 4);
  for (std::size_t r = 0; r < all.size(); ++r) {
    for (std::uint64_t i = 0; i < all[r][3]; ++i) piece_owner.emplace(all[r][at[r]++], static_cast<int>(r));
  }
  ckpt_agree_named(all, at, "counter", counter_owner);
  ckpt_agree_named(all, at, "blob", blob_owner);
  checkpoint_save_plan plan;
  plan.id = all[0][2];
  plan.tmp = root + "/.tmp-" + checkpoint_step_name(step) + "-" + checksum_text(plan.id);
  std::set<std::uint64_t> taken;  // a key this rank holds twice is written once
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    const std::uint64_t h = mine[4 + i];
    plan.own_piece.push_back(piece_owner[h] == c.rank() && taken.insert(h).second ? 1 : 0);
  }
  for (const auto& [k, v] : s.blobs)
    plan.own_blob.push_back(blob_owner[ckpt_text_hash(k.data(), k.size())] == c.rank() ? 1 : 0);
  return plan;
}

}  // namespace detail

/// Saves `snapshot` (this rank's share) as step `step` of the checkpoint root `root`. Collective over `c`:
/// every rank passes its snapshot; each distinct piece key is written once, by the lowest rank holding it
/// (replicated pieces must hold equal data: the lowest rank's is kept); counters and blobs of one name must
/// agree across ranks (mismatch_error). Rank 0 writes the manifest last and commits (docs/checkpoint.md:
/// atomic, `latest` last, older steps pruned to options.keep). Returns the step directory on every rank.
/// Errors: any rank's (invalid_argument for a malformed snapshot, data_error for a file operation) is
/// rethrown on that rank and reported on every other (run::agree_on_failure); the previous checkpoint and
/// `latest` stay as they were. Cost: one all-gather of 8 bytes per piece, the rank's bytes written.
template <comm::host_communicator C, class T>
std::string save_checkpoint(C& c, const std::string& root, std::int64_t step,
                            const rank_snapshot<T>& snapshot, const checkpoint_options& options = {}) {
  const auto plan = detail::plan_checkpoint_save(c, root, step, snapshot, nullptr);
  std::exception_ptr failure;
  try {
    write_checkpoint_part(plan.tmp, c.rank(), step, plan.id, snapshot, plan.own_piece, plan.own_blob);
  } catch (...) {
    failure = std::current_exception();
  }
  try {
    run::agree_on_failure(c, failure, "train::save_checkpoint: writing the shards");
    failure = nullptr;
    if (c.rank() == 0) try {
        (void)commit_checkpoint({root, plan.tmp, step, plan.id, c.size(), std::string(checkpoint_dtype<T>()),
                                 options.layout, options.keep, options.commit_timeout_s});
      } catch (...) {
        failure = std::current_exception();
      }
    run::agree_on_failure(c, failure, "train::save_checkpoint: the commit");
  } catch (...) {
    std::error_code ignored;
    if (c.rank() == 0) std::filesystem::remove_all(plan.tmp, ignored);
    throw;
  }
  return root + "/" + checkpoint_step_name(step);
}

/// Opens and verifies the checkpoint in `dir` (a step directory, or a root whose `latest` names one) on
/// every rank of `c`, and checks that all opened the same one (mismatch_error otherwise). Collective over
/// `c`: a rank that cannot open it rethrows its data_error, the others report it. Cost: each rank reads
/// every file once (checksums).
template <comm::host_communicator C>
[[nodiscard]] checkpoint_reader load_checkpoint(C& c, const std::string& dir) {
  std::optional<checkpoint_reader> reader;
  std::exception_ptr failure;
  try {
    reader.emplace(dir);
  } catch (...) {
    failure = std::current_exception();
  }
  run::agree_on_failure(c, failure, "train::load_checkpoint");
  std::vector<std::uint64_t> ids(static_cast<std::size_t>(c.size()));
  const std::uint64_t id = reader->manifest().id;
  comm::all_gather(c, std::span<const std::uint64_t>(&id, 1), std::span<std::uint64_t>(ids));
  for (std::size_t r = 0; r < ids.size(); ++r)
    if (ids[r] != ids[0])
      throw_error<mismatch_error>(
          "train::load_checkpoint '{}': rank {} opened checkpoint {}, rank 0 {}; expected "
          "one checkpoint on every rank (did `latest` move?)",
          dir, r, checksum_text(ids[r]), checksum_text(ids[0]));
  return std::move(*reader);
}

/// Saves checkpoints on a background thread (see the file comment). One save at a time: save_async first
/// waits for the previous one. Not copyable or movable (its thread refers to it). The destructor waits for
/// a save in flight; an error that wait() did not collect is then dropped.
class checkpoint_writer {
 public:
  /// No save in flight.
  checkpoint_writer() = default;
  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;
  /// Waits for the save in flight.
  ~checkpoint_writer() {
    if (thread_.joinable()) thread_.join();
  }

  /// save_checkpoint, with the writing on a background thread: collective over `c` on the caller's thread
  /// (waits for the previous save; its error, or any rank's, fails every rank's call here), then returns;
  /// `snapshot` (host memory) is the writer's until the save ends. The step directory appears once rank 0's
  /// thread has committed.
  template <comm::host_communicator C, class T>
  void save_async(C& c, const std::string& root, std::int64_t step, rank_snapshot<T> snapshot,
                  const checkpoint_options& options = {}) {
    if (thread_.joinable()) thread_.join();
    const auto plan = detail::plan_checkpoint_save(c, root, step, snapshot, std::exchange(error_, nullptr));
    const checkpoint_commit commit{root,           plan.tmp,     step,
                                   plan.id,        c.size(),     std::string(checkpoint_dtype<T>()),
                                   options.layout, options.keep, options.commit_timeout_s};
    thread_ = std::thread([this, rank = c.rank(), plan, commit, s = std::move(snapshot)] {
      try {
        write_checkpoint_part(plan.tmp, rank, commit.step, plan.id, s, plan.own_piece, plan.own_blob);
        if (rank == 0) (void)commit_checkpoint(commit);
      } catch (...) {
        error_ = std::current_exception();
        try {  // the marker lets rank 0 fail at once instead of waiting out its timeout
          std::string why = "an exception not derived from std::exception";
          try {
            std::rethrow_exception(error_);
          } catch (const std::exception& e) {
            why = e.what();
          } catch (...) {
          }
          detail::ckpt_write_text(plan.tmp + "/" + detail::ckpt_error_name(rank), why, commit.step);
        } catch (...) {  // no marker (the directory is gone): rank 0 times out instead
        }
      }
    });
  }
  /// Waits for the save in flight; rethrows its error on this rank (each rank's own). Not collective.
  void wait() {
    if (thread_.joinable()) thread_.join();
    if (auto e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
  }
  /// wait() on every rank of `c`, then run::agree_on_failure: any rank's error fails every rank.
  template <comm::host_communicator C>
  void wait(C& c) {
    if (thread_.joinable()) thread_.join();
    run::agree_on_failure(c, std::exchange(error_, nullptr), "train::checkpoint_writer: the save");
  }
  /// Whether a save was started and not yet waited for.
  [[nodiscard]] bool pending() const noexcept { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace hetmesh::train
