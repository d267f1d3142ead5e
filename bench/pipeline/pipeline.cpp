// SPDX-License-Identifier: Apache-2.0
// Benchmarks of the pipeline room, side by side in one run:
//  1. schedule generation + verification at pp=64, 1,024 micro-batches, 4 virtual stages (measured),
//     against a lower bound that only copies the same number of actions;
//  2. simulator throughput in events per second (measured);
//  3. simulated step time of the joint encoder-LLM pipeline against encoder-on-first-stage and a
//     separate encoder pool, for image:text mixes 1:9 .. 9:1 (MODELLED: simulator numbers, not a
//     training run), plus the perfect-balance lower bound; an SVG plot is written beside the JSON.
// Usage: bench_pipeline [--out FILE] [--svg FILE] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/core/random.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/simulate.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh_tools/args.hpp>
#include <hetmesh_tools/schedule_names.hpp>  // names -> schedules: the tools' mapping

using namespace hetmesh::pipeline;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct gen_result {
  std::string name;
  std::size_t actions = 0, lowered_actions = 0;
  double generate_ms = 0, verify_ms = 0, total_ms = 0, lower_ms = 0, verify_lowered_ms = 0, copy_ms = 0;
  double total_cpu_ms = 0;  // process CPU time of generate + verify (less sensitive to a loaded machine)
};

gen_result bench_generation(const std::string& name, int pp, int m, int v, int reps) {
  gen_result r{.name = name};
  std::vector<double> gen, ver, tot, low, verl, copy, cpu;
  for (int i = 0; i < reps; ++i) {
    const std::clock_t c0 = std::clock();
    auto t0 = clock_type::now();
    const schedule s = hetmesh::tools::make_schedule(name, pp, m, v);
    const double g = seconds_since(t0);
    t0 = clock_type::now();
    const auto rep = verify(s);
    const double vt = seconds_since(t0);
    cpu.push_back(static_cast<double>(std::clock() - c0) * 1e3 / CLOCKS_PER_SEC);
    gen.push_back(g * 1e3);
    ver.push_back(vt * 1e3);
    tot.push_back((g + vt) * 1e3);
    t0 = clock_type::now();
    const schedule l = add_send_recv(s);
    low.push_back(seconds_since(t0) * 1e3);
    t0 = clock_type::now();
    const auto lrep = verify(l);
    verl.push_back(seconds_since(t0) * 1e3);
    // Lower bound: copying the same actions into fresh per-rank vectors.
    t0 = clock_type::now();
    std::vector<std::vector<action>> copy_of(s.ranks.size());
    for (std::size_t k = 0; k < s.ranks.size(); ++k) {
      copy_of[k].resize(s.ranks[k].size());
      std::memcpy(copy_of[k].data(), s.ranks[k].data(), s.ranks[k].size() * sizeof(action));
    }
    copy.push_back(seconds_since(t0) * 1e3);
    std::size_t copied = 0;
    for (const auto& row : copy_of) copied += row.size();
    if (copied != rep.actions) fmt::print(stderr, "copy mismatch\n");
    r.actions = rep.actions;
    r.lowered_actions = lrep.actions;
  }
  r.generate_ms = median(gen);
  r.verify_ms = median(ver);
  r.total_ms = median(tot);
  r.lower_ms = median(low);
  r.verify_lowered_ms = median(verl);
  r.copy_ms = median(copy);
  r.total_cpu_ms = median(cpu);
  return r;
}

struct mix_point {
  int image = 0, text = 0;
  double joint = 0, first = 0, pool = 0, pool_gpu_normalised = 0, lower_bound = 0;
};

// Modelled workload (loosely Workload A of MegaScale-Omni: ViT-1B encoder, 12B LLM): each micro-batch
// carries the same token budget; an LLM stage costs 1 (forward) / 2 (backward) per micro-batch; the
// encoder's whole-model forward on a micro-batch costs ratio * image_fraction * (pp * LLM stage forward)
// with ratio 0.33 (four patches per merged image token, a 12x smaller model); its backward twice that.
// Image fractions vary per micro-batch around the mix (seeded), so encoder loads differ by micro-batch.
std::vector<mix_point> bench_joint(int pp, int m, std::vector<int> ratios, int pool_ranks) {
  std::vector<mix_point> out;
  const schedule llm = one_f_one_b{}.generate(pp, m);
  const auto costs = uniform_costs{.forward = 1.0, .backward = 2.0, .transfer = 0.02}.model();
  for (int img : ratios) {
    const double f = img / 10.0;
    hetmesh::rng g(1234 + static_cast<std::uint64_t>(img));
    std::vector<double> frac(static_cast<std::size_t>(m));
    for (auto& x : frac) x = std::clamp(f + 0.3 * (g.unit() - 0.5), 0.0, 1.0);
    const double ratio = 0.33;
    encoder_work w;
    w.forward = [&, ratio](int mb) { return ratio * frac[static_cast<std::size_t>(mb)] * pp * 1.0; };
    w.backward = [&, ratio](int mb) { return 2 * ratio * frac[static_cast<std::size_t>(mb)] * pp * 1.0; };
    w.transfer = [&](int mb) { return 0.02 * frac[static_cast<std::size_t>(mb)] * pp; };
    mix_point p{.image = img, .text = 10 - img};
    auto run = [&](const auto& pol) {  // each placement is a type
      const schedule s = add_encoder(llm, pol, costs, w);
      (void)verify(s);
      return simulate(s, with_encoder(costs, w, s.num_encoder_shards()), false).step_time;
    };
    p.joint = run(colocated_encoder{.lookahead = 2});
    p.first = run(encoder_on_first_stage{});
    p.pool = run(encoder_pool{.ranks = pool_ranks});
    p.pool_gpu_normalised = p.pool * (pp + pool_ranks) / pp;
    double work = 0;
    for (int mb = 0; mb < m; ++mb) work += 3.0 * pp + w.forward(mb) + w.backward(mb);
    p.lower_bound = work / pp;
    out.push_back(p);
  }
  return out;
}

std::string svg_plot(const std::vector<mix_point>& pts, int pp, int m) {
  const double W = 720, H = 440, L = 70, R = 170, T = 40, B = 60;
  double ymax = 0;
  for (const auto& p : pts) ymax = std::max({ymax, p.first, p.pool, p.joint, p.lower_bound});
  ymax *= 1.1;
  auto X = [&](int img) { return L + (W - L - R) * (img - 1) / 8.0; };
  auto Y = [&](double v) { return T + (H - T - B) * (1 - v / ymax); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"14\">MODELLED step time (simulator), pp={}, {} micro-batches, "
      "1F1B</text>\n",
      W, H, L, pp, m);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", L, H - B, W - R);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", L, T, H - B);
  for (int i = 0; i <= 5; ++i) {
    const double v = ymax * i / 5;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0f}</text>\n", L - 6, Y(v) + 4, v);
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", L, Y(v),
                     W - R, Y(v));
  }
  for (const auto& p : pts)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}:{}</text>\n", X(p.image),
                     H - B + 18, p.image, p.text);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">image:text mix</text>\n", (L + W - R) / 2,
                   H - 15);
  s += fmt::format(
      "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">step time (LLM-stage "
      "forward units)</text>\n",
      (T + H - B) / 2, (T + H - B) / 2);
  struct series {
    const char* label;
    const char* color;
    double mix_point::*field;
    const char* dash;
  };
  const series all[] = {{"encoder on first stage", "#d62728", &mix_point::first, ""},
                        {"encoder pool (+1 rank)", "#ff7f0e", &mix_point::pool, ""},
                        {"joint (colocated)", "#1f77b4", &mix_point::joint, ""},
                        {"lower bound", "#7f7f7f", &mix_point::lower_bound, " stroke-dasharray=\"5,4\""}};
  int k = 0;
  for (const auto& se : all) {
    std::string path;
    for (const auto& p : pts)
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", X(p.image), Y(p.*se.field));
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>\n", se.color,
                     se.dash, path);
    for (const auto& p : pts)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", X(p.image),
                       Y(p.*se.field), se.color);
    const double ly = T + 20 + 20 * k++;
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>\n",
                     W - R + 10, ly, W - R + 30, ly, se.color, se.dash);
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 35, ly + 4, se.label);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "bench/results/pipeline_schedules.json";
  std::string svg;
  int reps = 7;
  if (!hetmesh::tools::parse_command_line(argc, argv, "bench_pipeline",
                                          {{"--out", "FILE", "the JSON results", &out},
                                           {"--svg", "FILE", "the joint schedule's picture", &svg},
                                           {"--reps", "N", "runs per measurement", &reps, 1}},
                                          "usage: bench_pipeline [--out FILE] [--svg FILE] [--reps N]"))
    return 2;
  if (svg.empty()) svg = (std::filesystem::path(out).parent_path() / "pipeline_joint.svg").string();
  const std::string machine = "2-core x86_64 CPU, no GPU (shared with other builds while measuring)";

  // 1. generation + verification
  fmt::print("Generation + verification, pp=64, M=1024 (measured; medians of {} runs, ms)\n", reps);
  fmt::print("{:<26} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>12} {:>10}\n", "schedule", "actions", "generate",
             "verify", "gen+verif", "(cpu)", "lower", "verify-low", "copy (LB)");
  std::vector<gen_result> gens;
  gens.push_back(bench_generation("interleaved-1f1b", 64, 1024, 4, reps));
  gens.push_back(bench_generation("interleaved-zero-bubble", 64, 1024, 4, reps));
  gens.push_back(bench_generation("zbv", 64, 1024, 0, reps));
  gens.push_back(bench_generation("1f1b", 64, 1024, 0, reps));
  for (const auto& g : gens)
    fmt::print("{:<26} {:>9} {:>9.2f} {:>9.2f} {:>10.2f} {:>9.2f} {:>9.2f} {:>12.2f} {:>10.3f}\n", g.name,
               g.actions, g.generate_ms, g.verify_ms, g.total_ms, g.total_cpu_ms, g.lower_ms,
               g.verify_lowered_ms, g.copy_ms);

  // 2. simulator throughput
  const schedule big = interleaved_1f1b{.virtual_stages = 4}.generate(64, 1024);
  const auto costs = uniform_costs{.forward = 0.25, .backward = 0.5, .transfer = 0.01}.model();
  std::vector<double> sim_s;
  std::size_t events = 0;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    const auto r = simulate(big, costs, false);
    sim_s.push_back(seconds_since(t0));
    events = r.events;
  }
  const double sim_med = median(sim_s);
  fmt::print(
      "\nSimulator (measured): interleaved-1f1b pp=64 M=1024 v=4, {} actions, {} events, {:.2f} ms median, "
      "{:.3g} events/s\n",
      big.size(), events, sim_med * 1e3, static_cast<double>(events) / sim_med);

  // 3. joint vs baselines (modelled)
  const int pp = 8, m = 32, pool_ranks = 1;
  const auto pts = bench_joint(pp, m, {1, 2, 3, 4, 5, 6, 7, 8, 9}, pool_ranks);
  fmt::print("\nJoint encoder-LLM pipeline, MODELLED step time (simulator units), pp={}, M={}, 1F1B\n", pp,
             m);
  fmt::print("{:>7} {:>10} {:>12} {:>10} {:>14} {:>11} {:>14}\n", "img:txt", "joint", "first-stage",
             "pool(+1)", "pool GPU-norm", "lower bnd", "first/joint");
  for (const auto& p : pts)
    fmt::print("{:>5}:{} {:>10.2f} {:>12.2f} {:>10.2f} {:>14.2f} {:>11.2f} {:>13.2f}x\n", p.image, p.text,
               p.joint, p.first, p.pool, p.pool_gpu_normalised, p.lower_bound, p.first / p.joint);

  nlohmann::json j;
  j["machine"] = machine;
  j["generation"] = nlohmann::json::array();
  for (const auto& g : gens)
    j["generation"].push_back(
        {{"schedule", g.name},
         {"pp", 64},
         {"microbatches", 1024},
         {"virtual_stages", g.name.starts_with("interleaved") ? 4 : (g.name == "zbv" ? 2 : 1)},
         {"actions", g.actions},
         {"lowered_actions", g.lowered_actions},
         {"generate_ms_median", g.generate_ms},
         {"verify_ms_median", g.verify_ms},
         {"generate_plus_verify_ms_median", g.total_ms},
         {"generate_plus_verify_cpu_ms_median", g.total_cpu_ms},
         {"lower_send_recv_ms_median", g.lower_ms},
         {"verify_lowered_rendezvous_ms_median", g.verify_lowered_ms},
         {"lower_bound_copy_ms_median", g.copy_ms},
         {"target_ms", 50},
         {"measured", true}});
  j["simulator"] = {{"schedule", "interleaved-1f1b"},
                    {"pp", 64},
                    {"microbatches", 1024},
                    {"virtual_stages", 4},
                    {"actions", big.size()},
                    {"events", events},
                    {"ms_median", sim_med * 1e3},
                    {"events_per_second", static_cast<double>(events) / sim_med},
                    {"measured", true}};
  nlohmann::json mix = nlohmann::json::array();
  for (const auto& p : pts)
    mix.push_back({{"image", p.image},
                   {"text", p.text},
                   {"joint_colocated", p.joint},
                   {"encoder_on_first_stage", p.first},
                   {"encoder_pool_plus_one_rank", p.pool},
                   {"encoder_pool_gpu_normalised", p.pool_gpu_normalised},
                   {"lower_bound_perfect_balance", p.lower_bound},
                   {"speedup_joint_vs_first_stage", p.first / p.joint}});
  j["joint_pipeline"] = {
      {"modelled", true},
      {"note", "simulated step times in LLM-stage-forward units; not a measurement of training"},
      {"pp", pp},
      {"microbatches", m},
      {"llm_schedule", "1f1b"},
      {"encoder_to_llm_cost_ratio", 0.33},
      {"pool_ranks", pool_ranks},
      {"points", mix}};
  std::filesystem::create_directories(
      std::filesystem::path(out).parent_path().empty() ? "." : std::filesystem::path(out).parent_path());
  std::ofstream(out) << j.dump(2) << "\n";
  std::ofstream(svg) << svg_plot(pts, pp, m);
  fmt::print("\nwrote {} and {}\n", out, svg);
  return 0;
}
