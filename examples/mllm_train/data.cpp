// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's data (data.hpp): the sources' writer and the step source's bodies, compiled once
// (the data room's loader, its JSON and its writers stay out of the trainer's translation units).
#include "mllm_train/data.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include <hetmesh/core/files.hpp>
#include <hetmesh/core/json_file.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/loader.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/data/webdataset.hpp>
#include <hetmesh/run/records.hpp>
#include <hetmesh/train/build.hpp>

namespace mllm {

sample_lengths read_sample_lengths(const std::filesystem::path& dir) {
  // Regular files only, of at most 1 GiB (a FIFO or a directory is refused by name, core/files.hpp).
  auto slurp = [](const std::filesystem::path& p) {
    return hetmesh::read_regular_file(p.string(), hetmesh::large_file_bytes,
                                      "sample lengths (data_config::samples_dir is examples/data)");
  };
  sample_lengths out;
  const std::string prolong = slurp(dir / "prolong_sample.txt");
  const std::string mm = slurp(dir / "multimodal_sample.jsonl");
  hetmesh::hasher h;
  hetmesh::append_all(h, prolong, mm);
  out.digest = h.digest();
  std::istringstream p(prolong);
  for (std::int64_t v = 0; p >> v;) out.documents.push_back(v);
  std::istringstream m(mm);
  std::string line;
  while (std::getline(m, line)) {
    if (line.empty()) continue;
    const auto j = hetmesh::parse_json_bounded(line, (dir / "multimodal_sample.jsonl").string());
    if (!j.is_object() || !j.contains("text"))
      throw std::runtime_error(fmt::format("mllm: malformed line in multimodal_sample.jsonl: {}", line));
    sample_lengths::multimodal s;
    s.text = j["text"].get<std::int64_t>();
    if (j.contains("images")) s.images = j["images"].get<std::vector<std::int64_t>>();
    if (j.contains("audio")) s.audio = j["audio"].get<std::vector<std::int64_t>>();
    out.samples.push_back(std::move(s));
  }
  if (out.documents.empty() || out.samples.empty())
    throw std::runtime_error(fmt::format("mllm: no lengths in '{}'", dir.string()));
  return out;
}

std::uint64_t sources_hash(const data_config& cfg, const sample_lengths& lengths) {
  hetmesh::hasher h;
  hetmesh::append_all(h, std::string("mllm-sources-v1"), cfg, lengths.digest);
  return h.digest();
}

namespace source_writing {  // helpers of make_sources (example-local, not the data room's)

std::int64_t clamp_scaled(std::int64_t v, std::int64_t scale, std::int64_t lo, std::int64_t hi) {
  return std::clamp<std::int64_t>(v / std::max<std::int64_t>(1, scale), lo, hi);
}

void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  hetmesh::write_file_atomic(path.string(), text, "data source");
}

std::vector<std::byte> as_bytes(const std::string& s) {
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return {b, b + s.size()};
}

// One multimodal sample: `copy` of line `line`, items of one encoder (0 images, 1 audio).
void add_multimodal(hetmesh::data::wds_writer& w, const data_config& cfg, const sample_lengths::multimodal& s,
                    std::size_t line, int copy, int encoder) {
  const std::uint64_t key =
      hetmesh::key_hash({cfg.seed, 0x5a3b1e, static_cast<std::uint64_t>(encoder),
                         static_cast<std::uint64_t>(line), static_cast<std::uint64_t>(copy)});
  hetmesh::rng g(key);
  const std::int64_t c = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(cfg.classes)));
  const std::int64_t n_caption =
      clamp_scaled(s.text, cfg.caption_scale, 1 + cfg.class_tail, cfg.max_caption_tokens);
  std::vector<std::int32_t> caption{static_cast<std::int32_t>(first_class_token + c)};
  for (int k = 0; k < cfg.class_tail; ++k)
    caption.push_back(static_cast<std::int32_t>(text_gen::class_tail_token(cfg, c, k)));
  text_gen::continue_chain(cfg, text_gen::successors(cfg), g, caption.back(),
                           n_caption - static_cast<std::int64_t>(caption.size()), caption);
  const auto& counts = encoder == vision_index ? s.images : s.audio;
  const std::int64_t scale = encoder == vision_index ? cfg.image_scale : cfg.audio_scale;
  const char* prefix = encoder == vision_index ? "img" : "aud";
  const int width = feature_width(cfg, encoder);
  nlohmann::json items = nlohmann::json::array();
  std::vector<std::pair<std::string, std::vector<std::byte>>> members;
  members.emplace_back("json", std::vector<std::byte>{});
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const std::int64_t rows = clamp_scaled(counts[k], scale, cfg.min_item_tokens, cfg.max_item_tokens);
    const std::string ext = fmt::format("{}{}", prefix, k);
    items.push_back({{"ext", ext}, {"tokens", rows}});
    std::vector<std::byte> payload(static_cast<std::size_t>(rows * width) * sizeof(float));
    for (std::int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < width; ++j) {
        const float v = class_pattern(cfg, encoder, c, j) +
                        static_cast<float>(cfg.feature_noise * (2.0 * g.unit() - 1.0));
        const auto bits = std::bit_cast<std::uint32_t>(v);
        const auto at = static_cast<std::size_t>(r * width + j) * 4;
        for (int b = 0; b < 4; ++b)  // little-endian float32, whatever the host
          payload[at + static_cast<std::size_t>(b)] = static_cast<std::byte>((bits >> (8 * b)) & 0xffU);
      }
    members.emplace_back(ext, std::move(payload));
  }
  nlohmann::json meta{{"tokens", caption.size()},
                      {"text_tokens", caption},
                      {"items", items},
                      {"class", c},
                      {"line", line},
                      {"copy", copy}};
  if (cfg.answer_only_loss) {  // caption[k] predicts caption[k + 1]: the class decides the first class_tail
    std::vector<int> mask(caption.size(), 0);
    for (std::size_t k = 0; k < mask.size() && k < static_cast<std::size_t>(cfg.class_tail); ++k) mask[k] = 1;
    meta["loss_mask"] = mask;
  }
  members.front().second = as_bytes(meta.dump());
  w.add(fmt::format("{}_{:04}_{}", encoder == vision_index ? "image" : "audio", line, copy), members);
}

}  // namespace source_writing

std::vector<std::string> source_files(const data_config& cfg) {
  std::vector<std::string> f{"text.bin", "text.idx"};
  for (int s = 0; s < cfg.image_shards; ++s) {
    f.push_back(fmt::format("image-{:03}.tar", s));
    f.push_back(fmt::format("image-{:03}.tar.hmidx.json", s));
  }
  f.insert(f.end(), {"audio-000.tar", "audio-000.tar.hmidx.json", "mixture.json", "manifest.json"});
  return f;
}

bool sources_present(const std::filesystem::path& dir, const data_config& cfg) {
  const auto path = (dir / "manifest.json").string();
  if (!std::filesystem::exists(path)) return false;
  const auto j = hetmesh::read_json_file(path, "data manifest");
  const auto want = fmt::format("{:016x}", sources_hash(cfg, read_sample_lengths(cfg.samples_dir)));
  return j.is_object() && j.value("hash", std::string()) == want;
}

bool make_sources(const std::filesystem::path& dir, const data_config& cfg) {
  namespace data = hetmesh::data;
  if (cfg.vocab <= first_class_token + cfg.classes + 1 || cfg.classes < 1 || cfg.class_tail < 0 ||
      cfg.image_shards < 1 || cfg.copies < 1 || cfg.image_dim < 1 || cfg.audio_dim < 1)
    throw std::invalid_argument(fmt::format(
        "mllm::make_sources: vocab {} classes {} class_tail {} image_shards {} copies {} dims {}/{}; "
        "expected vocab > 3 + classes, classes >= 1, and the rest positive",
        cfg.vocab, cfg.classes, cfg.class_tail, cfg.image_shards, cfg.copies, cfg.image_dim, cfg.audio_dim));
  const auto lengths = read_sample_lengths(cfg.samples_dir);
  const auto hash = fmt::format("{:016x}", sources_hash(cfg, lengths));
  std::filesystem::create_directories(dir);
  if (sources_present(dir, cfg)) return false;
  for (const auto& f : source_files(cfg)) std::filesystem::remove(dir / f);

  // Text: Megatron indexed, uint16 ids (what Megatron picks for this vocabulary).
  double text_mean = 0;
  {
    data::indexed_dataset_writer w((dir / "text").string(), data::optimal_dtype(cfg.vocab));
    hetmesh::rng g(hetmesh::key_hash({cfg.seed, 0x7e47}));
    const auto chain = text_gen::successors(cfg);
    std::vector<std::int32_t> t;
    for (const auto len : lengths.documents) {
      const auto n =
          source_writing::clamp_scaled(len, cfg.text_scale, cfg.min_doc_tokens, cfg.max_doc_tokens);
      text_mean += static_cast<double>(n);
      t.clear();
      text_gen::continue_chain(cfg, chain, g, -1, n, t);
      w.add_sequence(std::span<const std::int32_t>(t));
      w.end_document();
    }
    w.finish();
    text_mean /= static_cast<double>(lengths.documents.size());
  }
  // Image-text and audio-text: WebDataset shards; samples of a line's copies go round the shards.
  double mean[2] = {0, 0};
  std::int64_t count[2] = {0, 0};
  for (int e : {vision_index, audio_index}) {
    const int shards = e == vision_index ? cfg.image_shards : 1;
    std::vector<std::unique_ptr<data::wds_writer>> ws;
    for (int s = 0; s < shards; ++s)
      ws.push_back(std::make_unique<data::wds_writer>(
          (dir / fmt::format("{}-{:03}.tar", e == vision_index ? "image" : "audio", s)).string()));
    std::int64_t n = 0;
    for (std::size_t line = 0; line < lengths.samples.size(); ++line) {
      const auto& s = lengths.samples[line];
      const auto& counts = e == vision_index ? s.images : s.audio;
      if (counts.empty()) continue;
      for (int copy = 0; copy < cfg.copies; ++copy, ++n) {
        source_writing::add_multimodal(*ws[static_cast<std::size_t>(n % shards)], cfg, s, line, copy, e);
        double tokens = static_cast<double>(source_writing::clamp_scaled(
            s.text, cfg.caption_scale, 1 + cfg.class_tail, cfg.max_caption_tokens));
        const auto scale = e == vision_index ? cfg.image_scale : cfg.audio_scale;
        for (auto v : counts)
          tokens += static_cast<double>(
              source_writing::clamp_scaled(v, scale, cfg.min_item_tokens, cfg.max_item_tokens));
        mean[e] += tokens;
      }
    }
    for (auto& w : ws) w->finish();
    count[e] = n;
    mean[e] /= static_cast<double>(std::max<std::int64_t>(1, n));
  }
  // Samples per step: tokens_per_step over the mean sample length, averaged over the curriculum's ends.
  const double mean_start =
      cfg.text_start * text_mean + cfg.image_start * mean[0] + cfg.audio_start * mean[1];
  const double mean_end = cfg.text_end * text_mean + cfg.image_end * mean[0] + cfg.audio_end * mean[1];
  const auto global_batch = std::max<std::int64_t>(
      1, std::llround(static_cast<double>(cfg.tokens_per_step) / (0.5 * (mean_start + mean_end))));
  auto weight = [&](double start, double end) {
    return nlohmann::json::array(
        {nlohmann::json::array({0, start}),
         nlohmann::json::array({std::max<std::int64_t>(1, cfg.curriculum_steps), end})});
  };
  nlohmann::json images = nlohmann::json::array();
  for (int s = 0; s < cfg.image_shards; ++s) images.push_back(fmt::format("image-{:03}.tar", s));
  const nlohmann::json mixture{
      {"seed", cfg.seed},
      {"global_batch", global_batch},
      {"sources", nlohmann::json::array({{{"name", "text"},
                                          {"paths", nlohmann::json::array({"text"})},
                                          {"weight", weight(cfg.text_start, cfg.text_end)}},
                                         {{"name", "image"},
                                          {"format", "webdataset"},
                                          {"paths", images},
                                          {"modality", "image"},
                                          {"weight", weight(cfg.image_start, cfg.image_end)}},
                                         {{"name", "audio"},
                                          {"format", "webdataset"},
                                          {"paths", nlohmann::json::array({"audio-000.tar"})},
                                          {"modality", "audio"},
                                          {"weight", weight(cfg.audio_start, cfg.audio_end)}}})},
      {"cost", {{"linear", 1}, {"quadratic", 0}, {"item_linear", 1}}},
      {"micro_batches", 1}};
  source_writing::write_text_atomic(dir / "mixture.json", mixture.dump(1) + "\n");
  const nlohmann::json manifest{{"format", "hetmesh-mllm-sources"},
                                {"hash", hash},
                                {"text_documents", lengths.documents.size()},
                                {"image_samples", count[0]},
                                {"audio_samples", count[1]},
                                {"mean_tokens", {text_mean, mean[0], mean[1]}},
                                {"global_batch", global_batch}};
  source_writing::write_text_atomic(dir / "manifest.json", manifest.dump(1) + "\n");
  return true;
}

hetmesh::data::mixture_config load_mixture(const std::filesystem::path& dir) {
  const auto path = (dir / "mixture.json").string();
  if (!std::filesystem::exists(path))
    throw std::runtime_error(fmt::format("mllm: no mixture.json in '{}': run make_sources", dir.string()));
  auto j = hetmesh::read_json_file(path, "mixture");
  for (auto& s : j["sources"])
    for (auto& p : s["paths"]) p = (dir / p.get<std::string>()).string();
  return hetmesh::data::mixture_from_json(j);
}

/// The data room's loader behind step_source.
struct step_source::loader {
  loader(hetmesh::data::mixture_config m, hetmesh::data::loader_options o) : l(std::move(m), o) {}
  hetmesh::data::data_loader l;
};

step_source::step_source(const std::filesystem::path& dir, data_config cfg) : cfg_(std::move(cfg)) {
  if (!sources_present(dir, cfg_))
    throw std::runtime_error(fmt::format(
        "mllm::step_source: '{}' does not hold the sources of this config; call make_sources first",
        dir.string()));
  // workers = 0, prefetch 0: reads happen inside next(), on the caller's thread (the example runs
  // 8 ranks on 2 cores; the stream does not depend on these settings).
  loader_ = std::make_unique<loader>(load_mixture(dir),
                                     hetmesh::data::loader_options{.workers = 0, .prefetch_steps = 0});
}

step_source::~step_source() = default;
step_source::step_source(step_source&&) noexcept = default;
step_source& step_source::operator=(step_source&&) noexcept = default;

hetmesh::model::step_batch step_source::next() {
  auto b = loader_->l.next();
  // The library's projection lays each sample out (ids, placeholders then text, items numbered per encoder
  // in step order, loss masks); the item kinds are "img0", "img1", ... and "aud0", ... (source_writing).
  std::vector<std::string> kinds(2);
  kinds[vision_index] = "img";
  kinds[audio_index] = "aud";
  hetmesh::model::step_batch out = hetmesh::run::to_step_batch(
      b, {.encoders = std::move(kinds), .placeholder_token = placeholder_token, .pad_token = pad_token});
  summary_ = {};
  masked_text_.clear();
  summary_.step = b.plan.step;
  summary_.quotas = b.plan.quotas;
  for (auto& f : features_) f.clear();
  for (auto& o : offsets_) o.clear();
  for (std::size_t i = 0; i < b.samples.size(); ++i) {
    const auto& s = b.samples[i];
    const auto& d = out.documents[i];
    for (std::size_t k = 0; k < s.items.size(); ++k) {  // d.items[k] is s.items[k]
      const auto& it = s.items[k];
      const int e = d.items[k].encoder;
      const auto width = static_cast<std::int64_t>(feature_width(cfg_, e));
      if (static_cast<std::int64_t>(it.payload.size()) != it.tokens * width * 4)
        throw std::runtime_error(fmt::format(
            "mllm::step_source: sample {} item '{}' has {} payload bytes; expected {} rows x {} floats", d.id,
            it.kind, it.payload.size(), it.tokens, width));
      auto& f = features_[static_cast<std::size_t>(e)];
      offsets_[static_cast<std::size_t>(e)].push_back(static_cast<std::int64_t>(f.size()));
      for (std::size_t q0 = 0; q0 < it.payload.size(); q0 += 4) {
        std::uint32_t bits = 0;
        for (std::size_t q = 0; q < 4; ++q)
          bits |= static_cast<std::uint32_t>(std::to_integer<std::uint8_t>(it.payload[q0 + q])) << (8 * q);
        f.push_back(std::bit_cast<float>(bits));
      }
      summary_.encoder_tokens[e] += it.tokens;
    }
    if (!d.loss_mask.empty()) masked_text_[d.id] = hetmesh::train::text_part_bytes(d);
    summary_.tokens += d.length();
  }
  for (std::size_t e = 0; e < 2; ++e) offsets_[e].push_back(static_cast<std::int64_t>(features_[e].size()));
  loader_->l.recycle(std::move(b));
  return out;
}

void step_source::features(int encoder, std::int64_t item, std::span<float> out) const {
  const auto f = item_features(encoder, item);
  if (out.size() != f.size())
    throw std::invalid_argument(
        fmt::format("mllm::step_source::features: encoder {} item {} has {} floats; "
                    "out has {}",
                    encoder, item, f.size(), out.size()));
  std::copy(f.begin(), f.end(), out.begin());
}
std::span<const float> step_source::item_features(int encoder, std::int64_t item) const {
  const auto& o = offsets_.at(static_cast<std::size_t>(encoder));
  if (item < 0 || item + 1 >= static_cast<std::int64_t>(o.size()))
    throw std::out_of_range(fmt::format("mllm::step_source: encoder {} has no item {} in step {} ({} items)",
                                        encoder, item, summary_.step, items(encoder)));
  const auto& f = features_[static_cast<std::size_t>(encoder)];
  return std::span<const float>(f).subspan(
      static_cast<std::size_t>(o[static_cast<std::size_t>(item)]),
      static_cast<std::size_t>(o[static_cast<std::size_t>(item) + 1] - o[static_cast<std::size_t>(item)]));
}

std::span<const std::uint8_t> step_source::part_bytes(const hetmesh::model::document& d, int item) const {
  if (item == hetmesh::data::text_part) {
    if (d.loss_mask.empty()) return hetmesh::train::text_bytes(d);
    const auto t = masked_text_.find(d.id);
    if (t == masked_text_.end())
      throw std::out_of_range(fmt::format(
          "mllm::step_source: document {} is not a masked document of step {}", d.id, summary_.step));
    return t->second;
  }
  const auto& it = d.items.at(static_cast<std::size_t>(item));
  const auto f = item_features(it.encoder, it.id);
  return {reinterpret_cast<const std::uint8_t*>(f.data()), f.size() * sizeof(float)};
}

hetmesh::data::planner_state step_source::state() const { return loader_->l.state(); }
void step_source::restore(const hetmesh::data::planner_state& st) { loader_->l.restore(st); }
void step_source::save(const std::filesystem::path& path) const {
  hetmesh::data::save_checkpoint(path.string(), loader_->l.config(), loader_->l.state());
}
void step_source::load(const std::filesystem::path& path) {
  loader_->l.restore(hetmesh::data::load_checkpoint(path.string(), loader_->l.config()));
}
std::string step_source::save_text() const {
  return hetmesh::data::checkpoint_to_json(loader_->l.config(), loader_->l.state()).dump(1);
}
void step_source::load_text(std::string_view text, std::string_view where) {
  const auto j = hetmesh::parse_json_bounded(text, where);
  try {
    loader_->l.restore(hetmesh::data::checkpoint_from_json(loader_->l.config(), j));
  } catch (hetmesh::error& e) {
    e.add_context(fmt::format("reading {}", where));
    throw;
  }
}
std::int64_t step_source::step() const { return loader_->l.state().step; }
const hetmesh::data::mixture_config& step_source::mixture() const noexcept { return loader_->l.config(); }

}  // namespace mllm
