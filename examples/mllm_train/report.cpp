// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's reporting (report.hpp): the bodies, compiled once.
#include "mllm_train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/core/files.hpp>
#include <hetmesh/cost/calibrate.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/train/report_json.hpp>

#include "mllm_train/trainer.hpp"

namespace mllm {
namespace {

/// Per pool rank and slot: LLM tokens and encoder tokens landing (what an action's cost depends on).
struct slot_tokens {
  std::vector<std::vector<double>> llm, encoder;
};

slot_tokens tokens_of(const hetmesh::train::step_layout& plan, const hetmesh::model::step_batch& batch) {
  slot_tokens t;
  const auto s = hetmesh::model::summarize_step(batch);
  const auto slots = static_cast<std::size_t>(std::max(plan.slots, 1));
  for (int q = 0; q < plan.world; ++q) {
    t.llm.emplace_back(slots, 0.0);
    t.encoder.emplace_back(slots, 0.0);
    for (const auto& mb : hetmesh::train::build_micro_batches(plan, batch, s, q)) {
      t.llm.back()[static_cast<std::size_t>(mb.index)] = static_cast<double>(mb.tokens.size());
      for (const auto& l : mb.encoder_outputs)
        t.encoder.back()[static_cast<std::size_t>(mb.index)] += static_cast<double>(l.item_tokens.size());
    }
  }
  return t;
}

/// Costs fitted per (action type, stage) from measured actions.
class cost_fit {
 public:
  /// Fits to the report's compute actions of `plan` over `batch`.
  void calibrate(const hetmesh::train::step_layout& plan, const hetmesh::model::step_batch& batch,
                 const hetmesh::train::step_report& rep) {
    const auto t = tokens_of(plan, batch);
    std::map<std::pair<int, int>, std::vector<hetmesh::cost::sample_point>> pts;
    for (const auto& a : rep.cpu_actions)  // thread CPU times of the stage calls (ranks share cores)
      pts[{static_cast<int>(a.what.type), a.what.stage}].push_back(
          {x(plan, t, a.rank % plan.world, a.what), a.end - a.start});
    for (auto& [key, p] : pts) {
      try {
        fits_[key] = hetmesh::cost::fit_quadratic(p).model;
      } catch (const std::exception&) {  // too few distinct loads: a constant, their mean
        double sum = 0;
        for (const auto& q : p) sum += q.time;
        fits_[key] = {0.0, 0.0, sum / static_cast<double>(p.size())};
      }
    }
  }
  [[nodiscard]] bool ready() const noexcept { return !fits_.empty(); }

  /// The modelled step: the slowest pipeline's simulated step time, and every pipeline's simulated
  /// actions (world ranks) for a timeline.
  [[nodiscard]] std::pair<double, std::vector<hetmesh::pipeline::timed_action>> model(
      const hetmesh::train::step_layout& plan, const hetmesh::model::step_batch& batch) const {
    const auto t = tokens_of(plan, batch);
    double worst = 0;
    std::vector<hetmesh::pipeline::timed_action> all;
    for (int q = 0; q < plan.world; ++q) {
      hetmesh::pipeline::cost_model c;
      c.compute = [&, q](const hetmesh::pipeline::action& a) {
        const auto it = fits_.find({static_cast<int>(a.type), a.stage});
        const double n = x(plan, t, q, a);
        return it == fits_.end() || n == 0 ? 0.0 : std::max(it->second(n), 0.0);
      };
      auto sim = hetmesh::pipeline::simulate(plan.pipeline, c);
      worst = std::max(worst, sim.step_time);
      for (auto& a : sim.timeline) {
        a.rank = a.rank * plan.world + q;
        all.push_back(a);
      }
    }
    return {worst, std::move(all)};
  }

 private:
  static double x(const hetmesh::train::step_layout& plan, const slot_tokens& t, int q,
                  const hetmesh::pipeline::action& a) {
    const auto m = static_cast<std::size_t>(std::max(a.microbatch, 0));
    const bool enc = a.type == hetmesh::pipeline::action_type::encoder_forward ||
                     a.type == hetmesh::pipeline::action_type::encoder_backward;
    const auto& v = (enc ? t.encoder : t.llm)[static_cast<std::size_t>(q)];
    if (m >= v.size()) return 0.0;
    return enc ? v[m] / std::max(plan.pipeline.num_encoder_shards(), 1) : v[m];
  }
  std::map<std::pair<int, int>, hetmesh::cost::quadratic_time> fits_;
};

/// The plan in one phrase: rings by degree, micro-batches per pool rank, slots.
std::string plan_summary(const hetmesh::train::step_layout& p) {
  std::map<int, int> degrees;
  for (const auto& r : p.rings) ++degrees[r.size()];
  std::string d;
  for (const auto& [k, n] : degrees) d += fmt::format("{}{}x{}", d.empty() ? "" : " ", n, k);
  std::size_t lo = ~std::size_t{0}, hi = 0;
  for (const auto& l : p.per_rank) {
    lo = std::min(lo, l.size());
    hi = std::max(hi, l.size());
  }
  int offloaded = 0;
  for (const auto& l : p.per_rank)
    for (const auto& mb : l) offloaded += mb.offload_ratio > 0 ? 1 : 0;
  return fmt::format("rings {} (count x degree: {}), mb/rank {}-{}, {} slots{}", p.rings.size(), d, lo, hi,
                     p.slots, offloaded > 0 ? fmt::format(", {} mb offloading", offloaded) : std::string());
}

/// Writes `text` to `path` (creating its folder) crash-consistently (core/files.hpp): a failure (a
/// read-only folder, a folder or /dev/full as the target, a full disk) throws naming the path, and an
/// earlier file of that name stays whole.
void write_file(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  hetmesh::write_file_atomic(path.string(), text, "report");
}

/// An SVG line plot of series over steps (each scaled to its own range, labelled with it).
std::string svg_plot(const std::vector<std::pair<std::string, std::vector<double>>>& series,
                     const std::string& title) {
  constexpr int w = 640, h = 260, l = 50, t = 30;
  const char* colours[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b"};
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" "
      "font-size=\"13\">{}</text>\n",
      w, h + 40, l, title);
  for (std::size_t k = 0; k < series.size(); ++k) {
    const auto& v = series[k].second;
    if (v.empty()) continue;
    const double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    std::string pts;
    for (std::size_t i = 0; i < v.size(); ++i)
      pts += fmt::format("{:.1f},{:.1f} ",
                         l + (w - l - 20) * (v.size() > 1 ? double(i) / double(v.size() - 1) : 0.0),
                         t + (h - t) * (hi > lo ? (hi - v[i]) / (hi - lo) : 0.5));
    out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       colours[k % 4], pts);
    out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{} ({:.3g} .. {:.3g})</text>\n", l + 190 * k,
                       h + 25, colours[k % 4], series[k].first, lo, hi);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">step</text>\n</svg>\n", w / 2, h + 5);
  return out;
}

/// The flags of the run, as the --report JSON's "config".
nlohmann::json config_json(const options& o) {
  return {
      {"steps", o.steps},       {"ranks", o.ranks},     {"backend", o.backend},   {"partition", o.partition},
      {"schedule", o.schedule}, {"encoder", o.encoder}, {"balancer", o.balancer}, {"pp", o.pp}};
}

}  // namespace

struct run_log::impl {
  impl(std::filesystem::path out, bool root) : out_(std::move(out)), root_(root) {}

  void step(const step_result& r) {
    if (!root_) return;
    const auto& rep = *r.report;
    if (!fit_.ready()) fit_.calibrate(*r.plan, *r.batch, rep);
    const auto [modelled, sim] = fit_.model(*r.plan, *r.batch);
    loss_.push_back(rep.stats.loss);
    tokens_.push_back(rep.stats.tokens);
    busy_.push_back(rep.cpu_busy_seconds);
    max_busy_.push_back(rep.max_cpu_busy());
    modelled_.push_back(modelled);
    plan_ms_.push_back(r.plan_ms);
    // The library's share of the step's thread CPU time over all ranks: planning plus run() less the stage
    // and encoder calls, the bytes on the wire and the optimizer (step_stats::library_cpu_seconds).
    double lib = r.plan_cpu_s, all = r.plan_cpu_s;
    for (std::size_t i = 0; i < rep.cpu_step_seconds.size(); ++i)
      lib += rep.library_cpu_seconds[i], all += rep.cpu_step_seconds[i];
    library_.push_back(all > 0 ? lib / all : 0.0);
    lib_s_ += lib;
    all_s_ += all;
    hash_.push_back(fmt::format("{:#018x}", rep.stats.plan_hash));
    std::printf(
        "step %3lld  loss %.4f  tokens %5lld  items %3lld  %s  busy max %.3f s (CPU)  imbalance %.2f  "
        "modelled %.3f s  plan %.2f ms  library %.2f%%\n",
        static_cast<long long>(r.step), rep.stats.loss, static_cast<long long>(rep.stats.tokens),
        static_cast<long long>(rep.stats.encoder_items), plan_summary(*r.plan).c_str(), rep.max_cpu_busy(),
        rep.cpu_imbalance(), modelled, r.plan_ms, 100 * library_.back());
    for (const auto& why : rep.stats.reasons) fmt::print("  plan: {}\n", why);  // rings, offloads, splits
    std::fflush(stdout);
    if (!out_.empty() && loss_.size() == 2) {  // the second step: the first one ran in calibration's shadow
      write_file(out_ / "trace.json", hetmesh::train::step_trace(rep).dump());
      write_file(out_ / "timeline_measured.svg",
                 hetmesh::pipeline::svg_timeline(
                     rep.timeline,
                     fmt::format("step {} as measured: wall clock, {} ranks sharing this machine's cores "
                                 "(busy max {:.3f} s wall, {:.3f} s CPU)",
                                 r.step, rep.busy_seconds.size(), rep.max_busy(), rep.max_cpu_busy())));
      write_file(out_ / "timeline_modelled.svg",
                 hetmesh::pipeline::svg_timeline(
                     sim, fmt::format("step {} as modelled: costs fitted to step 0's CPU times ({:.3f} s)",
                                      r.step, modelled)));
    }
  }

  /// The library's share of all steps' thread CPU time (planning + run(), every rank).
  [[nodiscard]] double library_share() const noexcept { return all_s_ > 0 ? lib_s_ / all_s_ : 0.0; }

  void finish() const {
    if (root_ && !library_.empty())
      std::printf(
          "library overhead: %.2f%% of the steps' thread CPU time over all ranks (planning, dispatch "
          "and bookkeeping; the stage and encoder calls, the bytes on the wire and the optimizer "
          "excluded)\n",
          100 * library_share());
    if (!root_ || out_.empty()) return;
    write_file(out_ / "loss.svg",
               svg_plot({{"loss", loss_}, {"busy max (s)", max_busy_}, {"modelled (s)", modelled_}},
                        "example_mllm_train: loss and step time per step"));
  }

  void write_report(const std::filesystem::path& path, const nlohmann::json& config) const {
    write_file(path, nlohmann::json{{"config", config},
                                    {"loss", loss_},
                                    {"tokens", tokens_},
                                    {"busy_s", busy_},
                                    {"modelled_step_s", modelled_},
                                    {"plan_ms", plan_ms_},
                                    {"library_share", library_},
                                    {"library_overhead_share", library_share()},
                                    {"plan_hash", hash_}}
                         .dump(1));
  }

 private:
  std::filesystem::path out_;
  bool root_;
  cost_fit fit_;
  std::vector<double> loss_, max_busy_, modelled_, plan_ms_, library_;
  double lib_s_ = 0, all_s_ = 0;
  std::vector<std::int64_t> tokens_;
  std::vector<std::vector<double>> busy_;
  std::vector<std::string> hash_;
};

run_log::run_log(std::filesystem::path out, bool root) : p_(std::make_unique<impl>(std::move(out), root)) {}
run_log::~run_log() = default;
void run_log::step(const step_result& r) { p_->step(r); }
double run_log::library_share() const noexcept { return p_->library_share(); }
void run_log::finish() const { p_->finish(); }
void run_log::write_report(const std::filesystem::path& path, const options& o) const {
  p_->write_report(path, config_json(o));
}

}  // namespace mllm
