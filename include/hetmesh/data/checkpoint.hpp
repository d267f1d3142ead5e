// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: checkpoint and resume. The whole data-plane state is the planner state (per source:
// epoch, position, quota carry), because the stream is a pure function of (configuration, state): no
// buffered payload, no worker count and no loader count is saved, and any of them may differ on resume.
// The file is small, versioned JSON, and carries a fingerprint of the parts of the configuration that
// shape the stream, so resuming under a different mixture fails loudly instead of silently diverging.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../core/json_file.hpp"
#include "detail/file.hpp"
#include "mixture.hpp"
#include "planner.hpp"

namespace hetmesh::data {

/// Version of the checkpoint format; loading another version is a data_error.
inline constexpr int checkpoint_version = 1;

/// The largest checkpoint file load_checkpoint reads (a checkpoint holds a few numbers per source).
inline constexpr std::int64_t max_checkpoint_bytes = std::int64_t{64} << 20;

/// Fingerprint of what the stream depends on: seed, batch, and per source its name, weights, filters
/// and epoch limit, plus the modality and bucket mixes. Paths are left out so data may move.
[[nodiscard]] inline std::uint64_t stream_fingerprint(const mixture_config& cfg) {
  hasher h;
  append_all(h, cfg.seed, cfg.global_batch, cfg.modalities, cfg.buckets);
  for (const auto& s : cfg.sources)
    append_all(h, s.name, s.weight, s.modality, s.bucket, s.min_tokens, s.max_tokens, s.max_epochs);
  return h.digest();
}

/// The checkpoint JSON of `st` under `cfg`.
[[nodiscard]] inline nlohmann::json checkpoint_to_json(const mixture_config& cfg, const planner_state& st) {
  nlohmann::json j;
  j["format"] = "hetmesh-data-state";
  j["version"] = checkpoint_version;
  j["fingerprint"] = hetmesh::format("{:016x}", stream_fingerprint(cfg));
  j["step"] = st.step;
  auto& src = j["sources"] = nlohmann::json::array();
  for (std::size_t s = 0; s < st.cursors.size(); ++s)
    src.push_back({{"name", cfg.sources[s].name},
                   {"epoch", st.cursors[s].epoch},
                   {"position", st.cursors[s].position},
                   {"carry", st.cursors[s].carry}});
  return j;
}

namespace detail {
/// The integer field `key` of JSON object `j` at JSON path `where`: data_error naming the path, the
/// field and what it holds when it is missing or not an integer that fits int64.
[[nodiscard]] inline std::int64_t checkpoint_int(const nlohmann::json& j, const char* key,
                                                 const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw_error<data_error>("{}.{}: missing; expected an integer", where, key);
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() &&
       it->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
    throw_error<data_error>("{}.{} = {}; expected an integer in int64", where, key, it->dump());
  return it->get<std::int64_t>();
}
/// The string field `key` of `j` at `where`, or data_error naming them.
[[nodiscard]] inline std::string checkpoint_string(const nlohmann::json& j, const char* key,
                                                   const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    throw_error<data_error>("{}.{} = {}; expected a string", where, key,
                            it == j.end() ? "(missing)" : it->dump());
  return it->get<std::string>();
}
}  // namespace detail

/// Reads a checkpoint for `cfg`. Every field is checked before use: the format and version, the
/// fingerprint, one entry per source in order, and each cursor's range (validate_state: step, epoch,
/// position >= 0, |carry| under one sample, carries summing to zero as the planner keeps them). Throws
/// data_error naming the JSON path, the field, the value and the expected range for a malformed or
/// tampered file or another version, and mismatch_error when it was written under a configuration with
/// a different stream. Positions are checked against the source sizes where the sources are open
/// (data_loader::restore, source_loader::index_at).
[[nodiscard]] inline planner_state checkpoint_from_json(const mixture_config& cfg, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("format") || j["format"] != "hetmesh-data-state")
    throw_error<data_error>("not a hetmesh data checkpoint (expected \"format\": \"hetmesh-data-state\")");
  const auto version = detail::checkpoint_int(j, "version", "checkpoint");
  if (version != checkpoint_version)
    throw_error<data_error>("checkpoint.version = {}; this build reads version {}", version,
                            checkpoint_version);
  const std::string want = hetmesh::format("{:016x}", stream_fingerprint(cfg));
  const std::string have = detail::checkpoint_string(j, "fingerprint", "checkpoint");
  if (have != want)
    throw_error<mismatch_error>(
        "data checkpoint fingerprint {} does not match the configuration's {}: it was written under another "
        "mixture (seed, batch, sources or weights differ)",
        have, want);
  planner_state st{};
  st.step = detail::checkpoint_int(j, "step", "checkpoint");
  const auto it = j.find("sources");
  if (it == j.end() || !it->is_array())
    throw_error<data_error>("checkpoint.sources = {}; expected a list with one entry per source",
                            it == j.end() ? std::string("(missing)") : it->dump());
  const auto& src = *it;
  if (src.size() != cfg.sources.size())
    throw_error<mismatch_error>("data checkpoint has {} sources; the configuration has {}", src.size(),
                                cfg.sources.size());
  std::int64_t carry_sum = 0;
  for (std::size_t s = 0; s < src.size(); ++s) {
    const std::string where = hetmesh::format("checkpoint.sources[{}]", s);
    if (!src[s].is_object()) throw_error<data_error>("{} = {}; expected an object", where, src[s].dump());
    const std::string name = detail::checkpoint_string(src[s], "name", where);
    if (name != cfg.sources[s].name)
      throw_error<mismatch_error>("data checkpoint source {} is '{}'; the configuration's is '{}'", s, name,
                                  cfg.sources[s].name);
    st.cursors.push_back({detail::checkpoint_int(src[s], "epoch", where),
                          detail::checkpoint_int(src[s], "position", where),
                          detail::checkpoint_int(src[s], "carry", where)});
  }
  validate_state(cfg, st, "checkpoint");
  for (const auto& c : st.cursors) carry_sum += c.carry;  // |carry| < weight_one: no overflow
  if (carry_sum != 0)
    throw_error<data_error>("checkpoint.sources[*].carry sum to {}; expected 0 (the planner keeps them so)",
                            carry_sum);
  return st;
}

/// Writes the checkpoint to `path` atomically (a crash leaves the old or the new file, never half).
inline void save_checkpoint(const std::string& path, const mixture_config& cfg, const planner_state& st) {
  const std::string text = checkpoint_to_json(cfg, st).dump(1);
  detail::write_file_atomic(path, std::as_bytes(std::span<const char>(text)));
}

/// Reads the checkpoint at `path` (see checkpoint_from_json for errors).
[[nodiscard]] inline planner_state load_checkpoint(const std::string& path, const mixture_config& cfg) {
  // A regular file of at most max_checkpoint_bytes, nested at most json_max_depth levels (a FIFO, a
  // directory, /dev/zero or "[[[[..." are refused by name, core/json_file.hpp).
  const auto j = read_json_file(path, "data checkpoint", max_checkpoint_bytes);
  try {
    return checkpoint_from_json(cfg, j);
  } catch (error& e) {
    e.add_context(hetmesh::format("reading '{}'", path));
    throw;
  }
}

}  // namespace hetmesh::data
