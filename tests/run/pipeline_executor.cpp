// SPDX-License-Identifier: Apache-2.0
// The executor trains a small pipelined MLP stack on loopback ranks and must reproduce, per stage, the
// weight gradients of the same model run on one rank. Micro-batches have different row counts, so the
// plan's sizes (not a shape exchange) drive every receive. A joint encoder-LLM schedule runs the same
// way with a linear encoder sharded over the pipeline ranks. The device path (comm::emulated_device with
// model::emulated_device_memory: device pointers the CPU cannot dereference) must reproduce the host run
// bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/pipeline/dualpipe.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/pipeline/trace_json.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh/run/pipeline_executor.hpp>
#include <hetmesh_tools/schedule_names.hpp>  // names -> schedules: the tools' mapping

using namespace hetmesh::pipeline;
using hetmesh::run::activation_sizes;
using hetmesh::run::execute_pipeline;
using hetmesh::run::stage_functions;

namespace {

constexpr int D = 3;  // width of every layer

double value(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return static_cast<double>(hetmesh::key_hash({a, b, c}) >> 11) * 0x1.0p-53 - 0.5;
}

int rows_of(int mb) { return 1 + (mb * 7 + 3) % 3; }  // 1..3 rows: variable lengths

/// Stage s: y = tanh(W x + b) on each row. The last stage's loss is 0.5 * sum(y^2).
struct mlp {
  int stages;
  int shards;                                            // encoder shards (0: stage 0 reads its own data)
  std::vector<std::vector<double>> w, b, dw, db, u, du;  // u: encoder shard weights D x D
  std::map<std::pair<int, int>, std::vector<double>> x, y, delta;  // stashed per (stage, mb)

  mlp(int s, int e) : stages(s), shards(e) {
    for (int k = 0; k < s; ++k) {
      w.emplace_back(D * D);
      b.emplace_back(D);
      for (int i = 0; i < D * D; ++i)
        w.back()[static_cast<std::size_t>(i)] =
            0.8 * value(1, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(i));
      for (int i = 0; i < D; ++i)
        b.back()[static_cast<std::size_t>(i)] =
            0.2 * value(2, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(i));
    }
    for (int e = 0; e < shards; ++e) {
      u.emplace_back(D * D);
      for (int i = 0; i < D * D; ++i)
        u.back()[static_cast<std::size_t>(i)] =
            value(5, static_cast<std::uint64_t>(e), static_cast<std::uint64_t>(i));
    }
    dw.assign(static_cast<std::size_t>(s), std::vector<double>(D * D, 0.0));
    db.assign(static_cast<std::size_t>(s), std::vector<double>(D, 0.0));
    du.assign(static_cast<std::size_t>(shards), std::vector<double>(D * D, 0.0));
  }

  static std::vector<double> data(int mb) {  // stage 0's own input when there is no encoder
    std::vector<double> v(static_cast<std::size_t>(rows_of(mb) * D));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(3, static_cast<std::uint64_t>(mb), i);
    return v;
  }
  static std::vector<double> encoder_input(int shard, int mb) {
    std::vector<double> v(static_cast<std::size_t>(rows_of(mb) * D));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = value(6, static_cast<std::uint64_t>(shard * 1000 + mb), i);
    return v;
  }

  void encoder_forward(int e, int mb, std::span<double> out) {
    const auto in = encoder_input(e, mb);
    const auto& U = u[static_cast<std::size_t>(e)];
    for (int r = 0; r < rows_of(mb); ++r)
      for (int i = 0; i < D; ++i) {
        double acc = 0;
        for (int j = 0; j < D; ++j)
          acc += U[static_cast<std::size_t>(i * D + j)] * in[static_cast<std::size_t>(r * D + j)];
        out[static_cast<std::size_t>(r * D + i)] = acc;
      }
  }
  void encoder_backward(int e, int mb, std::span<const double> g) {
    const auto in = encoder_input(e, mb);
    auto& dU = du[static_cast<std::size_t>(e)];
    for (int r = 0; r < rows_of(mb); ++r)
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j)
          dU[static_cast<std::size_t>(i * D + j)] +=
              g[static_cast<std::size_t>(r * D + i)] * in[static_cast<std::size_t>(r * D + j)];
  }

  void forward(int s, int mb, std::span<const double> in, std::span<double> out) {
    std::vector<double> xin = (s == 0 && shards == 0) ? data(mb) : std::vector<double>(in.begin(), in.end());
    const int n = static_cast<int>(xin.size()) / D;
    std::vector<double> yv(xin.size());
    const auto& W = w[static_cast<std::size_t>(s)];
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < D; ++i) {
        double acc = b[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)];
        for (int j = 0; j < D; ++j)
          acc += W[static_cast<std::size_t>(i * D + j)] * xin[static_cast<std::size_t>(r * D + j)];
        yv[static_cast<std::size_t>(r * D + i)] = std::tanh(acc);
      }
    REQUIRE((out.empty() || out.size() == yv.size()));
    std::copy(yv.begin(), yv.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
    x[{s, mb}] = std::move(xin);
    y[{s, mb}] = std::move(yv);
  }
  void input_grad(int s, int mb, std::span<const double> gout, std::span<double> gin) {
    const auto& yv = y.at({s, mb});
    std::vector<double> d(yv.size());
    for (std::size_t i = 0; i < yv.size(); ++i) {
      const double gy = s == stages - 1 ? yv[i] : gout[i];  // d(0.5 y^2)/dy = y on the last stage
      d[i] = gy * (1 - yv[i] * yv[i]);
    }
    const auto& W = w[static_cast<std::size_t>(s)];
    const int n = static_cast<int>(yv.size()) / D;
    if (!gin.empty())
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < D; ++j) {
          double acc = 0;
          for (int i = 0; i < D; ++i)
            acc += W[static_cast<std::size_t>(i * D + j)] * d[static_cast<std::size_t>(r * D + i)];
          gin[static_cast<std::size_t>(r * D + j)] = acc;
        }
    delta[{s, mb}] = std::move(d);
  }
  void weight_grad(int s, int mb) {
    const auto& d = delta.at({s, mb});
    const auto& xin = x.at({s, mb});
    const int n = static_cast<int>(d.size()) / D;
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < D; ++i) {
        db[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] +=
            d[static_cast<std::size_t>(r * D + i)];
        for (int j = 0; j < D; ++j)
          dw[static_cast<std::size_t>(s)][static_cast<std::size_t>(i * D + j)] +=
              d[static_cast<std::size_t>(r * D + i)] * xin[static_cast<std::size_t>(r * D + j)];
      }
  }

  stage_functions<double> functions() {
    stage_functions<double> f;
    f.forward = [this](int s, int mb, std::span<const double> in, std::span<double> out) {
      forward(s, mb, in, out);
    };
    f.backward = [this](int s, int mb, std::span<const double> g, std::span<double> gi) {
      input_grad(s, mb, g, gi);
      weight_grad(s, mb);
    };
    f.backward_input = [this](int s, int mb, std::span<const double> g, std::span<double> gi) {
      input_grad(s, mb, g, gi);
    };
    f.backward_weight = [this](int s, int mb) { weight_grad(s, mb); };
    f.encoder_forward = [this](int e, int mb, std::span<double> out) { encoder_forward(e, mb, out); };
    f.encoder_backward = [this](int e, int mb, std::span<const double> g) { encoder_backward(e, mb, g); };
    return f;
  }

  /// The same model on one rank, micro-batch by micro-batch.
  void reference(int microbatches) {
    for (int mb = 0; mb < microbatches; ++mb) {
      const std::size_t n = static_cast<std::size_t>(rows_of(mb) * D);
      std::vector<double> in;
      for (int e = 0; e < shards; ++e) {
        std::vector<double> part(n);
        encoder_forward(e, mb, part);
        in.insert(in.end(), part.begin(), part.end());
      }
      for (int s = 0; s < stages; ++s) {
        std::vector<double> out(s + 1 < stages ? (s == 0 && shards > 0 ? in.size() : (s == 0 ? n : in.size()))
                                               : 0);
        forward(s, mb, in, out);
        in = out;
      }
      std::vector<double> g;
      for (int s = stages - 1; s >= 0; --s) {
        std::vector<double> gi(s > 0 || shards > 0 ? x.at({s, mb}).size() : 0);
        input_grad(s, mb, g, gi);
        weight_grad(s, mb);
        g = gi;
      }
      for (int e = 0; e < shards; ++e)
        encoder_backward(e, mb, std::span<const double>(g).subspan(static_cast<std::size_t>(e) * n, n));
    }
  }
};

void check_against_reference(const schedule& lowered, int microbatches) {
  const int shards = lowered.num_encoder_shards();
  mlp ref(lowered.num_stages, shards);
  ref.reference(microbatches);
  std::vector<mlp> per_rank(static_cast<std::size_t>(lowered.total_ranks()), mlp(lowered.num_stages, shards));
  activation_sizes sizes;
  // Encoder shards each emit rows_of(mb) rows, so stage 0's input (and every later activation) has
  // shards * rows rows with an encoder, rows rows without.
  const int width = shards > 0 ? shards : 1;
  sizes.output = [width](int, int mb) -> std::int64_t {
    return static_cast<std::int64_t>(width * rows_of(mb) * D);
  };
  sizes.encoder_output = [](int, int mb) -> std::int64_t {
    return static_cast<std::int64_t>(rows_of(mb) * D);
  };
  std::vector<std::vector<timed_action>> timelines(static_cast<std::size_t>(lowered.total_ranks()));
  hetmesh::comm::loopback::run(lowered.total_ranks(), [&](hetmesh::comm::loopback::communicator& c) {
    auto& model = per_rank[static_cast<std::size_t>(c.rank())];
    execute_pipeline(c, lowered, model.functions(), sizes, &timelines[static_cast<std::size_t>(c.rank())]);
  });
  for (int s = 0; s < lowered.num_stages; ++s) {
    const auto& got = per_rank[static_cast<std::size_t>(lowered.rank_of_stage(s))];
    for (int i = 0; i < D * D; ++i)
      CHECK(got.dw[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] ==
            doctest::Approx(ref.dw[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)]).epsilon(1e-12));
    for (int i = 0; i < D; ++i)
      CHECK(got.db[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] ==
            doctest::Approx(ref.db[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)]).epsilon(1e-12));
    double norm = 0;
    for (double v : ref.dw[static_cast<std::size_t>(s)]) norm += std::abs(v);
    CHECK(norm > 1e-3);  // the gradients are not trivially zero
  }
  for (int e = 0; e < shards; ++e) {
    const auto& got =
        per_rank[static_cast<std::size_t>(lowered.encoder_shard_to_rank[static_cast<std::size_t>(e)])];
    for (int i = 0; i < D * D; ++i)
      CHECK(got.du[static_cast<std::size_t>(e)][static_cast<std::size_t>(i)] ==
            doctest::Approx(ref.du[static_cast<std::size_t>(e)][static_cast<std::size_t>(i)]).epsilon(1e-12));
  }
  std::vector<timed_action> all;
  for (const auto& t : timelines) all.insert(all.end(), t.begin(), t.end());
  std::size_t runs = 0;  // an overlapped F+B runs (and is timed) as its two halves
  for (const auto& row : lowered.ranks)
    for (const auto& a : row) runs += static_cast<std::size_t>(parts(a).count);
  CHECK(all.size() == runs);
  CHECK(chrome_trace(all).at("traceEvents").size() > all.size());
}

/// Non-empty spans a rank's stage callables received, by where their pointer lives.
struct span_counts {
  int device = 0;
  int host = 0;
};

/// The model's stage callables for the device path: each counts its non-empty spans by memory space, maps
/// them with emulated::to_host (which refuses a host pointer) and runs the model's own callable.
stage_functions<double> device_functions(mlp& m, span_counts& k) {
  auto host = [&k](auto sp) {
    if (!sp.empty()) ++(hetmesh::emulated::is_device_pointer(sp.data()) ? k.device : k.host);
    return hetmesh::emulated::to_host(sp, "test stage callable");
  };
  const stage_functions<double> f = m.functions();
  stage_functions<double> d;
  d.forward = [f, host](int s, int mb, std::span<const double> in, std::span<double> out) {
    f.forward(s, mb, host(in), host(out));
  };
  d.backward = [f, host](int s, int mb, std::span<const double> g, std::span<double> gi) {
    f.backward(s, mb, host(g), host(gi));
  };
  d.backward_input = [f, host](int s, int mb, std::span<const double> g, std::span<double> gi) {
    f.backward_input(s, mb, host(g), host(gi));
  };
  d.backward_weight = f.backward_weight;
  d.encoder_forward = [f, host](int e, int mb, std::span<double> out) {
    f.encoder_forward(e, mb, host(out));
  };
  d.encoder_backward = [f, host](int e, int mb, std::span<const double> g) {
    f.encoder_backward(e, mb, host(g));
  };
  return d;
}

activation_sizes sizes_for(int shards) {
  const int width = shards > 0 ? shards : 1;
  activation_sizes sizes;
  sizes.output = [width](int, int mb) -> std::int64_t {
    return static_cast<std::int64_t>(width * rows_of(mb) * D);
  };
  sizes.encoder_output = [](int, int mb) -> std::int64_t {
    return static_cast<std::int64_t>(rows_of(mb) * D);
  };
  return sizes;
}

/// Runs `s` on its loopback ranks: on host memory, or (with `counts`, one per rank) over
/// comm::emulated_device with model::emulated_device_memory and device_functions. Returns each rank's model
/// (its stashed inputs, outputs, deltas and gradients).
std::vector<mlp> run_pipeline(const schedule& s, std::vector<span_counts>* counts) {
  std::vector<mlp> per_rank(static_cast<std::size_t>(s.total_ranks()),
                            mlp(s.num_stages, s.num_encoder_shards()));
  const activation_sizes sizes = sizes_for(s.num_encoder_shards());
  hetmesh::comm::loopback::run(s.total_ranks(), [&](hetmesh::comm::loopback::communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    if (counts == nullptr) {
      execute_pipeline(c, s, per_rank[r].functions(), sizes);
      return;
    }
    hetmesh::comm::emulated_device<hetmesh::comm::loopback::communicator> dev(c);
    hetmesh::model::emulated_device_memory mem;
    std::vector<timed_action> timeline;
    execute_pipeline(dev, s, device_functions(per_rank[r], (*counts)[r]), sizes, mem, &timeline);
    CHECK(timeline.size() >= s.ranks[r].size());
  });
  return per_rank;
}

/// The last stage's loss of micro-batch mb, 0.5 * sum(y^2), on the rank that holds it.
double loss_of(const schedule& s, const std::vector<mlp>& per_rank, int mb) {
  const int last = s.num_stages - 1;
  double l = 0;
  for (double v : per_rank[static_cast<std::size_t>(s.rank_of_stage(last))].y.at({last, mb}))
    l += 0.5 * v * v;
  return l;
}

/// The device run of `s` equals its host run bit for bit (every stashed activation, delta, gradient and
/// loss), and its stage callables saw device pointers only.
void check_device_equals_host(const schedule& s) {
  const auto host = run_pipeline(s, nullptr);
  std::vector<span_counts> counts(static_cast<std::size_t>(s.total_ranks()));
  const auto device = run_pipeline(s, &counts);
  for (std::size_t r = 0; r < host.size(); ++r) {
    INFO("rank " << r);
    CHECK(counts[r].host == 0);
    CHECK(counts[r].device > 0);
    CHECK(device[r].x == host[r].x);  // stage inputs: received activations, joined encoder outputs
    CHECK(device[r].y == host[r].y);  // stage outputs
    CHECK(device[r].delta == host[r].delta);
    CHECK(device[r].dw == host[r].dw);
    CHECK(device[r].db == host[r].db);
    CHECK(device[r].du == host[r].du);  // encoder gradients: stage 0's input gradient, split
    CHECK(!host[r].x.empty());
  }
  for (int mb = 0; mb < s.num_microbatches; ++mb) {
    const double l = loss_of(s, host, mb);
    CHECK(l > 0);
    CHECK(loss_of(s, device, mb) == l);
  }
}

}  // namespace

TEST_CASE("pipeline executor: pipelined MLP on loopback ranks matches single-rank gradients") {
  for (const char* name :
       {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev"}) {
    INFO(name);
    const schedule s = add_send_recv(hetmesh::tools::make_schedule(name, 2, 4));
    (void)verify(s);
    check_against_reference(s, 4);
  }
  const schedule three = add_send_recv(interleaved_1f1b{.virtual_stages = 2}.generate(3, 6));
  check_against_reference(three, 6);
  check_against_reference(add_send_recv(dualpipev{}.generate(3, 7)), 7);  // overlaps on 3 ranks
}

TEST_CASE("pipeline executor: joint encoder-LLM schedule trains the encoder shards too") {
  const schedule llm = one_f_one_b{}.generate(3, 5);
  encoder_work w{.forward = [](int mb) { return 0.3 * rows_of(mb); },
                 .backward = [](int mb) { return 0.6 * rows_of(mb); }};
  // Each placement is a type: one generic body, called once per family.
  const auto check_placement = [&](const auto& placement) {
    INFO(fmt::format("{}", placement));
    const schedule j = add_send_recv(add_encoder(llm, placement, uniform_costs{}.model(), w));
    (void)verify(j);
    check_against_reference(j, 5);
  };
  check_placement(colocated_encoder{});
  check_placement(encoder_on_first_stage{});
  check_placement(encoder_pool{.ranks = 2});
}

TEST_CASE("pipeline executor: refuses an unlowered multi-rank schedule") {
  const schedule s = one_f_one_b{}.generate(2, 2);
  mlp m(2, 0);
  CHECK_THROWS_WITH_AS(hetmesh::comm::loopback::run(
                           2,
                           [&](hetmesh::comm::loopback::communicator& c) {
                             execute_pipeline(
                                 c, s, m.functions(),
                                 activation_sizes{.output = [](int, int) -> std::int64_t { return D; }});
                           }),
                       doctest::Contains("expected a lowered schedule"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline executor: stage callables as their own types run a schedule; a missing one is refused") {
  // One rank, two stages: forward adds 1 per stage, backward passes gradients through.
  const schedule s = hetmesh::pipeline::add_send_recv(one_f_one_b{}.generate(1, 3));
  std::vector<int> forwards, backwards;
  auto fwd = [&](int stage, int mb, std::span<const double>, std::span<double> out) {
    forwards.push_back(stage * 10 + mb);
    for (auto& x : out) x = 1.0;
  };
  auto bwd = [&](int stage, int mb, std::span<const double>, std::span<double>) {
    backwards.push_back(stage * 10 + mb);
  };
  auto sizes = [](int, int) -> std::int64_t { return 2; };
  hetmesh::comm::loopback::run(1, [&](hetmesh::comm::loopback::communicator& c) {
    hetmesh::run::stage_calls<double, decltype(fwd), decltype(bwd)> calls{fwd, bwd};
    execute_pipeline(c, s, calls, hetmesh::run::sizes_of<decltype(sizes)>{sizes});
  });
  CHECK(forwards == std::vector<int>{0, 1, 2});
  CHECK(backwards == std::vector<int>{0, 1, 2});
  // Zero-bubble runs I and W actions: callables without them are refused, naming the missing one.
  const schedule zb = hetmesh::pipeline::add_send_recv(hetmesh::pipeline::zero_bubble{}.generate(1, 2));
  CHECK_THROWS_WITH_AS(hetmesh::comm::loopback::run(
                           1,
                           [&](hetmesh::comm::loopback::communicator& c) {
                             hetmesh::run::stage_calls<double, decltype(fwd), decltype(bwd)> calls{fwd, bwd};
                             execute_pipeline(c, zb, calls, hetmesh::run::sizes_of<decltype(sizes)>{sizes});
                           }),
                       doctest::Contains("backward_input is empty"), hetmesh::invalid_argument);
}

TEST_CASE("pipeline executor: message tags never alias; past the tag space it refuses before sending") {
  using hetmesh::run::detail::pipeline_tag;
  schedule s;
  s.name = "tags";
  s.num_ranks = 1;
  s.num_stages = 3;
  s.num_microbatches = 7;
  s.stage_to_rank = {0, 0, 0};
  s.encoder_shard_to_rank = {0, 0, 0, 0, 0};
  std::set<int> tags;
  for (int st = 0; st < 5; ++st)
    for (int mb = 0; mb < 7; ++mb)
      for (int kind = 0; kind < 4; ++kind) tags.insert(pipeline_tag(s, st, mb, kind));
  CHECK(tags.size() == 5 * 7 * 4);
  // 4 stages x 2^16 micro-batches x 4 kinds fill the 2^20 user tags exactly; one more micro-batch does not
  // fit.
  schedule big;
  big.name = "big";
  big.num_ranks = 1;
  big.num_stages = 4;
  big.num_microbatches = 1 << 16;
  big.stage_to_rank = {0, 0, 0, 0};
  big.ranks = {{}};
  CHECK(pipeline_tag(big, 3, (1 << 16) - 1, 3) == hetmesh::comm::max_user_tag);
  mlp m(4, 0);
  const activation_sizes sizes{.output = [](int, int) -> std::int64_t { return D; }};
  CHECK_NOTHROW(hetmesh::comm::loopback::run(
      1, [&](hetmesh::comm::loopback::communicator& c) { execute_pipeline(c, big, m.functions(), sizes); }));
  big.num_microbatches = (1 << 16) + 1;
  CHECK_THROWS_WITH_AS(
      hetmesh::comm::loopback::run(
          1,
          [&](hetmesh::comm::loopback::communicator& c) { execute_pipeline(c, big, m.functions(), sizes); }),
      doctest::Contains(
          "stage/shard 3 micro-batch 65536 (kind 3) is 1048591, past the limit max_user_tag = 1048575"),
      hetmesh::capacity_error);
}

TEST_CASE("pipeline executor: the device path (emulated device memory) equals the host run bit for bit") {
  for (const char* name : {"1f1b", "gpipe", "zero-bubble", "interleaved-1f1b", "dualpipev"}) {
    INFO(name);
    const schedule s = add_send_recv(hetmesh::tools::make_schedule(name, 4, 8));
    (void)verify(s);
    check_device_equals_host(s);
  }
  const schedule llm = one_f_one_b{}.generate(4, 5);
  encoder_work w{.forward = [](int mb) { return 0.3 * rows_of(mb); },
                 .backward = [](int mb) { return 0.6 * rows_of(mb); }};
  const auto check_placement = [&](const auto& placement) {
    INFO(fmt::format("{}", placement));
    const schedule j = add_send_recv(add_encoder(llm, placement, uniform_costs{}.model(), w));
    (void)verify(j);
    CHECK(j.num_encoder_shards() > 0);
    check_device_equals_host(j);
  };
  check_placement(encoder_on_first_stage{});
  check_placement(colocated_encoder{});  // one shard per rank: stage 0 joins and splits 4 slices
}

TEST_CASE("pipeline executor: a host buffer where the device path expects device memory is caught") {
  // The device stage callables on host memory: the first non-empty span is refused, naming the callable.
  const schedule s = add_send_recv(one_f_one_b{}.generate(4, 4));
  std::vector<mlp> per_rank(4, mlp(4, 0));
  std::vector<span_counts> counts(4);
  CHECK_THROWS_WITH_AS(hetmesh::comm::loopback::run(
                           4,
                           [&](hetmesh::comm::loopback::communicator& c) {
                             const auto r = static_cast<std::size_t>(c.rank());
                             execute_pipeline(c, s, device_functions(per_rank[r], counts[r]), sizes_for(0));
                           }),
                       doctest::Contains("test stage callable: "), hetmesh::invalid_argument);
  int host_spans = 0;
  for (const auto& k : counts) host_spans += k.host;
  CHECK(host_spans > 0);
}

TEST_CASE("pipeline executor: the schedule agreement check gathers through the memory policy on a device") {
  using hetmesh::run::detail::check_schedule_agreement;
  const schedule s = add_send_recv(one_f_one_b{}.generate(3, 3));
  schedule other = s;
  other.name = "1f1b (stale)";
  const auto agree = [&](bool stale_rank_2) {
    hetmesh::comm::loopback::run(3, [&](hetmesh::comm::loopback::communicator& c) {
      hetmesh::comm::emulated_device<hetmesh::comm::loopback::communicator> dev(c);
      hetmesh::model::emulated_device_memory mem;
      check_schedule_agreement(dev, mem, stale_rank_2 && c.rank() == 2 ? other : s, "pipeline schedule");
    });
  };
  CHECK_NOTHROW(agree(false));
  const std::string expected = fmt::format(
      "pipeline schedule hashes disagree across the group of 3 ranks: rank 2 (global 2) has {:#018x}; "
      "expected every rank to hold {:#018x}",
      hetmesh::plan_hash(other), hetmesh::plan_hash(s));
  CHECK_THROWS_WITH_AS(agree(true), doctest::Contains(expected.c_str()), hetmesh::mismatch_error);
}
