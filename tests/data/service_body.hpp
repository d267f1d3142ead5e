// SPDX-License-Identifier: Apache-2.0
// The data service body, one per rank, for any communicator: loopback threads in test_data and
// mpirun processes in test_data_mpi. Hosts write their own copy of the corpus (its bytes are pure
// functions of (seed, source, index)), load only their share and serve it; trainers plan the step
// independently from the generator's lengths (no file opened) and check what they receive, byte for
// byte, against micro-batches built from the generator's tokens. Returns a failure description, empty
// when every check held on this rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hetmesh/data/service_layout.hpp>
#include <hetmesh/run/data_service.hpp>

#include "data/fixtures.hpp"

namespace hetmesh::data::test {

struct service_corpus {
  static constexpr std::uint64_t seed = 11;
  static constexpr std::int64_t size[3] = {40, 30, 25};
  static constexpr std::int64_t lo[3] = {1, 30, 100}, hi[3] = {60, 200, 400};

  static mixture_config config(const trainer_mesh& layout, const std::string& dir) {
    mixture_config cfg{.seed = 5,
                       .global_batch = 24,
                       .cost = {.text = {.a = 1, .b = 1}},
                       .layout = layout,
                       .micro_batches = 2};
    const double w[3] = {0.5, 0.3, 0.2};
    for (int s = 0; s < 3; ++s)
      cfg.sources.push_back({.name = fmt::format("src{}", s),
                             .paths = {dir + fmt::format("/svc{}", s)},
                             .weight = {{0, w[s]}}});
    return cfg;
  }
  static void write(const temp_dir& dir) {
    for (int s = 0; s < 3; ++s)
      make_indexed(dir / fmt::format("svc{}", s), seed, s, size[s], lo[s], hi[s], dtype::int32);
  }
};

/// Metadata straight from the generator and the documented permutation: what a trainer would know
/// without opening a file.
struct generator_metadata {
  const mixture_config* cfg;
  std::int64_t source_size(int s) const { return service_corpus::size[s]; }
  std::pair<std::int64_t, seq::sample_meta> lookup(int s, std::int64_t e, std::int64_t p) const {
    const auto perm = permutation(service_corpus::size[s], epoch_seed(cfg->seed, s, e));
    const auto index = perm[static_cast<std::size_t>(p)];
    const auto len =
        sample_length(service_corpus::seed, s, index, service_corpus::lo[s], service_corpus::hi[s]);
    return {index, {.tokens = len, .item_tokens = {}, .bytes = 4 * len}};
  }
};

template <class C>
std::string trainer_side(C& world, const trainer_mesh& layout, int steps);

/// The loaded samples of a plan, from the generator (what a correct data plane must have read).
inline std::vector<sample> generator_samples(const batch_plan& plan) {
  std::vector<sample> out(plan.samples.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& ref = plan.samples[i].ref;
    out[i].ref = ref;
    out[i].tokens = expected_tokens(service_corpus::seed, ref.source, ref.index,
                                    service_corpus::lo[ref.source], service_corpus::hi[ref.source]);
  }
  return out;
}

/// Runs `steps` steps of the service on this rank. `layout` is the trainers' layout; the world holds
/// layout.world() trainers followed by the hosts.
template <class C>
std::string service_body(C& world, const trainer_mesh& layout, int steps) {
  const auto sl = service_layout_of(layout, world.size());
  const int me = world.rank();
  std::string failure;
  std::int64_t reads = 0;  // samples read on this rank
  if (sl.is_host(me)) {
    temp_dir dir;
    service_corpus::write(dir);
    const auto cfg = service_corpus::config(layout, dir.path);
    const auto mine = served_by(sl, layout, me);
    // Reads happen inside next() only (no workers, no read-ahead), so the count below is exact.
    data_loader dl(cfg, {.workers = 0, .prefetch_steps = 0, .serve_dp = mine});
    std::int64_t share = 0;
    for (int step = 0; step < steps; ++step) {
      const auto b = dl.next();
      for (const auto& p : b.plan.samples)
        share += std::find(mine.begin(), mine.end(), p.dp_rank) != mine.end() ? 1 : 0;
      run::serve_step(world, cfg, b);
    }
    for (int s = 0; s < 3; ++s) reads += dl.reads(s);
    if (reads != share)
      failure = fmt::format("host {} read {} samples; expected exactly its share {}", me, reads, share);
  } else {
    failure = trainer_side(world, layout, steps);
  }
  // Over all hosts, every sample of every step read exactly once.
  comm::all_reduce(world, std::span<std::int64_t>(&reads, 1), comm::reduce_op::sum);
  if (failure.empty() && reads != steps * 24)
    failure =
        fmt::format("rank {}: the hosts read {} samples in all; expected {} steps x 24", me, reads, steps);
  return failure;
}

/// A trainer's side of service_body.
template <class C>
std::string trainer_side(C& world, const trainer_mesh& layout, int steps) {
  const int me = world.rank();
  const auto cfg = service_corpus::config(layout, "/nonexistent");  // trainers open no file
  generator_metadata meta{&cfg};
  auto st = initial_state(cfg);
  const int dp = layout.dp_of(me);
  for (int step = 0; step < steps; ++step) {
    auto planned = plan_step(cfg, st, meta);
    st = planned.next;
    const auto samples = generator_samples(planned.plan);
    const auto got = run::receive_step(world, cfg, step);
    const auto expected = construct(planned.plan, samples, dp, cfg.micro_batches);
    if (got != expected)
      return fmt::format(
          "trainer {} (dp {}, mesh {}) step {}: received {} micro-batches that differ from the "
          "{} built from the generator",
          me, dp, layout, step, got.size(), expected.size());
    if (expected.empty())
      return fmt::format("trainer {} step {}: no micro-batches; expected its share", me, step);
  }
  return {};
}

}  // namespace hetmesh::data::test
