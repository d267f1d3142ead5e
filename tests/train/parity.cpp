// SPDX-License-Identifier: Apache-2.0
// train::check_parity: the library's parity check passes a correct distributed run, fails one whose
// gradient is wrong on one rank and names the tensor (a mutation test), and refuses models whose tensors do
// not match the reference's; and the parity_model concept it reads models through.
#include <doctest/doctest.h>

#include <atomic>
#include <string>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/train_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

/// tiny_lm whose backward scales its contribution to the output projection's gradient (tensor 5) by
/// `scale`: a bug in one rank's backward that a loss curve would not show.
template <class T>
struct skewed_lm : tiny_lm<T> {
  using tiny_lm<T>::tiny_lm;
  T scale = T(1);
  template <train::attention_context<T> Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> g, std::span<T> gi) {
    const auto before = this->gwout;
    tiny_lm<T>::backward(ctx, mb, g, gi);
    for (std::size_t i = 0; i < before.size(); ++i)
      this->gwout[i] = before[i] + scale * (this->gwout[i] - before[i]);
  }
};

/// tiny_lm whose tensors() names its tensors from `first_id`: a factory that numbers tensors differently
/// on some rank.
template <class T>
struct renumbered_lm : tiny_lm<T> {
  using tiny_lm<T>::tiny_lm;
  std::int64_t first_id = 0;
  [[nodiscard]] std::vector<train::model_tensor<T>> tensors() {
    auto out = tiny_lm<T>::tensors();
    for (auto& t : out) t.id += first_id;
    return out;
  }
};

/// A model of a backbone and one encoder, through backbone() and encoders().
struct two_part_model {
  tiny_lm<double> lm{kShape, 3};
  model::scale_encoder<double, model::vision_modality> vision{kShape.width, 0.9};
  tiny_lm<double>& backbone() { return lm; }
  std::tuple<model::scale_encoder<double, model::vision_modality>&> encoders() { return std::tie(vision); }
  std::vector<train::model_tensor<double>> tensors() { return lm.tensors(); }
};

static_assert(train::parity_model<tiny_lm<double>>);
static_assert(train::check_parity_model<tiny_lm<float>>());
static_assert(train::parity_model<two_part_model>);
static_assert(!train::parity_model<model::scale_stage<double>>);  // no tensors(): no ids to compare by
static_assert(train::tensor_record<train::model_tensor<float>>);

using sys_t = train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator>;

}  // namespace

TEST_CASE(
    "train::check_parity: a correct run passes; a gradient scaled on one rank fails, naming the tensor") {
  const auto batch = random_batch(5, 8, 40);
  for (double scale : {1.0, 1.5}) {
    const auto r = testsupport::rank0_of(4, [&](comm::loopback::communicator& c) {
      sys_t sys({.cp = 2, .pad = true}, c);
      return train::check_parity(sys, batch, [&](int, std::span<const int>) {
        skewed_lm<double> m(kShape, 7);
        if (c.rank() == 3) m.scale = scale;  // the reference runs on rank 0: only the distributed run errs
        return m;
      });
    });
    const std::string text = fmt::format("{}", r);
    MESSAGE(text);
    CHECK(r.tensors == 6);
    CHECK(r.optimizer_calls == 1);
    CHECK(r.targets == r.reference_targets);
    CHECK(r.tokens == r.reference_tokens);
    CHECK(r.loss_rel_error <= 1e-12);  // the forward is right: only the gradient errs
    CHECK(r.tolerance == train::parity_tolerance{});
    if (scale == 1.0) {
      CHECK(r.passed);
      CHECK(r.rel_error <= 1e-12);
      CHECK(text.find("parity ok") != std::string::npos);
    } else {
      CHECK(!r.passed);
      CHECK(!static_cast<bool>(r));
      CHECK(r.rel_error > 1e-3);
      CHECK(r.tensor == 5);  // the output projection
      CHECK(r.rank == 0);    // reduced over the pool: every rank holds the wrong sum, rank 0 first
      CHECK(r.element >= 0);
      CHECK(text.find("parity FAILED") != std::string::npos);
      CHECK(text.find("at tensor 5 element") != std::string::npos);
    }
  }
}

TEST_CASE("train::check_parity: the loss tolerance and encoders through backbone() and encoders()") {
  const auto batch = random_batch(6, 6, 30);
  const auto r = testsupport::rank0_of(2, [&](comm::loopback::communicator& c) {
    sys_t sys({.cp = 2, .pad = true}, c);
    return train::check_parity(
        sys, batch, [](int, std::span<const int>) { return two_part_model{}; }, {.gradient = 0, .loss = 0},
        [](const model::encoder_batch_view&, std::span<double>) {});
  });
  // Tolerances of zero: passed only if bitwise equal, and the verdict reports against what was passed.
  CHECK(r.tolerance == train::parity_tolerance{0, 0});
  CHECK(r.passed == (r.abs_error == 0 && r.loss_error == 0));
  CHECK(r.optimizer_calls == 2);  // the backbone and the encoder
  CHECK(r.rel_error <= 1e-12);
}

TEST_CASE("train::check_parity: tensors named differently on one rank are refused on every rank") {
  const auto batch = random_batch(7, 6, 30);
  std::atomic<int> refused{0}, named{0};
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    sys_t sys({.cp = 2, .pad = true}, c);
    try {
      (void)train::check_parity(sys, batch, [&](int, std::span<const int>) {
        renumbered_lm<double> m(kShape, 7);
        if (c.rank() == 2) m.first_id = 100;
        return m;
      });
    } catch (const invalid_argument& e) {
      ++refused;
      if (std::string(e.what()).find("tensor 100 of this rank's model") != std::string::npos) ++named;
    }
  });
  CHECK(refused == 4);
  CHECK(named == 1);  // rank 2 names it; the others say rank 2 failed
}
