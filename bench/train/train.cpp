// SPDX-License-Identifier: Apache-2.0
// bench_train: measured against modelled training steps. The example's backbone (examples/mllm_train,
// text only, pp = 1) trains the same skewed long-context batches (ProLong document lengths / 64, clamped
// to [16, 1024], ~8K tokens per step) over 8 loopback ranks under three strategies: static DP x CP
// (seq::cp_zigzag, cp = ceil(1024 / C) as hetmesh-plan's static_dp_cp sizes cp for the longest
// context), ByteScale's HDP with its balance scheduler (balance::bytescale) and the project's balancer
// (balance::gap_filling_hdp), both seq::hdp<no_offload>{.capacity = C}.
//
// Measured: each rank's thread CPU busy time in the backbone's calls (ranks share the machine's cores, so
// wall time would measure the scheduler; CPU time is each rank's own work). Each batch runs `repeats`
// times, the repeats interleaving the strategies; per rank the least of its busy times over the repeats
// (other processes' cache pressure inflates CPU time too; the least is the least disturbed run); the
// measured step of a batch is the largest rank's; the plain mean over repeats is written beside it.
// Modelled: the cost model is calibrated first, on this machine and under the same load (8 ranks, each
// its own documents of one length, forward + backward through the same train::system; T(s) = a s^2 + b s
// + c by cost::fit_quadratic: attention quadratic, projections and MLP linear, per-call overhead
// constant; then the same documents over rings of 2 and 4 ranks give the ring's per-step overhead,
// balance::step_model::ring_step_overhead). The very plan the system ran is then priced by the balance
// room's step model (a pack pays sum (a l^2 + b l) + c, a ring of degree D over a document pays
// (a l^2 + b l) / D + c + D x overhead on each member, KV hops free: loopback) and simulated
// (balance::simulate); the modelled step is the largest modelled per-rank busy time, what is measured.
// The balancers plan with the same calibrated model (system_options::cost).
//
//   bench_train [--out FILE] [--batches N] [--repeats N] [--capacity C] [--tokens T] [--seed S]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/balance/hdp_common.hpp>
#include <hetmesh/balance/model.hpp>
#include <hetmesh/balance/workload.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/cpu_time.hpp>
#include <hetmesh/cost/calibrate.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>
#include <hetmesh_tools/args.hpp>

#include "../support/json_file.hpp"
#include "../support/workloads.hpp"
#include "mllm_train/backbone.hpp"

using namespace hetmesh;
using json = nlohmann::json;

namespace {

constexpr int kRanks = 8;
constexpr std::int64_t kScale = 64, kMin = 16, kMax = 1024;
using comm_t = comm::loopback::communicator;

/// A batch of documents drawn from `lengths` (already scaled) until `tokens` tokens; ids 0.., token ids
/// arbitrary in the vocabulary.
model::step_batch draw_batch(const std::vector<std::int64_t>& lengths, std::int64_t tokens,
                             std::int64_t vocab, std::mt19937_64& rng) {
  model::step_batch b;
  std::uniform_int_distribution<std::size_t> pick(0, lengths.size() - 1);
  std::uniform_int_distribution<std::int64_t> tok(0, vocab - 1);
  std::int64_t total = 0;
  while (total < tokens) {
    const auto l = std::min(lengths[pick(rng)], tokens - total < kMin ? kMin : tokens - total);
    model::document d;
    d.id = static_cast<std::int64_t>(b.documents.size());
    for (std::int64_t t = 0; t < l; ++t) d.tokens.push_back(tok(rng));
    total += l;
    b.documents.push_back(std::move(d));
  }
  return b;
}

/// One document of `length` tokens.
model::step_batch one_document(std::int64_t length, std::int64_t vocab, std::int64_t id = 0) {
  model::step_batch b;
  model::document d;
  d.id = id;
  for (std::int64_t t = 0; t < length; ++t) d.tokens.push_back((t * 7 + 3) % vocab);
  b.documents.push_back(std::move(d));
  return b;
}

/// Thread CPU seconds of one single-rank training step of `batch` (backbone forward + backward, packed).
double single_rank_seconds(const mllm::config& mc, const model::step_batch& batch, int repeats) {
  double best = 1e300;
  comm::loopback::run(1, [&](comm_t& c) {
    train::system<seq::cp_thd, model::reference_attention, comm_t> one({.cp = 1, .pad = true}, c);
    const auto plan = one.plan(batch);
    mllm::backbone<float> m(mc, 7, plan.pipeline.num_stages, one.local_stages(plan));
    for (int r = 0; r < repeats; ++r) {
      const auto st = one.run(plan, batch, m, train::sgd<float>{0.0F});
      best = std::min(best, st.cpu_busy_seconds);
    }
  });
  return best;
}

/// Per-document thread CPU seconds under kRanks concurrent ranks: `per_rank` documents of `length` on
/// every ring of `degree` ranks (static CP zigzag, each document its own micro-batch), the mean over
/// ranks of busy time / per_rank, the fastest of `repeats`.
double concurrent_seconds(const mllm::config& mc, std::int64_t length, int degree, int per_rank,
                          int repeats) {
  model::step_batch batch;
  for (int i = 0; i < per_rank * kRanks / degree; ++i)
    batch.documents.push_back(one_document(length, mc.vocab, i).documents[0]);
  double best = 1e300;
  comm::loopback::run(kRanks, [&](comm_t& c) {
    train::system<seq::cp_zigzag, model::reference_attention, comm_t> sys({.cp = degree, .pad = true}, c);
    const auto plan = sys.plan(batch);
    mllm::backbone<float> m(mc, 7, plan.pipeline.num_stages, sys.local_stages(plan));
    for (int r = 0; r < repeats; ++r) {
      const auto st = sys.run(plan, batch, m, train::sgd<float>{0.0F});
      const auto rep = train::gather_report(c, st);
      double sum = 0;
      for (auto x : rep.cpu_busy_seconds) sum += x;
      if (c.rank() == 0) best = std::min(best, sum / kRanks / per_rank);
    }
  });
  return best;
}

/// The balance room's price of `plan`: its rings (static CP) or items (HDP) as tasks, simulated. Returns
/// the simulator's timeline (model units: ms).
balance::timeline price(const train::step_plan<train::hdp_part>& plan, const balance::step_model& m) {
  return balance::simulate(plan.world, balance::tasks_of(plan.partition.hdp, m), 1);
}
balance::timeline price(const train::step_plan<train::static_cp_part>& plan, const balance::step_model& m) {
  std::vector<balance::task> tasks;
  for (std::size_t k = 0; k < plan.partition.pieces.size(); ++k) {
    const auto& piece = plan.partition.pieces[k];
    std::vector<std::int64_t> lens;
    for (auto id : piece.doc_ids)
      for (const auto& d : plan.documents)
        if (d.id == id) lens.push_back(d.length);
    const auto& ring = plan.rings[k].ring;  // a ring per piece, in piece order
    tasks.push_back({ring, static_cast<std::int64_t>(k), m.ring_row_time(lens, plan.partition.cp, false)});
  }
  return balance::simulate(plan.world, tasks, 1);
}

/// Thread CPU seconds of a step summed over ranks, by where they went (the library's overhead).
struct cpu_split {
  double plan = 0;     // sys.plan()
  double library = 0;  // in run(), outside the stage calls, the bytes on the wire and the optimizer
  double user = 0;     // the stage calls (the backbone's compute)
  double comm = 0;     // moving bytes: pipeline transfers, barrier, reductions
  double step = 0;     // plan() + run()
  /// (planning + the library's part of run()) / (plan() + run()).
  [[nodiscard]] double library_share() const { return step > 0 ? (plan + library) / step : 0.0; }
};

struct measured_batch {
  std::vector<std::vector<double>> runs;  // per repeat, per rank: thread CPU busy seconds
  std::vector<cpu_split> splits;          // per repeat
  std::vector<double> modelled_busy;      // per rank, seconds
  double modelled = 0, modelled_with_waits = 0, modelled_imbalance = 0;
  std::int64_t micro_batches = 0, rings = 0;

  /// Per rank, its least busy time over the repeats: the run least disturbed by whatever else shares the
  /// cores (other processes' cache pressure inflates thread CPU time too).
  [[nodiscard]] std::vector<double> busy() const {
    std::vector<double> out(runs.front());
    for (const auto& r : runs)
      for (std::size_t q = 0; q < out.size(); ++q) out[q] = std::min(out[q], r[q]);
    return out;
  }
  /// The measured step: the largest per-rank busy time.
  [[nodiscard]] double step() const {
    const auto b = busy();
    return *std::max_element(b.begin(), b.end());
  }
  /// max / mean of the per-rank busy times.
  [[nodiscard]] double imbalance() const {
    const auto b = busy();
    double sum = 0;
    for (auto x : b) sum += x;
    return step() * static_cast<double>(b.size()) / sum;
  }
  /// The mean over repeats of each repeat's largest busy time (the plain average, for comparison).
  [[nodiscard]] double step_mean() const {
    double sum = 0;
    for (const auto& r : runs) sum += *std::max_element(r.begin(), r.end());
    return sum / static_cast<double>(runs.size());
  }
};

/// Trains every batch once under one strategy over kRanks loopback ranks, appending each batch's per-rank
/// busy times to `out` (and pricing its plan the first time).
template <class Partition, class Balancer>
void run_strategy(const Partition& partition, const Balancer& balancer, const mllm::config& mc,
                  const std::vector<model::step_batch>& batches, const balance::step_model& cost,
                  std::vector<measured_batch>& out) {
  out.resize(batches.size());
  comm::loopback::run(kRanks, [&](comm_t& c) {
    using system_t = train::system<Partition, model::reference_attention, comm_t, Balancer>;
    system_t sys(partition, balancer, c, {}, {.cost = cost});
    std::optional<mllm::backbone<float>> m;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const double plan_cpu0 = thread_cpu_seconds();
      const auto plan = sys.plan(batches[b]);
      const double plan_cpu = thread_cpu_seconds() - plan_cpu0;
      if (!m) m.emplace(mc, 7, plan.pipeline.num_stages, sys.local_stages(plan));
      const auto st = sys.run(plan, batches[b], *m, train::sgd<float>{0.0F});  // lr 0: the same step again
      const auto rep = train::gather_report(c, st);
      double split[5] = {plan_cpu, st.library_cpu_seconds(), st.cpu_busy_seconds, st.cpu_comm_seconds,
                         plan_cpu + st.cpu_step_seconds};
      comm::all_reduce(c, std::span<double>(split), comm::reduce_op::sum);
      if (c.rank() != 0) continue;
      auto& o = out[b];
      o.runs.push_back(rep.cpu_busy_seconds);
      o.splits.push_back({split[0], split[1], split[2], split[3], split[4]});
      if (!o.modelled_busy.empty()) continue;
      const auto tl = price(plan, cost);
      for (auto x : tl.busy) {
        o.modelled_busy.push_back(x.units() / 1000.0);
        o.modelled = std::max(o.modelled, x.units() / 1000.0);
      }
      o.modelled_with_waits = tl.step.units() / 1000.0;
      o.modelled_imbalance = tl.imbalance();
      o.micro_batches = plan.micro_batches();
      for (const auto& ring : plan.rings) o.rings += ring.size() > 1 ? 1 : 0;
    }
  });
}

/// The 1-minute load average now (this machine is shared: say how busy it was).
double load_average_now() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (auto x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out = "bench/results/train.json", workloads;
  int batches_n = 3, repeats = 5, seed = 1;
  std::int64_t capacity = 512, tokens = 8192;
  if (!tools::parse_command_line(argc, argv, "bench_train",
                                 {{"--out", "FILE", "the JSON results", &out},
                                  {"--workloads", "DIR", "the workload data", &workloads},
                                  {"--batches", "N", "batches", &batches_n},
                                  {"--repeats", "N", "repeats", &repeats},
                                  {"--capacity", "TOKENS", "tokens per rank", &capacity},
                                  {"--tokens", "N", "tokens per batch", &tokens},
                                  {"--seed", "N", "seed", &seed}}))
    return 2;
  const auto t_start = std::chrono::steady_clock::now();
  const double load_start = load_average_now();
  mllm::config mc;  // the example's backbone shape (layers.hpp defaults)
  const auto dir = bench::workloads_dir(workloads, {"prolong_doc_lengths.txt"});
  std::vector<std::int64_t> lengths;
  for (auto l : balance::read_lengths(dir / "prolong_doc_lengths.txt"))
    lengths.push_back(std::clamp<std::int64_t>(l / kScale, kMin, kMax));

  // 1. Calibration, under the load the strategies run in (kRanks ranks sharing the cores): every rank runs
  //    its own documents of one length (ring degree 1), each its own micro-batch; per-document thread CPU
  //    time of forward + backward -> T(s) = a s^2 + b s + c (attention, projections and MLP, per call).
  const std::vector<std::int64_t> cal_lengths{16, 32, 64, 128, 256, 384, 512, 768, 1024};
  auto per_rank = [](std::int64_t l) { return static_cast<int>(std::max<std::int64_t>(1, 256 / l)); };
  std::vector<cost::sample_point> pts;
  json cal_points = json::array();
  for (auto l : cal_lengths) {
    const double s = concurrent_seconds(mc, l, 1, per_rank(l), repeats);
    pts.push_back({static_cast<double>(l), s * 1000.0});  // model units: ms
    cal_points.push_back({{"length", l}, {"degree", 1}, {"cpu_ms", s * 1000.0}});
  }
  const auto fit = cost::fit_quadratic(pts);
  balance::step_model cost;
  cost.llm = cost::llm_compute{fit.model, 1, 1.0};  // the fit is the whole backbone's forward + backward
  cost.kv_bytes_per_token = 0.0;                    // loopback: the KV hops themselves are memory copies
  cost.net.intra_latency_us = 0.0;
  cost.net.inter_latency_us = 0.0;
  cost.net.devices_per_node = kRanks;
  //    Rings: the same documents split over rings of 2 and 4 ranks; what a ring costs beyond its compute
  //    share (a s^2 + b s) / D + c, fitted as D x ring_step_overhead (least squares through 0).
  double num = 0, den = 0;
  json ring_points = json::array();
  for (int d : {2, 4})
    for (std::int64_t l : {16, 64, 256}) {
      const double meas = concurrent_seconds(mc, l, d, per_rank(l), repeats) * 1000.0;
      const double mod = cost.ring_time(l, d, false).units();
      num += (meas - mod) * d;
      den += static_cast<double>(d) * d;
      ring_points.push_back(
          {{"length", l}, {"degree", d}, {"cpu_ms_per_rank", meas}, {"compute_model_ms", mod}});
    }
  cost.ring_step_overhead = std::max(0.0, num / den);
  std::printf(
      "calibration: T(s) = %.4g s^2 + %.4g s + %.4g ms (max rel err %.3f, rms %.3f); ring step %.4g ms\n",
      fit.model.a, fit.model.b, fit.model.c, fit.max_relative_error, fit.rms_relative_error,
      cost.ring_step_overhead);
  // A check of the pack price: 16 documents of 32 tokens in one packed micro-batch (one rank).
  model::step_batch pack;
  for (int i = 0; i < 16; ++i) pack.documents.push_back(one_document(32, mc.vocab, i).documents[0]);
  const double pack_ms = single_rank_seconds(mc, pack, 3) * 1000.0;
  const std::vector<std::int64_t> pack_lens(16, 32);
  const double pack_model_ms = cost.pack_time(pack_lens).units();
  std::printf("pack check: 16 x 32 tokens measured %.2f ms, modelled %.2f ms\n", pack_ms, pack_model_ms);

  // 2. The batches.
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  std::vector<model::step_batch> batches;
  json batch_info = json::array();
  for (int b = 0; b < batches_n; ++b) {
    batches.push_back(draw_batch(lengths, tokens, mc.vocab, rng));
    std::int64_t longest = 0, n = 0;
    for (const auto& d : batches.back().documents) longest = std::max(longest, d.length()), n += d.length();
    batch_info.push_back(
        {{"documents", batches.back().documents.size()}, {"tokens", n}, {"longest", longest}});
  }

  // 3. The three strategies.
  const int cp = static_cast<int>((kMax + capacity - 1) / capacity);
  struct row {
    std::string name, what;
    std::vector<measured_batch> r;
  };
  const seq::hdp<seq::no_offload> hdp{.capacity = capacity};
  std::vector<row> rows{
      {"static_dp_cp",
       fmt::format("seq::cp_zigzag{{.cp = {}, .pad = true}}: dp = {} groups of {} ranks", cp, kRanks / cp,
                   cp),
       {}},
      {"bytescale_hdp",
       fmt::format("seq::hdp<no_offload>{{.capacity = {}}} + balance::bytescale", capacity),
       {}},
      {"gap_filling_hdp",
       fmt::format("seq::hdp<no_offload>{{.capacity = {}}} + balance::gap_filling_hdp", capacity),
       {}}};
  // Repeats interleave the strategies, so a change of load on the machine touches all three alike.
  for (int r = 0; r < repeats; ++r) {
    run_strategy(seq::cp_zigzag{.cp = cp, .pad = true}, train::family_placement{}, mc, batches, cost,
                 rows[0].r);
    run_strategy(hdp, balance::bytescale{}, mc, batches, cost, rows[1].r);
    run_strategy(hdp, balance::gap_filling_hdp{}, mc, batches, cost, rows[2].r);
  }

  // 4. Report.
  json strategies = json::array(), ms = json::object(), mo = json::object(), ratio = json::object();
  json overhead = json::object();
  double worst_share = 0;
  std::vector<double> meas, mod;
  for (const auto& rw : rows) {
    std::vector<double> a, b, c, w, mi, am;
    json per = json::array();
    cpu_split total;  // over every batch and repeat
    std::vector<double> shares;
    for (const auto& x : rw.r)
      for (const auto& sp : x.splits) {
        total.plan += sp.plan, total.library += sp.library, total.user += sp.user, total.comm += sp.comm,
            total.step += sp.step;
        shares.push_back(sp.library_share());
      }
    std::sort(shares.begin(), shares.end());
    worst_share = std::max(worst_share, total.library_share());
    overhead[rw.name] = {{"library_share", total.library_share()},
                         {"library_share_median_step", shares.empty() ? 0.0 : shares[shares.size() / 2]},
                         {"plan_share", total.step > 0 ? total.plan / total.step : 0.0},
                         {"run_library_share", total.step > 0 ? total.library / total.step : 0.0},
                         {"user_share", total.step > 0 ? total.user / total.step : 0.0},
                         {"comm_share", total.step > 0 ? total.comm / total.step : 0.0},
                         {"cpu_s_all_steps", total.step}};
    for (const auto& x : rw.r) {
      a.push_back(x.step());
      am.push_back(x.step_mean());
      b.push_back(x.modelled);
      c.push_back(x.imbalance());
      w.push_back(x.modelled_with_waits);
      mi.push_back(x.modelled_imbalance);
      per.push_back({{"measured_step_s", x.step()},
                     {"measured_step_mean_s", x.step_mean()},
                     {"modelled_step_s", x.modelled},
                     {"measured_busy_s", x.busy()},
                     {"measured_runs_busy_s", x.runs},
                     {"modelled_busy_s", x.modelled_busy},
                     {"micro_batches", x.micro_batches},
                     {"rings", x.rings}});
    }
    meas.push_back(mean(a));
    mod.push_back(mean(b));
    strategies.push_back({{"name", rw.name},
                          {"what", rw.what},
                          {"measured_step_s", mean(a)},
                          {"modelled_step_s", mean(b)},
                          {"measured_over_modelled", mean(a) / mean(b)},
                          {"measured_step_mean_s", mean(am)},
                          {"imbalance_measured", mean(c)},
                          {"imbalance_modelled", mean(mi)},
                          {"modelled_step_with_waits_s", mean(w)},
                          {"per_batch", per}});
  }
  bool within = true;
  std::printf("\n%-26s %12s %12s %8s %10s %10s %10s\n", "strategy", "measured s", "modelled s", "meas/mod",
              "speedup", "speedup", "imbalance");
  std::printf("%-26s %12s %12s %8s %10s %10s %10s\n", "", "(CPU, max)", "(max busy)", "", "measured",
              "modelled", "measured");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double sm = meas[0] / meas[i], sd = mod[0] / mod[i], r = meas[i] / mod[i];
    ms[rows[i].name] = sm;
    mo[rows[i].name] = sd;
    ratio[rows[i].name] = r;
    within = within && std::abs(r - 1.0) <= 0.2;
    std::printf("%-26s %12.4f %12.4f %8.3f %10.3f %10.3f %10.3f\n", rows[i].name.c_str(), meas[i], mod[i], r,
                sm, sd, strategies[i]["imbalance_measured"].get<double>());
  }
  auto order = [](const std::vector<double>& v) {
    std::vector<std::size_t> o(v.size());
    for (std::size_t i = 0; i < o.size(); ++i) o[i] = i;
    std::sort(o.begin(), o.end(), [&](std::size_t x, std::size_t y) { return v[x] < v[y]; });
    return o;
  };
  const bool same_order = order(meas) == order(mod);
  std::printf("ordering equal: %s; measured/modelled within 20%%: %s\n", same_order ? "yes" : "no",
              within ? "yes" : "no");
  std::printf("\nlibrary overhead (thread CPU over all ranks, plan() + run()): ");
  for (const auto& rw : rows)
    std::printf("%s %.2f%% (plan %.2f%%, comm %.2f%%)  ", rw.name.c_str(),
                100 * overhead[rw.name]["library_share"].get<double>(),
                100 * overhead[rw.name]["plan_share"].get<double>(),
                100 * overhead[rw.name]["comm_share"].get<double>());
  std::printf("\n");
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  json j;
  j["benchmark"] = "bench_train";
  j["machine"] =
      "2-core VM, no GPU, 8 loopback ranks as threads sharing the cores (loaded when other builds run)";
  j["workload"] = bench::project_relative(dir / "prolong_doc_lengths.txt");
  j["scaling"] = {{"divide_by", kScale}, {"clamp", {kMin, kMax}}};
  j["tokens_per_step"] = tokens;
  j["batches"] = batch_info;
  j["repeats"] = repeats;
  j["seed"] = seed;
  j["ranks"] = kRanks;
  j["model"] = {{"width", mc.width},
                {"blocks", mc.blocks},
                {"q_heads", mc.attn.q_heads},
                {"kv_heads", mc.attn.kv_heads},
                {"head_dim", mc.attn.head_dim},
                {"mlp_hidden", mc.mlp_hidden},
                {"vocab", mc.vocab},
                {"kernel", "model::reference_attention"}};
  j["capacity"] = capacity;
  j["static_cp"] = cp;
  j["calibration"] = {
      {"what",
       "8 concurrent ranks, each its own documents of one length (one micro-batch each), backbone "
       "forward + backward, thread CPU ms per document; rings: the same over rings of 2 and 4"},
      {"a_ms_per_token2", fit.model.a},
      {"b_ms_per_token", fit.model.b},
      {"c_ms", fit.model.c},
      {"max_relative_error", fit.max_relative_error},
      {"rms_relative_error", fit.rms_relative_error},
      {"points", cal_points},
      {"ring_step_overhead_ms", cost.ring_step_overhead},
      {"ring_points", ring_points},
      {"pack_check",
       {{"documents", 16}, {"length", 32}, {"measured_ms", pack_ms}, {"modelled_ms", pack_model_ms}}}};
  j["strategies"] = strategies;
  j["measured_speedup_vs_static"] = ms;
  j["modelled_speedup_vs_static"] = mo;
  j["measured_over_modelled"] = ratio;
  j["library_overhead_share"] = worst_share;
  j["library_overhead"] = {
      {"what",
       "thread CPU seconds summed over ranks and over every batch and repeat: (sys.plan() + run() less the "
       "stage calls, the bytes on the wire and the optimizer) / (sys.plan() + run()); "
       "library_overhead_share is the largest over the strategies. Bytes on the wire: the pipeline's "
       "SEND/RECV actions, the step's barrier, the gradient and stats reductions (step_stats::"
       "cpu_comm_seconds); ring attention's hops run inside the stage calls and count as the user's"},
      {"target", 0.02},
      {"per_strategy", overhead}};
  j["targets"] = {{"ordering_equal", same_order},
                  {"within_20_percent", within},
                  {"library_overhead_within_2_percent", worst_share <= 0.02}};
  j["load_average_1min"] = {{"start", load_start}, {"end", load_average_now()}};
  j["run_seconds"] = run_s;
  bench::write_json(j, out);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train: %s\n", e.what());
  return 1;
}
