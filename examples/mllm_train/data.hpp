// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's data: three sources written once, deterministically, through the data room's
// public writers, and a step source that turns the data room's loader (mixture, curriculum, resume) into
// the model's step batches and the encoders' inputs.
//
//   make_sources(dir, cfg)   writes under dir, unless dir/manifest.json says they are there already:
//     text.{bin,idx}          Megatron indexed corpus; document lengths from prolong_sample.txt / text_scale
//     image-NNN.tar           WebDataset image-text shards (samples of multimodal_sample.jsonl with images)
//     audio-000.tar           WebDataset audio-text shard (samples with audio)
//     mixture.json            the data room's mixture (paths relative to dir) with a curriculum that moves
//                             from text-heavy to multimodal-heavy over cfg.curriculum_steps steps
//     manifest.json           the hash of everything above; written last, so a half-written dir is redone
//   step_source(dir, cfg)    next() is the next step's model::step_batch, drawn through data::data_loader;
//                             features()/input() hand the encoders their inputs for the current step.
//
// What the model can learn (vocabulary of cfg.vocab ids):
//   0 pad, 1 placeholder (rows an encoder's output replaces), 2 .. 2+C-1 class tokens, the rest text.
//   A text document follows a noisy Markov chain: t[i+1] = successor(t[i]) (one seeded cycle through the
//   text tokens), or with probability cfg.noise a uniform text token.
//   An image-text or audio-text sample has a class c (a hash of its key): each of its items' feature rows
//   is a class pattern (+-1 per feature, per encoder) plus uniform noise; its document is the items'
//   placeholders followed by the caption: class token 2 + c, then class_tail tokens that are a function of
//   c, then Markov text. Predicting the class token from the encoder rows is the multimodal part.
//
// Only the data room's public API is used here (nothing from its internal namespace).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/data/mixture.hpp>
#include <hetmesh/data/planner.hpp>
#include <hetmesh/data/routes.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/micro_batch.hpp>

namespace mllm {

/// Token ids with a fixed meaning.
inline constexpr std::int64_t pad_token = 0;          ///< padding
inline constexpr std::int64_t placeholder_token = 1;  ///< where an encoder's output rows land
inline constexpr std::int64_t first_class_token = 2;  ///< class c is token 2 + c

/// Encoder indices of the model (the order the encoders are passed to train::system::run).
inline constexpr int vision_index = 0;
inline constexpr int audio_index = 1;

/// Everything that shapes the example's data. Every field but samples_dir is part of the sources' hash.
struct data_config {
  std::string samples_dir = "examples/data";  ///< holds multimodal_sample.jsonl and prolong_sample.txt
  std::uint64_t seed = 1;                     ///< seeds the sources, the classes, the noise, the order
  // Vocabulary.
  int vocab = 64;      ///< V: 0 pad, 1 placeholder, 2..2+classes-1 classes, the rest text
  int classes = 8;     ///< C: classes of image and audio samples
  int class_tail = 3;  ///< tokens after the class token that are a function of the class
  double noise = 0.1;  ///< probability that a text token breaks the Markov chain
  // Sizes, scaled down from the real lengths of examples/data.
  std::int64_t text_scale = 64;          ///< text document tokens = prolong length / text_scale ...
  std::int64_t min_doc_tokens = 8;       ///< ... clamped to [min_doc_tokens, max_doc_tokens]
  std::int64_t max_doc_tokens = 256;     ///< longest text document (the model's longest sequence)
  std::int64_t caption_scale = 64;       ///< caption tokens = sample's text tokens / caption_scale ...
  std::int64_t max_caption_tokens = 48;  ///< ... clamped to [1 + class_tail, max_caption_tokens]
  std::int64_t image_scale = 64;         ///< image encoder tokens = LLM tokens of the image / image_scale ...
  std::int64_t audio_scale = 48;         ///< audio frames = LLM tokens of the clip / audio_scale ...
  std::int64_t min_item_tokens = 4;      ///< ... both clamped to [min_item_tokens, max_item_tokens]
  std::int64_t max_item_tokens = 16;     ///< most encoder tokens of one image or clip
  int copies = 4;        ///< each multimodal line becomes this many samples (own class and noise)
  int image_shards = 2;  ///< image-text shards
  // Encoder inputs.
  int image_dim = 16;           ///< P: floats per image token
  int audio_dim = 16;           ///< A: floats per audio frame
  double feature_noise = 0.25;  ///< amplitude of the uniform noise on the +-1 class pattern
  // Mixture.
  std::int64_t tokens_per_step = 1024;  ///< about this many tokens per step (sets the samples per step)
  std::int64_t curriculum_steps = 20;   ///< weights move linearly from the start to the end mix
  double text_start = 0.8, image_start = 0.15, audio_start = 0.05;  ///< weights at step 0
  double text_end = 0.2, image_end = 0.55, audio_end = 0.25;        ///< weights from curriculum_steps on
  // Loss.
  /// Image and audio samples carry a loss mask over their caption (the json's "loss_mask"): only the
  /// targets the class decides count (the class token after the last placeholder and the class_tail tokens
  /// after it), as a fine-tuning mask counts only the answer. Off: no masks, every target counts.
  bool answer_only_loss = false;

  /// Hash of the fields that shape the sources' bytes (not samples_dir: the data files' contents are
  /// hashed instead, so a moved checkout finds its sources).
  void hash_append(hetmesh::hasher& h) const {
    hetmesh::append_all(h, seed, vocab, classes, class_tail, noise, text_scale, min_doc_tokens,
                        max_doc_tokens, caption_scale, max_caption_tokens, image_scale, audio_scale,
                        min_item_tokens, max_item_tokens, copies, image_shards, image_dim, audio_dim,
                        feature_noise, tokens_per_step, curriculum_steps);
    hetmesh::append_all(h, text_start, image_start, audio_start, text_end, image_end, audio_end);
    if (answer_only_loss) hetmesh::append_all(h, answer_only_loss);  // hashes without it stay as they were
  }
};

/// Floats per encoder token of `encoder` (vision_index: image_dim, audio_index: audio_dim).
[[nodiscard]] inline int feature_width(const data_config& cfg, int encoder) {
  if (encoder == vision_index) return cfg.image_dim;
  if (encoder == audio_index) return cfg.audio_dim;
  throw std::invalid_argument(fmt::format("mllm: encoder {}; expected 0 (vision) or 1 (audio)", encoder));
}

/// The class pattern: +1 or -1 for feature j of class c of `encoder`. Pure.
[[nodiscard]] inline float class_pattern(const data_config& cfg, int encoder, std::int64_t c, int j) {
  const auto h = hetmesh::key_hash({cfg.seed, 0x9a77e2, static_cast<std::uint64_t>(encoder),
                                    static_cast<std::uint64_t>(c), static_cast<std::uint64_t>(j)});
  return (h & 1U) != 0 ? 1.0F : -1.0F;
}

namespace text_gen {

/// First ordinary text token and how many there are. Pre: vocab > 2 + classes.
[[nodiscard]] inline std::int64_t base(const data_config& cfg) { return first_class_token + cfg.classes; }
[[nodiscard]] inline std::int64_t range(const data_config& cfg) { return cfg.vocab - base(cfg); }

/// The chain: successor[t - base] is text token t's successor (without noise). One cycle through every
/// text token (Sattolo's shuffle, seeded), so the chain neither sticks nor loops early. Pure.
[[nodiscard]] inline std::vector<std::int64_t> successors(const data_config& cfg) {
  std::vector<std::int64_t> next(static_cast<std::size_t>(range(cfg)));
  for (std::size_t i = 0; i < next.size(); ++i) next[i] = base(cfg) + static_cast<std::int64_t>(i);
  hetmesh::rng g(hetmesh::key_hash({cfg.seed, 0xc1c1e}));
  for (std::size_t i = next.size() - 1; i > 0; --i) std::swap(next[i], next[g.below(i)]);
  return next;
}

/// Appends n tokens continuing the chain from `prev` (from a random token when prev < base); each
/// token leaves the chain for a uniform one with probability cfg.noise.
inline void continue_chain(const data_config& cfg, const std::vector<std::int64_t>& next, hetmesh::rng& g,
                           std::int64_t prev, std::int64_t n, std::vector<std::int32_t>& out) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t t = 0;
    if (prev < base(cfg) || g.unit() < cfg.noise)
      t = base(cfg) + g.uniform(0, range(cfg) - 1);
    else
      t = next[static_cast<std::size_t>(prev - base(cfg))];
    out.push_back(static_cast<std::int32_t>(t));
    prev = t;
  }
}

/// Tail token k of class c: a function of (c, k) only.
[[nodiscard]] inline std::int64_t class_tail_token(const data_config& cfg, std::int64_t c, int k) {
  return base(cfg) + (11 * c + 7 * k + 1) % range(cfg);
}

}  // namespace text_gen

/// The real-ish lengths the sources are scaled from (examples/data).
struct sample_lengths {
  struct multimodal {
    std::int64_t text = 0;
    std::vector<std::int64_t> images, audio;
  };
  std::vector<std::int64_t> documents;  ///< prolong_sample.txt, in file order
  std::vector<multimodal> samples;      ///< multimodal_sample.jsonl, in file order
  std::uint64_t digest = 0;             ///< hash of both files' bytes
};

/// Reads prolong_sample.txt and multimodal_sample.jsonl from `dir`. Throws runtime_error naming a
/// missing or malformed file.
[[nodiscard]] sample_lengths read_sample_lengths(const std::filesystem::path& dir);

/// The hash make_sources stores in manifest.json: config and sample files. Pure.
[[nodiscard]] std::uint64_t sources_hash(const data_config& cfg, const sample_lengths& lengths);

/// The files make_sources writes under its dir, relative to it (for tests and cleanup).
[[nodiscard]] std::vector<std::string> source_files(const data_config& cfg);

/// Whether `dir` holds the sources of `cfg` (its manifest's hash matches).
[[nodiscard]] bool sources_present(const std::filesystem::path& dir, const data_config& cfg);

/// Writes the example's sources under `dir` (created if missing) unless they are there for this config
/// already. Deterministic: the same config and sample files give the same bytes, wherever dir is.
/// Returns true when it wrote them, false when it found them. Throws runtime_error for unreadable sample
/// files and what the data room's writers throw. Not safe against a concurrent writer of the same dir.
bool make_sources(const std::filesystem::path& dir, const data_config& cfg);

/// The mixture make_sources wrote under `dir`, its relative paths resolved against `dir`. Throws what
/// data::mixture_from_json throws, and runtime_error when the file is missing.
[[nodiscard]] hetmesh::data::mixture_config load_mixture(const std::filesystem::path& dir);

/// What the current step holds (for logs and tests).
struct step_summary {
  std::int64_t step = -1;                   ///< the step
  std::vector<std::int64_t> quotas{};       ///< samples per source: text, image, audio
  std::int64_t tokens = 0;                  ///< tokens of all documents (placeholders included)
  std::int64_t encoder_tokens[2] = {0, 0};  ///< placeholder tokens per encoder
};

/// The example's step batches, drawn through the data room's loader.
///
/// Determinism: the batches are a pure function of (the sources, the config, the state): two step_sources
/// over the same dir give identical batches and features, step for step. A trainer may therefore open one
/// per rank and call next() on every rank in lockstep (what example_mllm_train does: no sharing, no
/// synchronisation; each rank reads the whole global batch, which is small here, and keeps only its
/// delivered share of it: part_bytes, delivered_input), or open one and share the batch. Not thread-safe for
/// next()/restore(); features()/input() are const and may be called from many threads at once between two
/// next() calls.
///
/// Its bodies are compiled once, in data.cpp: a trainer's translation units include this header without
/// the data room's loader (compile time, docs/compile-time.md).
class step_source {
 public:
  /// Opens the sources make_sources wrote under `dir` for `cfg` (throws runtime_error when dir does not
  /// hold them: call make_sources first).
  step_source(const std::filesystem::path& dir, data_config cfg);
  ~step_source();
  step_source(step_source&&) noexcept;
  step_source& operator=(step_source&&) noexcept;

  /// The next step's global batch (run::to_step_batch of the loaded step): one document per sample of the
  /// data room's step plan, in plan order (source, epoch, position). Document ids are the samples' stream
  /// ids. Items are numbered per encoder from 0 in document order; each item's placeholders are consecutive,
  /// at the start of its document, and the class token follows the last item. loss_mask is the sample's
  /// (data::sample::loss_mask) after one 1 per placeholder, or empty without one (answer_only_loss off):
  /// every target counts except those whose next token is a placeholder (model::target_counts). pad_token =
  /// 0.
  [[nodiscard]] hetmesh::model::step_batch next();

  /// What the current step (the last next()) holds.
  [[nodiscard]] const step_summary& summary() const noexcept { return summary_; }
  /// Items of `encoder` in the current step (ids 0 .. items-1).
  [[nodiscard]] std::int64_t items(int encoder) const {
    return static_cast<std::int64_t>(offsets_.at(static_cast<std::size_t>(encoder)).size()) - 1;
  }
  /// Floats per token of `encoder`.
  [[nodiscard]] int width(int encoder) const { return feature_width(cfg_, encoder); }

  /// The encoder input of item `item` of `encoder` in the current step: its rows, row-major, width(encoder)
  /// floats each, into `out` (out.size() must be rows x width). Throws out_of_range for an unknown item
  /// and invalid_argument for a wrong size.
  void features(int encoder, std::int64_t item, std::span<float> out) const;
  /// The encoder input of an item, as a view into the current step's storage (valid until next()).
  [[nodiscard]] std::span<const float> item_features(int encoder, std::int64_t item) const;

  /// The input callable train::bind_encoder takes for `encoder`: for each piece p of the view, rows
  /// [p.tokens.begin, p.tokens.end) of item p.item go to out[p.offset x width ...], width floats per
  /// row (so the stage's input_size(v) is v.size() x width). T is the model's element type. The callable
  /// refers to *this, which must outlive it; it reads the current step.
  template <class T = float>
  [[nodiscard]] auto input(int encoder) const {
    const auto w = static_cast<std::int64_t>(width(encoder));
    return [this, encoder, w](const hetmesh::model::encoder_batch_view& v, std::span<T> out) {
      for (const auto& p : v.pieces) {
        const auto f = item_features(encoder, p.item);
        if (p.tokens.begin < 0 || p.tokens.end * w > static_cast<std::int64_t>(f.size()) ||
            (p.offset + p.tokens.size()) * w > static_cast<std::int64_t>(out.size()))
          throw std::out_of_range(fmt::format(
              "mllm::step_source::input: piece of item {} rows [{}, {}) at {} does not fit (item {} rows, "
              "out "
              "{} rows)",
              p.item, p.tokens.begin, p.tokens.end, p.offset, static_cast<std::int64_t>(f.size()) / w,
              static_cast<std::int64_t>(out.size()) / w));
        const auto src = f.subspan(static_cast<std::size_t>(p.tokens.begin * w),
                                   static_cast<std::size_t>(p.tokens.size() * w));
        std::transform(src.begin(), src.end(), out.begin() + p.offset * w,
                       [](float x) { return static_cast<T>(x); });
      }
    };
  }

  /// The bytes of part `item` of `d`, a document of the current step, as delivery by plan moves them
  /// (train::plan_delivery's parts): its text for data::text_part (train::text_bytes, or
  /// train::text_part_bytes when it has a loss mask), else its item's encoder input (item_features, floats
  /// in host byte order). Valid until next().
  [[nodiscard]] std::span<const std::uint8_t> part_bytes(const hetmesh::model::document& d, int item) const;

  /// The data room's state before the step next() returns next: the checkpoint (a few integers per source).
  [[nodiscard]] hetmesh::data::planner_state state() const;
  /// Continues from `st`: the next next() returns the batch the uninterrupted run returned after st.
  void restore(const hetmesh::data::planner_state& st);
  /// state() saved as the data room's checkpoint file (data::save_checkpoint).
  void save(const std::filesystem::path& path) const;
  /// Restores from a file save() wrote (data::load_checkpoint checks it belongs to this mixture).
  void load(const std::filesystem::path& path);
  /// state() as the data room's checkpoint JSON text (data::checkpoint_to_json): what a model checkpoint
  /// keeps as its "data" blob.
  [[nodiscard]] std::string save_text() const;
  /// Restores from text save_text() wrote; the same checks as load() (format, version, this mixture's
  /// fingerprint, every cursor's range). Throws hetmesh::data_error or mismatch_error naming `where` and
  /// the field.
  void load_text(std::string_view text, std::string_view where);
  /// The step next() returns next.
  [[nodiscard]] std::int64_t step() const;
  /// The mixture it draws from (global_batch is the samples per step).
  [[nodiscard]] const hetmesh::data::mixture_config& mixture() const noexcept;
  /// The config it was opened with.
  [[nodiscard]] const data_config& config() const noexcept { return cfg_; }

 private:
  struct loader;  // the data room's data_loader (data.cpp)

  data_config cfg_;
  std::unique_ptr<loader> loader_;
  step_summary summary_{};
  std::array<std::vector<float>, 2> features_{};  // per encoder: the current step's rows, item after item
  std::map<std::int64_t, std::vector<std::uint8_t>> masked_text_;  // text parts of documents with a mask
  std::array<std::vector<std::int64_t>, 2> offsets_{
      {{0}, {0}}};  // per encoder: first float of each item, then the end
};

/// The input callable train::bind_encoder takes for `encoder` on a rank that runs on its delivered share:
/// the rows of the items `got` holds (their parts as step_source::part_bytes writes them), found by the
/// items of `step` (the step's metadata: which document and part holds an item id). Reads nothing else,
/// so a rank that encodes an item delivery did not bring it fails (out_of_range). Refers to `got`, which
/// must outlive it. T is the model's element type.
template <class T = float>
class delivered_input {
 public:
  /// The input of `encoder` (rows of `width` floats) from the item parts `got` holds, by the items of
  /// `step`.
  delivered_input(const hetmesh::data::delivered_share& got, const hetmesh::model::step_batch& step,
                  int encoder, int width)
      : encoder_(encoder), width_(width) {
    for (const auto& d : step.documents)
      for (std::size_t k = 0; k < d.items.size(); ++k) {
        const auto& it = d.items[k];
        if (it.encoder != encoder || !got.has(d.id, static_cast<int>(k))) continue;
        if (it.id >= static_cast<std::int64_t>(rows_.size()))
          rows_.resize(static_cast<std::size_t>(it.id) + 1);
        rows_[static_cast<std::size_t>(it.id)] = got.find(d.id, static_cast<int>(k));
      }
  }
  /// Writes the view's pieces, as step_source::input does, from the delivered bytes.
  void operator()(const hetmesh::model::encoder_batch_view& v, std::span<T> out) const {
    const auto w = static_cast<std::int64_t>(width_);
    for (const auto& p : v.pieces) {
      const auto b = p.item >= 0 && p.item < static_cast<std::int64_t>(rows_.size())
                         ? rows_[static_cast<std::size_t>(p.item)]
                         : std::span<const std::uint8_t>{};
      if (b.size() < static_cast<std::size_t>(p.tokens.end * w) * sizeof(float) || p.tokens.begin < 0 ||
          (p.offset + p.tokens.size()) * w > static_cast<std::int64_t>(out.size()))
        throw std::out_of_range(
            fmt::format("mllm::delivered_input: encoder {} item {} rows [{}, {}): {} bytes delivered to this "
                        "rank; expected "
                        "the item's rows (train::plan_delivery routes an item to the ranks that encode it)",
                        encoder_, p.item, p.tokens.begin, p.tokens.end, b.size()));
      for (std::int64_t k = 0; k < p.tokens.size() * w; ++k) {
        float x = 0;
        std::memcpy(&x, b.data() + static_cast<std::size_t>(p.tokens.begin * w + k) * sizeof(float),
                    sizeof x);
        out[static_cast<std::size_t>(p.offset * w + k)] = static_cast<T>(x);
      }
    }
  }

 private:
  int encoder_ = 0, width_ = 1;
  std::vector<std::span<const std::uint8_t>> rows_;  // by item id: its bytes (empty: not delivered here)
};

}  // namespace mllm
