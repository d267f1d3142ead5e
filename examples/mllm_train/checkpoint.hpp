// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's model checkpoint (until the library has one): crash-consistent saves and
// verified loads of each rank's tensors and Adam moments, with the data position beside them.
//
// Layout under the checkpoint directory D:
//   D/step-00000007/rank-<r>.bin   each rank's tensors (by tensor id) and Adam moments after step 7
//   D/step-00000007/data.ckpt      the data position (data::save_checkpoint: the step after 7)
//   D/step-00000007/manifest       written last: the step, the world size, and per file its size and
//                                  a 64-bit checksum (FNV-1a, hetmesh::hasher)
//   D/latest                       the name of the newest complete step directory
// A save writes every file under a temporary name, fsyncs it, renames it into place and fsyncs the
// folder; `latest` moves (the same way) only after the step's manifest is durable, and older steps
// (all but the new one and the one before) are removed only after that. A kill at any point therefore
// leaves `latest` naming a complete step: a directory a killed save left half written is never read,
// and the next save of that step starts it afresh.
//
// A load reads `latest`, then the manifest, then every file it lists (regular files only: a FIFO or a
// device is refused, never opened for a blocking read), checking each size and checksum, and parses
// every rank file, refusing NaN or Inf values, a negative second moment and an Adam update count that
// is negative or above the steps run, before anything is restored. Every error is a
// std::runtime_error naming the file and the field.
//
// Fault injection (the crash-consistency test): HETMESH_CKPT_KILL_AT=S:K raises SIGKILL right before the
// K-th file operation (1-based, counted over the process's ranks) of the save after step S.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace mllm::ckpt {

/// One tensor's state as saved: its global id, parameter values, Adam moments (as many floats as the
/// values) and Adam update count.
struct tensor_view {
  std::int64_t id = 0;             ///< global tensor id (layers.hpp's tensor_ref::id)
  std::span<const float> value{};  ///< the parameter
  std::span<const float> m{};      ///< Adam's first moment (value.size() floats)
  std::span<const float> v{};      ///< Adam's second moment (value.size() floats)
  std::int64_t t = 0;              ///< Adam's update count
};

/// The name of the directory of the checkpoint after `step` ("step-00000007").
[[nodiscard]] std::string step_name(std::int64_t step);

/// The name of rank `rank`'s file in a step directory ("rank-3.bin").
[[nodiscard]] std::string rank_file_name(int rank);

/// Rank 0, before any rank writes the files of `step`: creates `root` and an empty step directory for it
/// (removing what a killed save of the same step left). Throws std::runtime_error when that directory is
/// the one `latest` names (it would destroy the last good checkpoint) or a file operation fails.
void begin_save(const std::filesystem::path& root, std::int64_t step);

/// Every rank, after begin_save: writes its tensors into the step directory durably (temporary file,
/// fsync, rename). Throws std::runtime_error naming the path when a file operation fails.
void save_rank(const std::filesystem::path& root, std::int64_t step, int rank,
               std::span<const tensor_view> tensors);

/// Rank 0, after every rank's save_rank returned: `write_data(path)` writes the data position at the
/// given path (durably and atomically), then the manifest (sizes and checksums of the `ranks` rank files
/// and the data file) is written, the step directory fsynced, `latest` moved to it and older steps pruned.
void commit_save(const std::filesystem::path& root, std::int64_t step, int ranks,
                 const std::function<void(const std::filesystem::path&)>& write_data);

/// The step directory `latest` names under `root`, or an empty string when there is no `latest`. Throws
/// std::runtime_error when `latest` is not a regular file or does not hold a step directory's name.
[[nodiscard]] std::string latest_name(const std::filesystem::path& root);

/// One rank's state read back from a verified checkpoint.
class rank_state {
 public:
  /// The step the state was saved after.
  [[nodiscard]] std::int64_t step() const noexcept { return step_; }
  /// How many tensors the file holds.
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  /// Copies tensor `i` into `value`, `m` and `v` and returns its Adam update count. Throws
  /// std::runtime_error naming the file when the tensor's id or size is not `id` or value.size() (a
  /// checkpoint of another model split), or when `i` is past the tensors the file holds.
  std::int64_t restore(std::size_t i, std::int64_t id, std::span<float> value, std::span<float> m,
                       std::span<float> v) const;

  /// Parses and checks the bytes of rank `rank`'s file `path` of the checkpoint after `step`: its header,
  /// and per tensor finite values and moments, a non-negative second moment and an Adam count in
  /// [0, step + 1]. Throws std::runtime_error naming `path`, the tensor and the field.
  [[nodiscard]] static rank_state parse(std::vector<std::byte> bytes, const std::string& path,
                                        std::int64_t step, int rank);

 private:
  struct record {
    std::int64_t id = 0, t = 0;
    std::size_t size = 0, offset = 0;  // floats; value at offset, m and v after it
  };
  std::int64_t step_ = 0;
  std::string path_{};
  std::vector<record> tensors_{};
  std::vector<std::byte> bytes_{};
};

/// What load_latest found: the step directory, the step, the world size it was written by, and this
/// rank's state.
struct resume_point {
  std::filesystem::path dir{};  ///< the step directory `latest` names
  std::int64_t step = 0;        ///< the step the checkpoint was saved after
  int ranks = 0;                ///< the world size that wrote it
  rank_state mine{};            ///< this rank's tensors and moments
  /// The data position's file (verified against the manifest).
  [[nodiscard]] std::filesystem::path data_file() const { return dir / "data.ckpt"; }
};

/// Verifies and reads the checkpoint `latest` names under `root` for rank `rank` of `ranks`: the
/// manifest, the size and checksum of every file it lists, and the contents of every rank file (finite
/// values, non-negative second moments, Adam counts within [0, step + 1]), all before returning anything.
/// Deterministic, so every rank of a world refuses the same checkpoint. Throws std::runtime_error naming
/// the file and the field.
[[nodiscard]] resume_point load_latest(const std::filesystem::path& root, int rank, int ranks);

}  // namespace mllm::ckpt
