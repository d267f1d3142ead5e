// SPDX-License-Identifier: Apache-2.0
// example_custom_model's data, through the library's data plane: a generated source (data::from_generator:
// record i is a pure function of i) of video clips with captions and of longer text documents, mixed and
// balanced like a file source, loaded by a data::data_loader, and projected onto the model's step batch by
// run::to_step_batch (int64 ids; each clip a run of placeholder tokens where the encoder's rows land).
// The clips' patch rows stay in the loaded samples; input() hands them to the encoder.
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/data/loader.hpp>
#include <hetmesh/data/memory_source.hpp>
#include <hetmesh/mesh/layout.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/run/records.hpp>

#include "custom_model/layers.hpp"

namespace custom {

/// The placeholder token of a clip's rows (text ids are 2 .. vocab - 1; 0 pads).
inline constexpr std::int64_t kPlaceholder = 1;

/// Record i of the generated source: two in three are a clip of 1-3 frames of `patches` patches
/// (patch_dim floats each) and a caption of 2-12 tokens; the rest are text documents of 10-40 tokens. Text
/// runs from a random token by a stride of 1-3, so the convolution can learn it.
inline hetmesh::data::memory_record make_record(const shape& s, std::int64_t i) {
  const auto u = static_cast<std::uint64_t>(i);
  auto h = [&](std::uint64_t a, std::uint64_t b = 0) { return hetmesh::key_hash({91, u, a, b}); };
  hetmesh::data::memory_record r;
  std::int64_t text = 10 + static_cast<std::int64_t>(h(1) % 31);
  if (i % 3 != 2) {
    const auto frames = 1 + static_cast<std::int64_t>(h(2) % 3);
    std::vector<float> rows(static_cast<std::size_t>(frames * s.patches * s.patch_dim));
    for (std::size_t k = 0; k < rows.size(); ++k)
      rows[k] = static_cast<float>(h(3, k) % 2001) / 1000.0F - 1.0F;
    r.items.push_back(hetmesh::data::make_item("video", frames * s.patches, rows));
    text = 2 + static_cast<std::int64_t>(h(4) % 11);
  }
  // Text a model can learn from the tokens before: an arithmetic run from a random start, stride 1-3.
  const auto start = static_cast<std::int64_t>(h(5) % 1000), stride = 1 + static_cast<std::int64_t>(h(6) % 3);
  for (std::int64_t t = 0; t < text; ++t) r.tokens.push_back(2 + (start + stride * t) % (s.vocab - 2));
  return r;
}

/// The steps of the generated source, as the model reads them. Every rank (or process) builds the same
/// source and loads the same steps; train::system then plans which rank runs what.
class step_source {
 public:
  /// `batch` samples per step, from seed `seed`.
  step_source(const shape& s, std::int64_t batch, std::uint64_t seed)
      : loader_(config(s, batch, seed), {.workers = 0, .prefetch_steps = 0}) {}

  /// Loads the next step and projects it onto the model's step batch.
  const hetmesh::model::step_batch& next() {
    loaded_ = loader_.next();
    batch_ = hetmesh::run::to_step_batch(loaded_, {.encoders = {"video"}, .placeholder_token = kPlaceholder});
    clips_.clear();  // to_step_batch numbers the clips 0, 1, ... in this order
    for (const auto& sample : loaded_.samples)
      for (const auto& item : sample.items) clips_.push_back(hetmesh::data::payload_as<float>(item));
    return batch_;
  }
  /// The current step's batch.
  [[nodiscard]] const hetmesh::model::step_batch& batch() const noexcept { return batch_; }

  /// The encoder's input callable (train::bind_encoder): for each piece of the view, the patch rows
  /// [begin, end) of its clip, at the piece's offset, patch_dim floats per row.
  template <class T>
  [[nodiscard]] auto input(std::int64_t patch_dim) const {
    return [this, patch_dim](const hetmesh::model::encoder_batch_view& v, std::span<T> out) {
      for (const auto& p : v.pieces) {
        const auto& rows = clips_.at(static_cast<std::size_t>(p.item));
        if (p.tokens.end * patch_dim > static_cast<std::int64_t>(rows.size()))
          throw std::out_of_range(fmt::format("clip {} has {} rows; the plan reads rows [{}, {})", p.item,
                                              rows.size() / static_cast<std::size_t>(patch_dim),
                                              p.tokens.begin, p.tokens.end));
        std::copy(rows.begin() + p.tokens.begin * patch_dim, rows.begin() + p.tokens.end * patch_dim,
                  out.begin() + p.offset * patch_dim);
      }
    };
  }

 private:
  static hetmesh::data::mixture_config config(const shape& s, std::int64_t batch, std::uint64_t seed) {
    namespace data = hetmesh::data;
    auto gen = [s](std::int64_t i) { return make_record(s, i); };
    return {.seed = seed,
            .global_batch = batch,
            .sources = {{.name = "clips",
                         .format = data::source_format::in_process,
                         .in_process = data::from_generator("clips", 4096, gen,
                                                            {.vocab = s.vocab, .kinds = {"video"}})}},
            .layout = hetmesh::mesh::make_mesh(hetmesh::mesh::dp(1))};
  }

  hetmesh::data::data_loader loader_;
  hetmesh::data::loaded_batch loaded_;
  hetmesh::model::step_batch batch_;
  std::vector<std::vector<float>> clips_;  ///< the current step's clips, by encoder item id
};

}  // namespace custom
