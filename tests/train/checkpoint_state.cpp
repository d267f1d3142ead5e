// SPDX-License-Identifier: Apache-2.0
// train::capture and train::restore (train/checkpoint_state.hpp) over train::memory_source: state saved
// under tensor parallelism restores whole or under another split; ZeRO-1 shards over 2 and 4 loopback
// ranks restore into a replicated Adam, into ZeRO-1 over 3 ranks and over the same ranks, and the next
// step matches the uninterrupted run (bit for bit under the same layout); the reverse; a random property
// over layouts; refused checkpoints name the tensor and field and leave the model and optimizer as they
// were.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/train/checkpoint_state.hpp>
#include <hetmesh/train/zero.hpp>

using namespace hetmesh;

namespace {

using snapshot = train::rank_snapshot<double>;

// A tensor of the test models: rows x cols, split by tensor parallelism along `axis` (-1: never split).
struct full_tensor {
  std::int64_t id = 0;
  std::int64_t rows = 1, cols = 1;
  int axis = -1;
  [[nodiscard]] std::int64_t size() const { return rows * cols; }
};

// A record as a model's tensors() returns it.
struct record {
  std::int64_t id = 0;
  std::span<double> value;
  train::tensor_shard shard;
};

// A pure function of (salt, tensor, element): never zero, in [-0.5, 0.5).
double value_of(std::uint64_t salt, std::int64_t id, std::int64_t i) {
  return static_cast<double>(
             key_hash({salt, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(i)}) >> 11) *
             0x1.0p-53 -
         0.5;
}

// One rank's model: its block (tp part `part` of `parts`) of every tensor, values from `salt`.
struct rank_model {
  std::vector<full_tensor> spec;
  std::vector<train::tensor_shard> shards;
  std::vector<std::vector<double>> value, grad;

  rank_model(std::vector<full_tensor> s, int part, int parts, std::uint64_t salt) : spec(std::move(s)) {
    for (const auto& t : spec) {
      const auto sh = t.axis < 0 || parts == 1 ? train::tensor_shard{}
                                               : train::tensor_shard{t.rows, t.cols, t.axis, part, parts};
      shards.push_back(sh);
      const auto n = static_cast<std::size_t>(t.size() / sh.parts);
      value.emplace_back(n);
      grad.emplace_back(n, 0.0);
      for (std::size_t i = 0; i < n; ++i)
        value.back()[i] = value_of(salt, t.id, sh.global(static_cast<std::int64_t>(i)));
    }
  }
  std::vector<record> records() {
    std::vector<record> r;
    for (std::size_t k = 0; k < spec.size(); ++k) r.push_back({spec[k].id, value[k], shards[k]});
    return r;
  }
  static std::vector<std::span<double>> spans(std::vector<std::vector<double>>& v) {
    std::vector<std::span<double>> s;
    for (auto& t : v) s.emplace_back(t);
    return s;
  }
  // grad[k][i] = f(tensor k, element i of the full tensor).
  template <class F>
  void set_grads(F&& f) {
    for (std::size_t k = 0; k < spec.size(); ++k)
      for (std::size_t i = 0; i < grad[k].size(); ++i)
        grad[k][i] = f(k, shards[k].global(static_cast<std::int64_t>(i)));
  }
};

// Element g of tensor k's full field `field`, read back through a source.
std::vector<double> whole(const train::memory_source<double>& src, const full_tensor& t,
                          const std::string& field) {
  std::vector<double> out(static_cast<std::size_t>(t.size()));
  src.fill(train::piece_key{t.id, field, {}, t.size(), 0, t.size()}, std::span<double>(out));
  return out;
}

// The block `sh` of a full vector.
std::vector<double> block_of(const std::vector<double>& full, const train::tensor_shard& sh, std::size_t n) {
  std::vector<double> b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = full[static_cast<std::size_t>(sh.global(static_cast<std::int64_t>(i)))];
  return b;
}

bool close(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > rel * std::max(std::abs(b[i]), 1e-3)) return false;
  return true;
}

TEST_CASE(
    "train::shard_layout::owned_runs: the ranks' runs cover every element once, at their shard positions") {
  rng g(35);
  for (int trial = 0; trial < 200; ++trial) {
    const train::shard_layout l{g.uniform(1, 120), g.uniform(1, 17), static_cast<int>(g.uniform(1, 5))};
    const auto offset = g.uniform(0, l.elements - 1), size = g.uniform(0, l.elements - offset);
    std::vector<int> seen(static_cast<std::size_t>(size), 0);
    for (int r = 0; r < l.ranks; ++r)
      l.owned_runs(r, offset, size, [&](std::int64_t first, std::int64_t pos, std::int64_t n) {
        for (std::int64_t j = 0; j < n; ++j) {
          ++seen.at(static_cast<std::size_t>(first + j));
          const auto i = offset + first + j, b = i / l.bucket;  // the element's padded position, rank r's
          CHECK(l.padded_offset(b) + i % l.bucket ==
                l.padded_offset(b) + r * l.slice(b) + (pos + j - l.shard_offset(b)));
        }
      });
    CHECK(std::ranges::count(seen, 1) == size);
  }
}

const std::vector<full_tensor> kTp{{0, 8, 4, 0}, {1, 4, 8, 1}, {2, 4, 1, -1}, {5, 12, 4, 1}};

// Two Adam steps on a model (a tp block of each tensor) and its capture; gradients a function of the full
// tensor's element, so every block steps as the whole tensor would.
snapshot adam_steps(rank_model& m, train::adam<double>& opt) {
  for (int s = 0; s < 2; ++s) {
    m.set_grads([&](std::size_t k, std::int64_t i) {
      return value_of(100 + static_cast<std::uint64_t>(s), static_cast<std::int64_t>(k), i);
    });
    opt(rank_model::spans(m.value), rank_model::spans(m.grad));
  }
  return train::capture(m.records(), opt);
}

TEST_CASE(
    "train::capture at tp 2, train::restore at tp 1 and tp 4: every value and moment the whole tensor's") {
  rank_model whole_model(kTp, 0, 1, 7);
  train::adam<double> whole_opt{.lr = 0.01};
  (void)adam_steps(whole_model, whole_opt);
  std::vector<snapshot> snaps;
  for (int p = 0; p < 2; ++p) {
    rank_model m(kTp, p, 2, 7);
    train::adam<double> opt{.lr = 0.01};
    snaps.push_back(adam_steps(m, opt));
    CHECK(snaps.back().counters.at("adam.t/5") == 2);
  }
  const train::memory_source<double> src{std::span<const snapshot>(snaps)};
  for (const int parts : {1, 4}) {
    for (int p = 0; p < parts; ++p) {
      rank_model m(kTp, p, parts, 999);  // other values, overwritten by the restore
      train::adam<double> opt;
      train::restore(src, m.records(), opt);
      for (std::size_t k = 0; k < kTp.size(); ++k) {
        const auto n = m.value[k].size();
        CHECK(m.value[k] == block_of(whole_model.value[k], m.shards[k], n));
        const auto& want = whole_opt.state.at(whole_model.value[k].data());
        const auto& got = opt.state.at(m.value[k].data());
        CHECK(got.m == block_of(want.m, m.shards[k], n));
        CHECK(got.v == block_of(want.v, m.shards[k], n));
        CHECK(got.t == 2);
      }
    }
  }
}

const std::vector<full_tensor> kDp{{0, 7, 1, -1}, {1, 13, 1, -1}, {2, 1, 1, -1}, {3, 40, 1, -1}};
double rank_grad(int rank, std::size_t k, std::int64_t i, int step) {
  return value_of(1000 + static_cast<std::uint64_t>(rank * 16 + step), static_cast<std::int64_t>(k), i);
}
using zero_adam = train::zero1<train::adam<double>>;
const train::adam<double> kAdam{.lr = 0.01, .weight_decay = 0.1};

TEST_CASE(
    "train::zero1 over 2 and 4 ranks: restored replicated, over 3 ranks and over the same ranks, the next "
    "step matches") {
  const model::host_memory mem;
  for (const int ranks : {2, 4}) {
    std::vector<snapshot> snaps(static_cast<std::size_t>(ranks));
    std::vector<std::vector<std::vector<double>>> continued(static_cast<std::size_t>(ranks));
    comm::loopback::run(ranks, [&](comm::loopback::communicator& c) {
      rank_model m(kDp, 0, 1, 3);
      zero_adam z{.inner = kAdam, .bucket_bytes = 5 * 8};
      for (int s = 0; s <= 3; ++s) {
        if (s == 3) snaps[static_cast<std::size_t>(c.rank())] = train::capture(m.records(), z);
        m.set_grads([&](std::size_t k, std::int64_t i) { return rank_grad(c.rank(), k, i, s); });
        z.step(c, mem, rank_model::spans(m.value), rank_model::spans(m.grad), false);
      }
      continued[static_cast<std::size_t>(c.rank())] = m.value;
    });
    // The shards' runs cover every element once: 61 moments in all, padding never saved.
    std::int64_t saved = 0;
    for (const auto& sn : snaps)
      for (const auto& p : sn.pieces) saved += p.key.field == "adam.m" ? p.key.count : 0;
    CHECK(saved == 61);
    const train::memory_source<double> src{std::span<const snapshot>(snaps)};
    CHECK(src.counter("adam.t/3") == 3);
    auto summed = [&](std::size_t k, std::int64_t i) {
      double g = 0;
      for (int r = 0; r < ranks; ++r) g += rank_grad(r, k, i, 3);
      return g;
    };
    // (a) replicated Adam on one rank.
    {
      rank_model m(kDp, 0, 1, 55);
      train::adam<double> a = kAdam;
      train::restore(src, m.records(), a);
      m.set_grads(summed);
      a(rank_model::spans(m.value), rank_model::spans(m.grad));
      for (std::size_t k = 0; k < kDp.size(); ++k) CHECK(close(m.value[k], continued[0][k], 1e-6));
    }
    // (b) ZeRO-1 over 3 ranks with other buckets; rank 0 holds the summed gradients.
    comm::loopback::run(3, [&](comm::loopback::communicator& c) {
      rank_model m(kDp, 0, 1, 56);
      zero_adam z{.inner = kAdam, .bucket_bytes = 11 * 8};
      train::restore(src, m.records(), z);
      CHECK(z.pending.size() == kDp.size());
      m.set_grads([&](std::size_t k, std::int64_t i) { return c.rank() == 0 ? summed(k, i) : 0.0; });
      z.step(c, mem, rank_model::spans(m.value), rank_model::spans(m.grad), true);
      CHECK(z.pending.empty());
      for (std::size_t k = 0; k < kDp.size(); ++k) CHECK(close(m.value[k], continued[0][k], 1e-6));
    });
    // (c) ZeRO-1 over the same ranks and buckets: bit for bit.
    comm::loopback::run(ranks, [&](comm::loopback::communicator& c) {
      rank_model m(kDp, 0, 1, 57);
      zero_adam z{.inner = kAdam, .bucket_bytes = 5 * 8};
      train::restore(src, m.records(), z);
      m.set_grads([&](std::size_t k, std::int64_t i) { return rank_grad(c.rank(), k, i, 3); });
      z.step(c, mem, rank_model::spans(m.value), rank_model::spans(m.grad), false);
      CHECK(m.value == continued[static_cast<std::size_t>(c.rank())]);
    });
  }
}

TEST_CASE("train::adam replicated, restored into train::zero1 over 2 ranks: the next step matches") {
  const model::host_memory mem;
  rank_model m(kDp, 0, 1, 4);
  train::adam<double> a = kAdam;
  snapshot snap;
  for (int s = 0; s <= 3; ++s) {
    if (s == 3) snap = train::capture(m.records(), a);
    m.set_grads([&](std::size_t k, std::int64_t i) { return rank_grad(0, k, i, s); });
    a(rank_model::spans(m.value), rank_model::spans(m.grad));
  }
  const train::memory_source<double> src{std::span<const snapshot>(&snap, 1)};
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    rank_model r(kDp, 0, 1, 58);
    zero_adam z{.inner = kAdam, .bucket_bytes = 6 * 8};
    train::restore(src, r.records(), z);
    r.set_grads([&](std::size_t k, std::int64_t i) { return c.rank() == 0 ? rank_grad(0, k, i, 3) : 0.0; });
    z.step(c, mem, rank_model::spans(r.value), rank_model::spans(r.grad), true);
    for (std::size_t k = 0; k < kDp.size(); ++k) CHECK(close(r.value[k], m.value[k], 1e-6));
  });
}

// A layout to restore under: tp blocks, each over dp ranks, with replicated Adam or ZeRO-1 of buckets of
// `bucket` elements; `step`: one step with zero gradients and lr 0 after the restore (moments decay, t + 1).
struct layout {
  int tp = 1, dp = 1;
  bool zero = false;
  std::int64_t bucket = 1;
  bool step = false;
};
layout random_layout(rng& g) {
  return {static_cast<int>(g.uniform(1, 4)), static_cast<int>(g.uniform(1, 3)), g.uniform(0, 1) == 1,
          g.uniform(1, 50), g.uniform(0, 1) == 1};
}

// Every rank's capture after restoring `src` under `l`.
std::vector<snapshot> relayout(const train::memory_source<double>& src, const std::vector<full_tensor>& spec,
                               const layout& l) {
  std::vector<snapshot> out(static_cast<std::size_t>(l.tp * l.dp));
  const model::host_memory mem;
  for (int p = 0; p < l.tp; ++p)
    comm::loopback::run(l.dp, [&](comm::loopback::communicator& c) {
      rank_model m(spec, p, l.tp, 1234 + static_cast<std::uint64_t>(c.rank()));
      const train::adam<double> inner{.lr = 0.0};
      auto& s = out[static_cast<std::size_t>(p * l.dp + c.rank())];
      if (l.zero) {
        zero_adam z{.inner = inner, .bucket_bytes = l.bucket * 8};
        train::restore(src, m.records(), z);
        if (l.step) z.step(c, mem, rank_model::spans(m.value), rank_model::spans(m.grad), false);
        s = train::capture(m.records(), z);
      } else {
        train::adam<double> a = inner;
        train::restore(src, m.records(), a);
        if (l.step) a(rank_model::spans(m.value), rank_model::spans(m.grad));
        s = train::capture(m.records(), a);
      }
    });
  return out;
}

TEST_CASE("train::capture then train::restore under random layouts: exactly the full tensors back") {
  rng g(3535);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<full_tensor> spec;
    const auto n = g.uniform(1, 5);
    for (std::int64_t k = 0; k < n; ++k) {
      const auto cols = g.uniform(0, 1) == 1 ? std::int64_t{12} : std::int64_t{1};
      spec.push_back({k * 3 + g.uniform(0, 2), 12 * g.uniform(1, 2), cols,
                      static_cast<int>(g.uniform(-1, cols == 1 ? 0 : 1))});
    }
    // The truth: whole tensors, their moments (v >= 0) and one update count.
    const auto t = g.uniform(0, 9);
    snapshot truth;
    std::map<std::int64_t, std::vector<double>> value, m, v;
    for (const auto& ft : spec) {
      for (auto* f : {&value, &m, &v}) {
        auto& x = (*f)[ft.id];
        for (std::int64_t i = 0; i < ft.size(); ++i) x.push_back(g.unit() - (f == &v ? 0.0 : 0.5));
      }
      const train::piece_key key{ft.id, "", {}, ft.size(), 0, ft.size()};
      auto with = [&](const char* field) {
        auto k = key;
        k.field = field;
        return k;
      };
      truth.pieces.push_back({with("value"), value[ft.id]});
      truth.pieces.push_back({with("adam.m"), m[ft.id]});
      truth.pieces.push_back({with("adam.v"), v[ft.id]});
      truth.counters[train::adam_step_counter(ft.id)] = t;
    }
    const auto a = random_layout(g);
    auto b = random_layout(g);
    b.step = false;
    CAPTURE(trial);
    CAPTURE(a.tp);
    CAPTURE(a.dp);
    CAPTURE(a.zero);
    CAPTURE(a.bucket);
    CAPTURE(a.step);
    CAPTURE(b.tp);
    CAPTURE(b.dp);
    CAPTURE(b.zero);
    CAPTURE(b.bucket);
    // What layout a holds: the truth, stepped once (lr 0, zero gradients) when a.step.
    if (a.step)
      for (const auto& ft : spec) {
        train::adam<double> ref{.lr = 0.0};
        ref.state[value[ft.id].data()] = {m[ft.id], v[ft.id], t};
        std::vector<double> zero(value[ft.id].size(), 0.0);
        ref(std::vector<std::span<double>>{value[ft.id]}, std::vector<std::span<double>>{zero});
        m[ft.id] = ref.state[value[ft.id].data()].m;
        v[ft.id] = ref.state[value[ft.id].data()].v;
      }
    const auto want_t = a.step ? t + 1 : t;
    const auto snaps_a =
        relayout(train::memory_source<double>{std::span<const snapshot>(&truth, 1)}, spec, a);
    const train::memory_source<double> src_a{std::span<const snapshot>(snaps_a)};
    const auto snaps_b = relayout(src_a, spec, b);
    const train::memory_source<double> src_b{std::span<const snapshot>(snaps_b)};
    for (const auto* src : {&src_a, &src_b})
      for (const auto& ft : spec) {
        CHECK(whole(*src, ft, "value") == value[ft.id]);
        CHECK(whole(*src, ft, "adam.m") == m[ft.id]);
        CHECK(whole(*src, ft, "adam.v") == v[ft.id]);
        CHECK(src->counter(train::adam_step_counter(ft.id)) == want_t);
      }
  }
}

const std::vector<full_tensor> kSmall{{3, 6, 1, -1}, {7, 5, 1, -1}};

snapshot small_saved() {
  rank_model m(kSmall, 0, 1, 9);
  train::adam<double> a = kAdam;
  return adam_steps(m, a);
}

// The message of the data_error restoring `snap` into a model of `spec` gives, with a replicated Adam and
// with ZeRO-1; both optimizers and the model as they were before.
std::string refused(const snapshot& snap, const std::vector<full_tensor>& spec = kSmall) {
  const train::memory_source<double> src{std::span<const snapshot>(&snap, 1)};
  rank_model m(spec, 0, 1, 21);
  train::adam<double> a = kAdam;
  m.set_grads([](std::size_t k, std::int64_t i) { return value_of(77, static_cast<std::int64_t>(k), i); });
  a(rank_model::spans(m.value), rank_model::spans(m.grad));
  const auto values = m.value;
  const auto state = a.state;
  std::string msg, zero_msg;
  try {
    train::restore(src, m.records(), a);
  } catch (const data_error& e) {
    msg = e.what();
  }
  CHECK(m.value == values);
  CHECK(a.state.size() == state.size());
  for (const auto& [p, s] : state) {
    CHECK(a.state.at(p).m == s.m);
    CHECK(a.state.at(p).v == s.v);
    CHECK(a.state.at(p).t == s.t);
  }
  zero_adam z{.inner = kAdam};
  try {
    train::restore(src, m.records(), z);
  } catch (const data_error& e) {
    zero_msg = e.what();
  }
  CHECK(z.pending.empty());
  CHECK(m.value == values);
  CHECK(zero_msg == msg);
  return msg;
}

template <class F>
snapshot changed(F&& f) {
  auto s = small_saved();
  f(s);
  return s;
}
train::checkpoint_piece<double>& piece(snapshot& s, std::int64_t id, const std::string& field) {
  for (auto& p : s.pieces)
    if (p.key.tensor == id && p.key.field == field) return p;
  throw std::runtime_error("no such piece");
}

TEST_CASE("train::restore refuses a bad checkpoint naming the tensor and field, changing nothing") {
  {  // the fixture itself restores
    const auto good = small_saved();
    rank_model m(kSmall, 0, 1, 21);
    train::adam<double> a;
    train::restore(train::memory_source<double>{std::span<const snapshot>(&good, 1)}, m.records(), a);
    CHECK(m.value == std::vector<std::vector<double>>{good.pieces[0].data, good.pieces[1].data});
  }
  CHECK(refused(changed([](snapshot& s) {
          std::erase_if(s.pieces, [](const auto& p) { return p.key.tensor == 7; });
        })).find("tensor 7 field value: not in the checkpoint") != std::string::npos);
  CHECK(refused(changed([](snapshot& s) {
          std::erase_if(s.pieces, [](const auto& p) { return p.key.tensor == 7 && p.key.field == "adam.v"; });
        })).find("tensor 7 field adam.v: not in the checkpoint") != std::string::npos);
  const auto size = refused(small_saved(), {{3, 6, 1, -1}, {7, 6, 1, -1}});
  CHECK(size.find("tensor 7 field value") != std::string::npos);
  CHECK(size.find("a tensor of 6 elements asked; the checkpoint's has 5") != std::string::npos);
  CHECK(refused(changed([](snapshot& s) {
          s.counters.erase("adam.t/7");
        })).find("tensor 7 field adam.t (counter 'adam.t/7'): not in the checkpoint") != std::string::npos);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(refused(changed([&](snapshot& s) {
          piece(s, 7, "adam.m").data[2] = nan;
        })).find("tensor 7 field adam.m: element 2 of the full tensor is nan") != std::string::npos);
  CHECK(refused(changed([&](snapshot& s) {
          piece(s, 7, "value").data[4] = -std::numeric_limits<double>::infinity();
        })).find("tensor 7 field value: element 4") != std::string::npos);
  CHECK(refused(changed([](snapshot& s) { piece(s, 7, "adam.v").data[1] = -1e-30; }))
            .find("tensor 7 field adam.v: element 1 of the full tensor is -1e-30; expected a finite number "
                  ">= 0") != std::string::npos);
  for (const std::int64_t t : {std::int64_t{-1}, std::int64_t{1} << 60})
    CHECK(refused(changed([&](snapshot& s) { s.counters["adam.t/7"] = t; }))
              .find("tensor 7 field adam.t (counter 'adam.t/7') = " + std::to_string(t) +
                    "; expected in [0, ") != std::string::npos);
  CHECK(refused(changed([](snapshot& s) {
          auto& p = piece(s, 7, "value");
          p.key.count = 3;
          p.data.resize(3);
        })).find("tensor 7 field value: element 3 of the full tensor is in no saved piece") !=
        std::string::npos);
}

TEST_CASE("train::memory_source refuses ranks that disagree and pieces outside their block") {
  auto a = small_saved(), b = small_saved();
  piece(b, 3, "value").data[0] += 1;
  CHECK_THROWS_WITH_AS((train::memory_source<double>{std::vector<snapshot>{a, b}}),
                       doctest::Contains("tensor 3 field value: element 0 of the full tensor saved as"),
                       data_error);
  b = small_saved();
  b.counters["adam.t/3"] = 9;
  CHECK_THROWS_WITH_AS((train::memory_source<double>{std::vector<snapshot>{a, b}}),
                       doctest::Contains("counter 'adam.t/3' has two values"), data_error);
  b = small_saved();
  piece(b, 3, "value").key.begin = 1;
  CHECK_THROWS_WITH_AS((train::memory_source<double>{std::vector<snapshot>{b}}),
                       doctest::Contains("tensor 3 field value: a piece of 6 elements as [1, +6)"),
                       data_error);
  b = small_saved();
  piece(b, 3, "adam.m").key.full = 12;
  CHECK_THROWS_WITH_AS((train::memory_source<double>{std::vector<snapshot>{a, b}}),
                       doctest::Contains("tensor 3 field adam.m: pieces of a tensor of 6 and of 12 elements"),
                       data_error);
}

// A user's optimizer with its own checkpoint hooks.
struct counting_optimizer {
  using value_type = double;
  std::int64_t calls = 0;
  void save_state(std::span<const train::checkpoint_tensor<double>> ts, snapshot& s) const {
    s.counters["calls"] = calls + static_cast<std::int64_t>(ts.size()) * 1000;
  }
  template <class S>
  void load_state(std::span<const train::checkpoint_tensor<double>>, const S& src) {
    const auto c = src.counter("calls");
    if (!c) throw data_error("counting_optimizer: calls missing");
    calls = *c;
  }
};

TEST_CASE("train::capture and restore: sgd saves nothing, a user's optimizer its own state") {
  rank_model m(kSmall, 0, 1, 5);
  const auto plain = train::capture(m.records(), train::sgd<double>{});
  CHECK(plain.pieces.size() == 2);
  CHECK(plain.counters.empty());
  const auto user = train::capture(m.records(), counting_optimizer{.calls = 4});
  CHECK(user.counters.at("calls") == 2004);
  counting_optimizer o;
  train::restore(train::memory_source<double>{std::span<const snapshot>(&user, 1)}, m.records(), o);
  CHECK(o.calls == 2004);
  train::sgd<double> sgd;
  rank_model r(kSmall, 0, 1, 6);
  train::restore(train::memory_source<double>{std::span<const snapshot>(&plain, 1)}, r.records(), sgd);
  CHECK(r.value == m.value);
}

TEST_CASE("train::capture and restore in float: a tp block of a float Adam's state") {
  struct float_record {
    std::int64_t id;
    std::span<float> value;
    train::tensor_shard shard;
  };
  std::vector<float> w(12), g(12, 0.25F);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) - 3.5F;
  train::adam<float> a{.lr = 0.1F};
  a(std::vector<std::span<float>>{w}, std::vector<std::span<float>>{g});
  const auto snap = train::capture(std::vector<float_record>{{4, w, {}}}, a);
  std::vector<float> half(6, 0.0F);
  train::adam<float> b;
  const train::tensor_shard second{4, 3, 0, 1, 2};  // rows 2 and 3 of a 4x3 tensor
  train::restore(train::memory_source<float>{std::span<const train::rank_snapshot<float>>(&snap, 1)},
                 std::vector<float_record>{{4, half, second}}, b);
  CHECK(half == std::vector<float>(w.begin() + 6, w.end()));
  CHECK(b.state.at(half.data()).v ==
        std::vector<float>(a.state.at(w.data()).v.begin() + 6, a.state.at(w.data()).v.end()));
  CHECK(b.state.at(half.data()).t == 1);
}

TEST_CASE("train::zero1 and checkpoints: a group restored at two update counts, a tensor not given") {
  const model::host_memory mem;
  rank_model m(kSmall, 0, 1, 8);
  train::adam<double> a = kAdam;
  a(std::vector<std::span<double>>{m.value[0]}, std::vector<std::span<double>>{m.grad[0]});  // tensor 3 only
  const auto snap = train::capture(m.records(), a);
  CHECK(snap.counters.at("adam.t/3") == 1);
  CHECK(snap.counters.at("adam.t/7") == 0);
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    rank_model r(kSmall, 0, 1, 9);
    zero_adam z{.inner = kAdam};
    train::restore(train::memory_source<double>{std::span<const snapshot>(&snap, 1)}, r.records(), z);
    CHECK_THROWS_WITH_AS(z.step(c, mem, rank_model::spans(r.value), rank_model::spans(r.grad), false),
                         doctest::Contains("restored Adam steps 1 (tensor 0 of the group) and 0 (tensor 1)"),
                         data_error);
    CHECK(z.pending.size() == 2);
    zero_adam y{.inner = kAdam};
    y.step(c, mem, rank_model::spans(r.value), rank_model::spans(r.grad), false);
    auto records = r.records();
    records.pop_back();
    CHECK_THROWS_WITH_AS(
        (void)train::capture(records, y),
        doctest::Contains("steps a tensor of 5 elements that is not among the 1 tensors given"),
        invalid_argument);
  });
}

}  // namespace
