// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: checkpoint and resume. The whole data-plane state is the planner state (per source:
// epoch, position, quota carry), because the stream is a pure function of (configuration, state): no
// buffered payload, no worker count and no loader count is saved, and any of them may differ on resume.
// The file is small, versioned JSON, and carries a fingerprint of the parts of the configuration that
// shape the stream, so resuming under a different mixture fails loudly instead of silently diverging.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "detail/file.hpp"
#include "mixture.hpp"
#include "planner.hpp"

namespace hetmesh::data {

/// Version of the checkpoint format; loading another version is a data_error.
inline constexpr int checkpoint_version = 1;

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

/// Reads a checkpoint for `cfg`. Throws data_error for a malformed file or another version, and
/// mismatch_error when it was written under a configuration with a different stream.
[[nodiscard]] inline planner_state checkpoint_from_json(const mixture_config& cfg, const nlohmann::json& j) {
  if (!j.is_object() || j.value("format", "") != "hetmesh-data-state")
    throw_error<data_error>("not a hetmesh data checkpoint (expected \"format\": \"hetmesh-data-state\")");
  if (j.value("version", 0) != checkpoint_version)
    throw_error<data_error>("data checkpoint version {}; this build reads version {}", j.value("version", 0),
                            checkpoint_version);
  const std::string want = hetmesh::format("{:016x}", stream_fingerprint(cfg));
  if (j.value("fingerprint", "") != want)
    throw_error<mismatch_error>(
        "data checkpoint fingerprint {} does not match the configuration's {}: it was written under another "
        "mixture (seed, batch, sources or weights differ)",
        j.value("fingerprint", ""), want);
  planner_state st{};
  try {
    st.step = j.at("step").get<std::int64_t>();
    const auto& src = j.at("sources");
    if (src.size() != cfg.sources.size())
      throw_error<mismatch_error>("data checkpoint has {} sources; the configuration has {}", src.size(),
                                  cfg.sources.size());
    for (std::size_t s = 0; s < src.size(); ++s) {
      if (src[s].at("name").get<std::string>() != cfg.sources[s].name)
        throw_error<mismatch_error>("data checkpoint source {} is '{}'; the configuration's is '{}'", s,
                                    src[s].at("name").get<std::string>(), cfg.sources[s].name);
      st.cursors.push_back({src[s].at("epoch").get<std::int64_t>(), src[s].at("position").get<std::int64_t>(),
                            src[s].at("carry").get<std::int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw_error<data_error>("data checkpoint is malformed: {}", e.what());
  }
  return st;
}

/// Writes the checkpoint to `path` atomically (a crash leaves the old or the new file, never half).
inline void save_checkpoint(const std::string& path, const mixture_config& cfg, const planner_state& st) {
  const std::string text = checkpoint_to_json(cfg, st).dump(1);
  detail::write_file_atomic(path, std::as_bytes(std::span<const char>(text)));
}

/// Reads the checkpoint at `path` (see checkpoint_from_json for errors).
[[nodiscard]] inline planner_state load_checkpoint(const std::string& path, const mixture_config& cfg) {
  auto j = nlohmann::json::parse(detail::read_text(path), nullptr, false);
  if (j.is_discarded()) throw_error<data_error>("data checkpoint '{}' is not valid JSON", path);
  try {
    return checkpoint_from_json(cfg, j);
  } catch (error& e) {
    e.add_context(hetmesh::format("reading '{}'", path));
    throw;
  }
}

}  // namespace hetmesh::data
