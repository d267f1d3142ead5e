// SPDX-License-Identifier: Apache-2.0
// The pipelined, multimodal parity grid of train::system on 8 ranks (any communicator): partition x
// schedule x encoder placement x balancer, each against a single-rank run of the same batch.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include <hetmesh/pipeline/dualpipe.hpp>

#include "train/pipeline_body.hpp"

namespace traintest {

inline void check_mm(const mm_verdict& v, double tol, const std::string& what) {
  const std::string msg = what + ": " + v.describe();
  MESSAGE(msg);
  CHECK(v.rel <= tol);
  CHECK(v.loss_rel <= tol);
  CHECK(v.targets == v.expected_targets);
  CHECK(v.tokens == v.expected_tokens);
  CHECK(v.encoder_items > 0);  // the batch's encoders ran
}

template <class On8>
void pipeline_cases(On8 on8) {
  using namespace hetmesh;
  const auto fam = train::family_placement{};
  const auto first = pipeline::encoder_on_first_stage{};
  const auto joint = pipeline::colocated_encoder{};
  for (std::uint64_t seed : {11u, 12u}) {
    // static CP zigzag, pp = 2 (pool 4, cp 2), 1F1B, encoders on the first stage
    check_mm(
        on8([&](auto& w) {
          return mm_parity_body<double>(
              w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
              train::pipeline_config<pipeline::one_f_one_b, pipeline::encoder_on_first_stage>{2, {}, first},
              seed, 10, 30);
        }),
        1e-10, "zigzag cp2 pp2 1f1b first-stage");
    // HDP rings placed by ByteScale's balancer, pp = 2, 1F1B, the joint encoder-LLM pipeline
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, test_hdp(), balance::bytescale{},
                   train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, joint},
                   seed, 12, 50);
             }),
             1e-10, "hdp bytescale pp2 1f1b joint");
    // static CP zigzag over 4, pp = 2, zero-bubble (split backward), joint pipeline
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, seq::cp_zigzag{.cp = 4, .pad = true}, fam,
                   train::pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{2, {}, joint},
                   seed, 10, 30);
             }),
             1e-10, "zigzag cp4 pp2 zero-bubble joint");
    // HDP (the family's own placement), pp = 2, interleaved 1F1B with 2 virtual stages, first stage
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, test_hdp(), fam,
                   train::pipeline_config<pipeline::interleaved_1f1b, pipeline::encoder_on_first_stage>{
                       2, {}, first},
                   seed, 12, 50);
             }),
             1e-10, "hdp pp2 interleaved-1f1b first-stage");
    // static CP zigzag over 2, pp = 4, GPipe, joint pipeline
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
                   train::pipeline_config<pipeline::gpipe, pipeline::colocated_encoder>{4, {}, joint}, seed,
                   8, 30);
             }),
             1e-10, "zigzag cp2 pp4 gpipe joint");
    // HDP placed by the gap-filling balancer, pp = 2, ZBV (V layout, split backward), first stage
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, test_hdp(), balance::gap_filling_hdp{},
                   train::pipeline_config<pipeline::zbv, pipeline::encoder_on_first_stage>{2, {}, first},
                   seed, 12, 50);
             }),
             1e-10, "hdp gap-filling pp2 zbv first-stage");
    // Ulysses over 2 (heads swapped by all-to-all), pp = 2, interleaved 1F1B, joint pipeline
    check_mm(
        on8([&](auto& w) {
          return mm_parity_body<double>(
              w, seq::ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4}, fam,
              train::pipeline_config<pipeline::interleaved_1f1b, pipeline::colocated_encoder>{2, {}, joint},
              seed, 10, 30);
        }),
        1e-10, "ulysses 2 pp2 interleaved-1f1b joint");
    // HDP placed by ByteScale's balancer over a pool of 2, pp = 2, 1F1B, a separate encoder pool of 2
    // ranks per pipeline (world = (2 + 2) x 2)
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, test_hdp(), balance::bytescale{},
                   train::pipeline_config<pipeline::one_f_one_b, pipeline::encoder_pool>{
                       2, {}, pipeline::encoder_pool{.ranks = 2}},
                   seed, 10, 30);
             }),
             1e-10, "hdp bytescale pp2 1f1b encoder-pool(2)");
    // HDP, pp = 2, PyTorch's looped BFS (2 stages per rank, backwards in reverse order), joint pipeline
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, test_hdp(), fam,
                   train::pipeline_config<pipeline::looped_bfs, pipeline::colocated_encoder>{2, {}, joint},
                   seed, 12, 50);
             }),
             1e-10, "hdp pp2 looped-bfs joint");
    // float: THD over 2, pp = 2, 1F1B, joint pipeline
    check_mm(on8([&](auto& w) {
               return mm_parity_body<float>(
                   w, seq::cp_thd{.cp = 2, .pad = true}, fam,
                   train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, joint},
                   seed, 10, 30);
             }),
             1e-5, "thd cp2 pp2 1f1b joint float");
    // static CP zigzag over 2, pp = 2, DualPipeV (V layout, overlapped F+B, split backward), joint
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double>(
                   w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
                   train::pipeline_config<pipeline::dualpipev, pipeline::colocated_encoder>{2, {}, joint},
                   seed, 10, 30);
             }),
             1e-10, "zigzag cp2 pp2 dualpipev joint");
    // float: HDP, pp = 2, DualPipeV, encoders on the first stage
    check_mm(
        on8([&](auto& w) {
          return mm_parity_body<float>(
              w, test_hdp(), fam,
              train::pipeline_config<pipeline::dualpipev, pipeline::encoder_on_first_stage>{2, {}, first},
              seed, 12, 50);
        }),
        1e-5, "hdp pp2 dualpipev first-stage float");
  }
}

/// Long-short SP with an encoder that attends inside items (attention_encoder): items above
/// `max_tokens` tokens run as pieces over a Ulysses group of one shard's pool row, and the gradients still
/// equal the single-rank run's, in which every item is whole. Joint pipeline (shards on both pipeline ranks),
/// encoders on the first stage, a separate encoder pool; double and float.
template <class On8>
void long_short_cases(On8 on8) {
  using namespace hetmesh;
  const auto fam = train::family_placement{};
  auto split = [](std::int64_t max_tokens) {
    train::system_options o;
    o.encoder_sp.max_tokens_per_rank = max_tokens;
    o.encoder_sp.heads = attention_encoder<double, model::vision_modality>::kHeads;
    return o;
  };
  for (std::uint64_t seed : {31u, 32u}) {
    // zigzag cp 2, pp = 2 (pool 4): items of up to 10 tokens over groups of up to 4 of 3 tokens each
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double, attention_encoder>(
                   w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
                   train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, {}},
                   seed, 10, 30, split(3));
             }),
             1e-10, "long-short attention encoders, zigzag cp2 pp2 1f1b joint");
    // HDP, pp = 2, zero-bubble, encoders on stage 0's ranks (one shard: the domain is stage 0's pool of 4)
    check_mm(on8([&](auto& w) {
               return mm_parity_body<double, attention_encoder>(
                   w, test_hdp(), fam,
                   train::pipeline_config<pipeline::zero_bubble, pipeline::encoder_on_first_stage>{2, {}, {}},
                   seed, 12, 30, split(6));
             }),
             1e-10, "long-short attention encoders, hdp pp2 zero-bubble first-stage");
    // HDP, pp = 2 plus a pool of 2 encoder ranks per pipeline (pool 2: groups of 2 of 5 tokens), float
    check_mm(on8([&](auto& w) {
               return mm_parity_body<float, attention_encoder>(
                   w, test_hdp(), fam,
                   train::pipeline_config<pipeline::gpipe, pipeline::encoder_pool>{2, {}, {.ranks = 2}}, seed,
                   8, 30, split(5));
             }),
             1e-5, "long-short attention encoders, hdp pp2 gpipe encoder-pool(2) float");
  }
}

}  // namespace traintest
