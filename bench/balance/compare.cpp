// SPDX-License-Identifier: Apache-2.0
// bench_balance_compare: the balancing strategies side by side on the vendored workloads.
//   1. modelled step time, imbalance (max/mean busy) and ratio to the lower bound max(total/N, largest
//      short sequence) for random, token_count, static_dp_cp, bytescale_hdp, gap_filling_hdp (one group) and
//      gap_filling_hdp with locality groups, median over seeds (batches);
//   2. grouped reordering of a multimodal batch: encoder and LLM maxima, no reordering vs LLM-only vs
//      joint, by group size;
//   3. measured planning times on this machine (one core): 16,384 ranks x 4,000 sequences, grouped
//      reordering of 8,192 samples in a 256-rank group, and 1K..100K sequences.
// gap_filling_hdp runs with its improvement pass (ring_search.hpp); gap_filling_hdp_constructive, the
// same planner with the pass off, is priced and timed beside it (rows, columns and JSON keys of that name).
// Step times are MODELLED (cost/ models, ByteScale Fig. 6(a) layer fit); planning times are MEASURED.
// Usage: bench_balance_compare [--workloads DIR] [--out FILE] [--seeds N] [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/balance/balance.hpp>
#include <hetmesh/balance/workload.hpp>
#include <hetmesh_tools/args.hpp>

#include "../support/workloads.hpp"
#include "byted_like.hpp"
#include "exact.hpp"

using namespace hetmesh;
using json = nlohmann::json;

namespace {

/// The packing bound of the Byted-like rows: exact.hpp's search with this many of the largest rings
/// placed as rings (the others join the fluid), at most 3M nodes per batch.
constexpr std::size_t packing_rigid_rings = 9;

const char* machine = "2-core x86_64 CPU, no GPU (shared with other builds); planning single-threaded";

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

/// Median CPU time of this thread running `f`, in milliseconds, over `reps` runs. CPU time rather than
/// wall time: the machine is shared by several builds (load average far above its 2 cores), and the
/// planners are single-threaded, so thread CPU time is what one idle core would take. The median wall
/// time is kept in `last_wall_ms` for the record.
double last_wall_ms = 0.0;
double last_min_ms = 0.0;
double time_ms(int reps, const std::function<void()>& f) {
  std::vector<double> t, w;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    const double c = thread_cpu_ms();
    f();
    t.push_back(thread_cpu_ms() - c);
    w.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  last_wall_ms = median(w);
  last_min_ms = *std::min_element(t.begin(), t.end());
  return median(t);
}

struct text_workload {
  std::string name;
  std::vector<std::int64_t> lengths;  // empty: Byted-like generator
  int ranks;
  std::int64_t capacity;
  int group_size;
};

json run_text(const text_workload& w, int seeds, const std::int64_t batch_tokens) {
  balance::strategy_config cfg;
  cfg.ranks = w.ranks;
  cfg.hdp.capacity = w.capacity;
  // The cluster of the published results (docs/balance.md): 150 GB/s NVLink, 25 GB/s between nodes,
  // stated here rather than taken from mesh::topology's defaults (450 / 50 GB/s) so they reproduce.
  cfg.model.net.intra_bw_gbps = 150.0;
  cfg.model.net.inter_bw_gbps = 25.0;
  std::map<std::string, std::vector<double>> step, imb, ratio, ratio_pack;
  // Byted-like only: the packing bound (exact.hpp with the largest rings placed as rings, the rest a
  // fluid): how the largest rings fit together, which the area bound leaves out.
  const bool packing = w.lengths.empty();
  std::vector<double> lb_pack;
  std::vector<int> pack_proved;
  std::vector<double> plan_bs, plan_hm, plan_hc, nseq, lb_new, lb_old;
  std::vector<std::string> order{
      std::string(balance::random_placement::name), std::string(balance::token_count::name),
      std::string(balance::static_dp_cp::name), std::string(balance::bytescale::name),
      std::string(balance::gap_filling_hdp::name)};
  const std::string grouped = fmt::format("gap_filling_hdp_g{}", w.group_size);
  order.push_back(grouped);
  // The constructive placement alone (the improvement pass off): the planner before the pass.
  const std::string constructive = "gap_filling_hdp_constructive";
  order.push_back(constructive);
  for (int s = 0; s < seeds; ++s) {
    const auto seed = static_cast<std::uint64_t>(1000 + s);
    const auto seqs = w.lengths.empty() ? bench::byted_like_batch(batch_tokens, seed)
                                        : balance::sample_batch(w.lengths, batch_tokens, seed);
    nseq.push_back(static_cast<double>(seqs.size()));
    const auto terms = balance::step_lower_bound_terms(seqs, cfg);
    lb_new.push_back(balance::step_lower_bound(seqs, cfg).units());
    lb_old.push_back(terms.work_only.units());
    auto res = balance::compare_strategies(seqs, cfg, balance::random_placement{.seed = seed},
                                           balance::token_count{}, balance::static_dp_cp{},
                                           balance::bytescale{}, balance::gap_filling_hdp{});
    auto g = balance::run_strategy(balance::gap_filling_hdp{.group_size = w.group_size}, seqs, cfg);
    g.name = grouped;
    res.push_back(g);
    auto c = balance::run_strategy(balance::gap_filling_hdp{.local_search = false}, seqs, cfg);
    c.name = constructive;
    res.push_back(c);
    std::int64_t pack = 0;
    if (packing) {
      const auto ex = bench::exact_optimum(seqs, cfg, 3'000'000, packing_rigid_rings);
      pack = std::max(ex.relaxed_optimum, balance::step_lower_bound(seqs, cfg).ticks);
      lb_pack.push_back(cost::fixed::from_ticks(pack).units());
      pack_proved.push_back(ex.proved ? 1 : 0);
    }
    for (const auto& r : res) {
      step[r.name].push_back(r.step.units());
      imb[r.name].push_back(r.imbalance);
      ratio[r.name].push_back(r.ratio_to_lower_bound);
      if (packing)
        ratio_pack[r.name].push_back(static_cast<double>(r.step.ticks) / static_cast<double>(pack));
    }
    balance::bytescale_policy bp;
    plan_bs.push_back(
        time_ms(3, [&] { (void)balance::plan_bytescale(seqs, cfg.hdp, cfg.ranks, cfg.model, bp); }));
    plan_hm.push_back(
        time_ms(3, [&] { (void)balance::plan_gap_filling_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model); }));
    plan_hc.push_back(time_ms(3, [&] {
      (void)balance::plan_gap_filling_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model, {.local_search = false});
    }));
  }
  json out{{"workload", w.name},
           {"ranks", w.ranks},
           {"capacity_tokens", w.capacity},
           {"batch_tokens_target", batch_tokens},
           {"seeds", seeds},
           {"sequences_median", median(nseq)},
           {"lower_bound_ms_median", median(lb_new)},
           {"work_only_bound_ms_median", median(lb_old)},
           {"model", to_string(cfg.model)}};
  fmt::print(
      "\n{} -- {} ranks, C = {}, ~{}M tokens per batch, {} seeds, ~{:.0f} sequences (step times MODELLED, "
      "ms)\n",
      w.name, w.ranks, w.capacity, batch_tokens >> 20, seeds, median(nseq));
  if (packing) {
    int proved = 0;
    for (int x : pack_proved) proved += x;
    fmt::print(
        "  packing bound (the {} largest rings placed, the rest a fluid; searches finished: {} of {}): "
        "{:.1f} "
        "ms median, {:.4f} x the lower bound\n",
        packing_rigid_rings, proved, pack_proved.size(), median(lb_pack), median(lb_pack) / median(lb_new));
    out["packing_bound_ms_median"] = median(lb_pack);
    out["packing_bound_ms_all"] = lb_pack;
    out["packing_bound_rigid_rings"] = packing_rigid_rings;
    out["packing_bound_searches_finished"] = proved;
  }
  fmt::print("  {:<20} {:>14} {:>11} {:>14}{}\n", "strategy", "step (median)", "imbalance", "step / bound",
             packing ? "  step / packing bound" : "");
  for (const auto& n : order) {
    fmt::print("  {:<20} {:>14.1f} {:>11.3f} {:>14.3f}", n, median(step[n]), median(imb[n]),
               median(ratio[n]));
    if (packing) fmt::print(" {:>22.3f}", median(ratio_pack[n]));
    fmt::print("\n");
    out["strategies"].push_back({{"name", n},
                                 {"modelled_step_ms_median", median(step[n])},
                                 {"imbalance_max_over_mean_median", median(imb[n])},
                                 {"ratio_to_lower_bound_median", median(ratio[n])},
                                 {"ratio_to_lower_bound_all", ratio[n]}});
    if (packing) {
      out["strategies"].back()["ratio_to_packing_bound_median"] = median(ratio_pack[n]);
      out["strategies"].back()["ratio_to_packing_bound_all"] = ratio_pack[n];
    }
  }
  fmt::print(
      "  planning (measured CPU time): bytescale {:.2f} ms, gap_filling_hdp {:.2f} ms (constructive alone "
      "{:.2f} ms) (median)\n",
      median(plan_bs), median(plan_hm), median(plan_hc));
  out["planning_cpu_ms_measured"] = {{"bytescale_hdp", median(plan_bs)},
                                     {"gap_filling_hdp", median(plan_hm)},
                                     {"gap_filling_hdp_constructive", median(plan_hc)}};
  return out;
}

// Multimodal batch: text lengths from `text`, 0..4 images per sample with encoder token counts from
// the recipes in multimodal_tokens.json (LLaVA-1.5: 576; OneVision any-res: 729 per tile, 1..10 tiles;
// Qwen2-VL: 4x its 4..1280 LLM tokens); an image adds its LLM tokens (encoder tokens, or a quarter for
// Qwen2-VL's 2x2 merge) to the sample's LLM length.
std::vector<seq::sample_meta> multimodal_batch(const std::vector<std::int64_t>& text, int samples, int ranks,
                                               std::uint64_t seed) {
  rng g(seed);
  std::vector<seq::sample_meta> out;
  for (int i = 0; i < samples; ++i) {
    seq::sample_meta m;
    m.id = i;
    m.owner = static_cast<int>(g.below(static_cast<std::uint64_t>(ranks)));
    m.tokens = std::min<std::int64_t>(text[static_cast<std::size_t>(g.below(text.size()))], 16384);
    const auto images = g.uniform(0, 4);
    for (std::int64_t k = 0; k < images; ++k) {
      const auto kind = g.below(3);
      std::int64_t enc = 0, llm = 0;
      if (kind == 0) {
        enc = llm = 576;
      } else if (kind == 1) {
        enc = llm = 729 * g.uniform(1, 10);
      } else {
        llm = g.uniform(4, 1280);
        enc = 4 * llm;
      }
      m.item_tokens.push_back(enc);
      m.tokens += llm;
    }
    out.push_back(std::move(m));
  }
  return out;
}

json run_multimodal(const std::vector<std::int64_t>& text, int seeds) {
  constexpr int ranks = 256, samples = 8192;
  const balance::reorder_policy pol;
  fmt::print(
      "\nmultimodal grouped reordering -- {} ranks, {} samples, 0-4 images each (per-phase maxima MODELLED, "
      "ratio to mean; step ~ max encoder + max LLM)\n",
      ranks, samples);
  fmt::print("  {:<22} {:>10} {:>10} {:>14}\n", "strategy", "enc max", "llm max", "step / bound");
  json out{{"ranks", ranks}, {"samples", samples}, {"seeds", seeds}};
  struct row {
    std::string name;
    int group;
    int mode;  // 0 stay, 1 llm-only, 2 joint
  };
  const std::vector<row> rows{{"no reordering", 0, 0},
                              {"llm-only G=256", 256, 1},
                              {"joint G=8", 8, 2},
                              {"joint G=64", 64, 2},
                              {"joint G=256", 256, 2}};
  for (const auto& rw : rows) {
    std::vector<double> em, lm, st;
    for (int s = 0; s < seeds; ++s) {
      const auto batch = multimodal_batch(text, samples, ranks, 77 + static_cast<std::uint64_t>(s));
      std::vector<double> enc(ranks, 0.0), llm(ranks, 0.0);
      if (rw.mode == 0) {
        for (const auto& m : batch) {
          llm[static_cast<std::size_t>(m.owner)] += pol.llm.sequence(m.tokens);
          for (auto t : m.item_tokens) enc[static_cast<std::size_t>(m.owner)] += pol.encoder.item(t);
        }
      } else {
        for (int g0 = 0; g0 < ranks; g0 += rw.group) {
          std::vector<seq::sample_meta> mine;
          for (const auto& m : batch)
            if (m.owner >= g0 && m.owner < g0 + rw.group) {
              mine.push_back(m);
              mine.back().owner -= g0;
            }
          const auto p = balance::plan_grouped_reorder(mine, rw.group, pol);
          for (std::size_t i = 0; i < p.sample_ids.size(); ++i) {
            const auto& m = *std::find_if(mine.begin(), mine.end(),
                                          [&](const auto& x) { return x.id == p.sample_ids[i]; });
            llm[static_cast<std::size_t>(g0 + p.llm_rank[i])] += pol.llm.sequence(m.tokens);
            for (std::size_t k = 0; k < m.item_tokens.size(); ++k) {
              const int r = rw.mode == 1 ? p.llm_rank[i]
                                         : p.encoder_rank[static_cast<std::size_t>(p.item_offset[i]) + k];
              enc[static_cast<std::size_t>(g0 + r)] += pol.encoder.item(m.item_tokens[k]);
            }
          }
        }
      }
      const double me = *std::max_element(enc.begin(), enc.end());
      const double ml = *std::max_element(llm.begin(), llm.end());
      double se = 0, sl = 0;
      for (int r = 0; r < ranks; ++r) {
        se += enc[static_cast<std::size_t>(r)];
        sl += llm[static_cast<std::size_t>(r)];
      }
      em.push_back(me / (se / ranks));
      lm.push_back(ml / (sl / ranks));
      st.push_back((me + ml) / ((se + sl) / ranks));
    }
    fmt::print("  {:<22} {:>10.3f} {:>10.3f} {:>14.3f}\n", rw.name, median(em), median(lm), median(st));
    out["strategies"].push_back({{"name", rw.name},
                                 {"encoder_max_over_mean_median", median(em)},
                                 {"llm_max_over_mean_median", median(lm)},
                                 {"modelled_step_over_bound_median", median(st)}});
  }
  return out;
}

// How much of the Byted-like ratio is the bound: the lower bound before (work / ranks), the bound now
// (step_lower_bound), the exact optimum (exact.hpp) and both balancers, on the Byted-like batch scaled
// down k = 512 / ranks times so that the search can finish: lengths / k (so a sequence's minimum ring,
// length / C, is the same share of the pool), the quadratic coefficient x k and the KV bytes per token
// x k (a ring's per-rank compute and KV traffic stay those of the full-size ring; per-hop latency x k),
// one device per node (every ring crosses nodes, as the full-size rings of >= 64 ranks do). Short
// sequences keep their share of the work per rank (k times as many, each 1/k of the work).
balance::strategy_config scaled_config(int k) {
  balance::strategy_config cfg;
  cfg.ranks = 512 / k;
  cfg.hdp.capacity = 8192;
  cfg.model.net.intra_bw_gbps = 150.0;
  cfg.model.net.inter_bw_gbps = 25.0;
  cfg.model.net.devices_per_node = 1;
  cfg.model.net.nodes = cfg.ranks;
  cfg.model.net.inter_latency_us *= k;
  cfg.model.llm.layer.a *= k;
  cfg.model.kv_bytes_per_token *= k;
  return cfg;
}

json run_exact(int seeds, bool quick) {
  const std::vector<int> ks = quick ? std::vector<int>{64} : std::vector<int>{64, 32};
  fmt::print(
      "\nexact optimum, Byted-like scaled down (step / bound, MODELLED; exact: branch and bound, short "
      "sequences as a fluid (LB) and placed whole (UB))\n");
  fmt::print("  {:>5} {:>4} {:>5} {:>6} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>6}\n", "ranks",
             "seed", "long", "proved", "old LB", "new LB", "exact LB", "exact UB", "bytescale", "gf constr",
             "gap_fill", "search");
  json out = json::array();
  for (int k : ks) {
    const auto cfg = scaled_config(k);
    for (int s = 0; s < seeds; ++s) {
      auto seqs = bench::byted_like_batch(32LL << 20, static_cast<std::uint64_t>(1000 + s));
      for (auto& q : seqs) q.length = std::max<std::int64_t>(1, q.length / k);
      const auto terms = balance::step_lower_bound_terms(seqs, cfg);
      const auto lb = balance::step_lower_bound(seqs, cfg);
      const auto bs = balance::run_strategy(balance::bytescale{}, seqs, cfg);
      const auto gf = balance::run_strategy(balance::gap_filling_hdp{}, seqs, cfg);
      const auto gc = balance::run_strategy(balance::gap_filling_hdp{.local_search = false}, seqs, cfg);
      const auto a = std::chrono::steady_clock::now();
      const auto ex = bench::exact_optimum(seqs, cfg, quick ? 200'000 : 3'000'000);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      // Everything over the exact optimum's lower end (the relaxed optimum).
      const double opt = static_cast<double>(ex.relaxed_optimum);
      // The best feasible step known: the search's own, or a balancer's (both are plans of the model).
      const auto known = std::min({ex.feasible, bs.step.ticks, gf.step.ticks});
      auto r = [&](double ticks) { return ticks / opt; };
      fmt::print(
          "  {:>5} {:>4} {:>5} {:>6} | {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} | {:>9.3f} {:>9.3f} {:>9.3f} | "
          "{:>5.1f}s\n",
          cfg.ranks, s, ex.long_tasks, ex.proved ? "yes" : "no",
          r(static_cast<double>(terms.work_only.ticks)), r(static_cast<double>(lb.ticks)), 1.0,
          r(static_cast<double>(ex.feasible)), r(static_cast<double>(bs.step.ticks)),
          r(static_cast<double>(gc.step.ticks)), r(static_cast<double>(gf.step.ticks)), sec);
      out.push_back({{"ranks", cfg.ranks},
                     {"scale_down", k},
                     {"seed", 1000 + s},
                     {"sequences", seqs.size()},
                     {"long_sequences", ex.long_tasks},
                     {"search_finished", ex.proved},
                     {"search_nodes", ex.nodes},
                     {"search_seconds", sec},
                     {"optimum_within", {1.0, r(static_cast<double>(known))}},
                     {"model_ticks",
                      {{"old_bound_work_over_ranks", terms.work_only.ticks},
                       {"new_bound", lb.ticks},
                       {"new_bound_area", terms.area.ticks},
                       {"new_bound_longest", terms.longest.ticks},
                       {"new_bound_chain", terms.chain.ticks},
                       {"exact_relaxed_optimum_lower", ex.relaxed_optimum},
                       {"exact_feasible_upper", ex.feasible},
                       {"best_known_feasible", known},
                       {"bytescale_hdp", bs.step.ticks},
                       {"gap_filling_hdp", gf.step.ticks},
                       {"gap_filling_hdp_constructive", gc.step.ticks}}},
                     {"over_exact_relaxed_optimum",
                      {{"old_bound", r(static_cast<double>(terms.work_only.ticks))},
                       {"new_bound", r(static_cast<double>(lb.ticks))},
                       {"exact_feasible_upper", r(static_cast<double>(ex.feasible))},
                       {"bytescale_hdp", r(static_cast<double>(bs.step.ticks))},
                       {"gap_filling_hdp", r(static_cast<double>(gf.step.ticks))},
                       {"gap_filling_hdp_constructive", r(static_cast<double>(gc.step.ticks))}}}});
    }
  }
  return out;
}

json run_planning(const std::vector<std::int64_t>& text, bool quick) {
  json out;
  fmt::print("\nplanning time (MEASURED on {}):\n", machine);
  // 16,384 ranks x 4,000 Byted-like sequences.
  auto seqs = bench::byted_like_batch(40'000'000, 42);
  seqs.resize(4000);
  const seq::hdp_policy hdp{.capacity = 8192};
  const balance::step_model m;
  const int reps = quick ? 3 : 15;
  const double hm = time_ms(reps, [&] { (void)balance::plan_gap_filling_hdp(seqs, hdp, 16384, m); });
  const double hm_wall = last_wall_ms;
  const double hm_min = last_min_ms;
  const double hc = time_ms(
      reps, [&] { (void)balance::plan_gap_filling_hdp(seqs, hdp, 16384, m, {.local_search = false}); });
  const double bs = time_ms(reps, [&] { (void)balance::plan_bytescale(seqs, hdp, 16384, m); });
  fmt::print(
      "  16384 ranks x 4000 sequences: gap_filling_hdp {:.2f} ms (constructive alone {:.2f}), bytescale "
      "{:.2f} ms CPU (target < 20 ms; gap_filling_hdp wall {:.2f} ms)\n",
      hm, hc, bs, hm_wall);
  out["ranks16384_seqs4000_ms"] = {
      {"gap_filling_hdp_cpu_median", hm},       {"gap_filling_hdp_cpu_min", hm_min},
      {"gap_filling_hdp_wall_median", hm_wall}, {"gap_filling_hdp_constructive_cpu_median", hc},
      {"bytescale_hdp_cpu_median", bs},         {"target_ms", 20}};
  // Grouped reordering: 8,192 samples in a 256-rank group.
  const auto batch = multimodal_batch(text, 8192, 256, 5);
  const double gr = time_ms(quick ? 5 : 41, [&] { (void)balance::plan_grouped_reorder(batch, 256); });
  fmt::print(
      "  grouped reordering, 8192 samples in a 256-rank group: {:.2f} ms CPU median, {:.2f} min (target < 5 "
      "ms; "
      "wall {:.2f} ms)\n",
      gr, last_min_ms, last_wall_ms);
  out["grouped_reorder_8192_in_256_ms"] = {
      {"cpu_median", gr}, {"cpu_min", last_min_ms}, {"wall_median", last_wall_ms}, {"target_ms", 5}};
  // Scaling 1K .. 100K sequences (2,048 ranks, Byted-like).
  fmt::print("  {:>8} {:>16} {:>13} {:>12} {:>24}   (CPU ms)\n", "seqs", "gap_filling_hdp", "constructive",
             "bytescale", "gap_filling ns/(n lg n)");
  for (int n : {1000, 3000, 10000, 30000, 100000}) {
    if (quick && n > 10000) break;
    auto b = bench::byted_like_batch(static_cast<std::int64_t>(n) * 12000, 7 + static_cast<std::uint64_t>(n));
    b.resize(static_cast<std::size_t>(std::min<std::size_t>(b.size(), static_cast<std::size_t>(n))));
    const int r = n >= 30000 ? 3 : 7;
    const double th = time_ms(r, [&] { (void)balance::plan_gap_filling_hdp(b, hdp, 2048, m); });
    const double tc =
        time_ms(r, [&] { (void)balance::plan_gap_filling_hdp(b, hdp, 2048, m, {.local_search = false}); });
    const double tb = time_ms(r, [&] { (void)balance::plan_bytescale(b, hdp, 2048, m); });
    const double per = th * 1e6 / (static_cast<double>(n) * std::log2(static_cast<double>(n)));
    fmt::print("  {:>8} {:>16.2f} {:>13.2f} {:>12.2f} {:>24.1f}\n", n, th, tc, tb, per);
    out["scaling_2048_ranks"].push_back({{"sequences", n},
                                         {"gap_filling_hdp_ms", th},
                                         {"gap_filling_hdp_constructive_ms", tc},
                                         {"bytescale_hdp_ms", tb},
                                         {"gap_filling_hdp_ns_per_n_log2_n", per}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string given;  // --workloads DIR; default: the vendored tests/data/workloads
  std::string out_file = "bench/results/balance_compare.json";
  int seeds = 5;
  bool quick = false;
  if (!hetmesh::tools::parse_command_line(
          argc, argv, "bench_balance_compare",
          {{"--workloads", "DIR", "the workload data", &given},
           {"--out", "FILE", "the JSON results", &out_file},
           {"--seeds", "N", "seeds per workload", &seeds, 1},
           {"--quick", "", "one seed", &quick}},
          "usage: bench_balance_compare [--workloads DIR] [--out FILE] [--seeds N] [--quick]"))
    return 2;
  if (quick) seeds = 1;
  try {
    const auto dir = bench::workloads_dir(
        given, {"prolong_doc_lengths.txt", "azure_2023_conv.csv", "azure_2023_code.csv"});
    const auto prolong = balance::read_lengths(dir / "prolong_doc_lengths.txt");
    const auto conv = bench::read_azure_csv(dir / "azure_2023_conv.csv");
    const auto code = bench::read_azure_csv(dir / "azure_2023_code.csv");
    json j{{"benchmark", "bench_balance_compare"},
           {"machine", machine},
           {"note",
            "step times are MODELLED by hetmesh::cost (ByteScale Fig. 6(a) layer fit, 32 layers, x3 for "
            "training, alpha-beta ring communication); planning times are MEASURED"},
           {"workloads_dir", bench::project_relative(dir)},
           {"lower_bound",
            "balance::step_lower_bound (modelled): the largest of (1) area: short sequences' work (without "
            "the per-row constant) plus, per sequence longer than C, the least D x ring_time(s, D) over the "
            "ring sizes it may use (D from its minimum under the capacity rule, seq::solve_offload, to the "
            "pool), over the ranks; (2) the longest task: the largest short sequence's pack time and every "
            "long sequence's ring time at its best allowed D; (3) the chain: sequences whose minimum ring is "
            "over half the pool run one after another; divided by pp_stages. Binds every plan that packs "
            "short sequences whole and gives each long one a ring of its own (the HDP strategies); static "
            "dp x cp shares rings and is only compared against it. ratio_to_lower_bound divides by it; "
            "work_only_bound_ms_median is the bound before (total work / ranks, longest task at any D)"},
           {"packing_bound",
            "Byted-like rows only (packing_bound_ms_*, ratio_to_packing_bound_*; modelled): a tighter lower "
            "bound, the largest of step_lower_bound and the branch and bound of bench/balance/exact.hpp with "
            "the packing_bound_rigid_rings longest sequences placed as rings (every order, every "
            "Pareto-optimal ring size) and every other ring and short sequence as a divisible fluid at its "
            "least rank-time; it sees that the largest rings cannot all run side by side"}};
    const std::int64_t batch = quick ? (8LL << 20) : (32LL << 20);
    const std::vector<text_workload> text{{"prolong", prolong, 256, 16384, 64},
                                          {"azure_conv", conv, 256, 16384, 64},
                                          {"azure_code", code, 256, 16384, 64},
                                          {"byted_like (synthetic)", {}, 512, 8192, 256}};
    for (const auto& w : text) j["text"].push_back(run_text(w, seeds, batch));
    j["exact_small_instances"] = run_exact(quick ? 1 : 3, quick);
    j["multimodal"] = run_multimodal(prolong, quick ? 1 : 3);
    j["planning"] = run_planning(prolong, quick);
    const std::filesystem::path op(out_file);
    if (op.has_parent_path()) std::filesystem::create_directories(op.parent_path());
    std::ofstream(op) << j.dump(2) << "\n";
    fmt::print("\nwrote {}\n", op.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_balance_compare: {}\n", e.what());
    return 1;
  }
  return 0;
}
